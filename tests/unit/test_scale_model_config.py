"""Scale-model configuration: shipped layouts, replay fields, [emulation] and the dilated
scenario the host runs. No torch, no network."""

from __future__ import annotations

import pytest
from pydantic import ValidationError

from netsim_ddp.scenario.dilation import dilated
from netsim_ddp.scenario.layouts import generic_layout, layout_names, named_layout
from netsim_ddp.scenario.spec import Scenario, ScenarioError
from netsim_ddp.scenario.workload import WorkloadConfig

# The published parameter counts of the reference models (torchvision's model docs, the BERT
# and GPT-2 papers' tables): the generated layouts must hold exactly these.
PUBLISHED = {"resnet50": 25_557_032, "resnet101": 44_549_160, "vgg16": 138_357_544,
             "inception_v3": 27_161_264, "bert-base": 109_482_240, "bert-large": 335_141_888,
             "gpt2": 124_439_808}


def test_every_reference_layout_is_shipped() -> None:
    assert set(PUBLISHED) <= set(layout_names())


@pytest.mark.parametrize(("name", "params"), sorted(PUBLISHED.items()))
def test_layout_counts_match_the_published_models(name: str, params: int) -> None:
    layout = named_layout(name)
    assert layout.params == params
    assert abs(sum(layout.shares) - 1) < 1e-9
    assert len(layout.layers) > 10 or name == "vgg16"  # VGG-16: 13 conv + 3 linear
    if name == "vgg16":
        assert len(layout.layers) == 16


def test_resnet50_layout_is_the_real_one() -> None:
    layout = named_layout("resnet50")
    assert layout.layers[0].name == "conv1" and layout.layers[0].shapes == ((64, 3, 7, 7),)
    assert layout.layers[-1].name == "fc" and layout.layers[-1].shapes == ((1000, 2048), (1000,))


def test_unknown_layout_names_the_shipped_ones() -> None:
    with pytest.raises(ValidationError, match="resnet50"):
        WorkloadConfig(layout="resnet5", compute="100ms")


def test_generic_layout() -> None:
    layout = generic_layout(138_000_001, layers=24)
    assert layout.params == 138_000_001 and len(layout.layers) == 24
    with pytest.raises(ValueError, match="at least"):
        generic_layout(10)


def test_layout_sets_params() -> None:
    config = WorkloadConfig(layout="vgg16", compute="100ms")
    assert config.params == PUBLISHED["vgg16"]
    assert config.replayed and config.compute_source == "replay"
    with pytest.raises(ValidationError, match="not both"):
        WorkloadConfig(layout="vgg16", params="10M", compute="100ms")


def test_replay_compute_per_mode() -> None:
    config = WorkloadConfig(layout="resnet50", compute="234ms", amp_ratio=0.5)
    assert config.replay_compute_s("fp32") == pytest.approx(0.234)
    assert config.replay_compute_s("amp-fp16") == pytest.approx(0.117)
    explicit = WorkloadConfig(layout="resnet50", compute="234ms", compute_amp="100ms")
    assert explicit.replay_compute_s("amp") == pytest.approx(0.1)
    assert WorkloadConfig(params="1M").replay_compute_s("fp32") is None


@pytest.mark.parametrize("field", [{"layout": "generic"}, {"amp_ratio": 0.5},
                                   {"optimizer": "5ms"}, {"noise": {"spread": 0.1}}])
def test_replay_fields_without_replay_are_refused(field: dict) -> None:
    data = {"params": "1M", **field}
    with pytest.raises(ValidationError, match="only used by compute replay"):
        WorkloadConfig(**data)


def test_amp_time_given_twice_is_refused() -> None:
    with pytest.raises(ValidationError, match="not both"):
        WorkloadConfig(layout="vgg16", compute="1s", compute_amp="0.5s", amp_ratio=0.5)


def test_noise_is_validated() -> None:
    with pytest.raises(ValidationError, match="spread"):
        WorkloadConfig(layout="vgg16", compute="1s", noise={"spread": -0.1})
    with pytest.raises(ValidationError, match="distribution"):
        WorkloadConfig(layout="vgg16", compute="1s", noise={"distribution": "cauchy"})


def scenario(**emulation) -> Scenario:
    return Scenario.from_dict({
        "name": "scale", "topology": {"nodes": 4, "ranks_per_node": 4},
        "link": {"rate": "10gbit", "delay": "50us", "jitter": "10us",
                 "override": [{"node": 1, "rate": "5gbit"}],
                 "schedule": [{"at": "1s", "rate": "2gbit"}, {"at": "2s", "down": "100ms"}]},
        "background": [{"source": 0, "destination": 1, "on": "200ms", "off": "300ms",
                        "start": "10ms", "rate": "1gbit"}],
        "emulation": emulation,
        "workload": {"layout": "resnet50", "compute": "234ms"}}, "scale.toml")


def test_dilation_scales_every_clock_of_the_world() -> None:
    target = scenario(dilation=40)
    host = dilated(target, 40)
    assert host.link.rate == pytest.approx(10e9 / 40)
    assert host.link.delay == pytest.approx(50e-6 * 40)
    assert host.link.jitter == pytest.approx(10e-6 * 40)
    assert host.link_for(1).rate == pytest.approx(5e9 / 40)
    first, flap = host.link.schedule
    assert (first.at, first.rate) == (pytest.approx(40.0), pytest.approx(2e9 / 40))
    assert (flap.at, flap.down) == (pytest.approx(80.0), pytest.approx(4.0))
    flow = host.background[0]
    assert (flow.on, flow.off, flow.start) == (pytest.approx(8.0), pytest.approx(12.0),
                                               pytest.approx(0.4))
    assert flow.rate == pytest.approx(1e9 / 40)
    # Bytes do not dilate: queues and the workload are the target's.
    assert host.link_for(0).queue_limit_bytes == target.link_for(0).queue_limit_bytes
    assert host.workload == target.workload
    assert host.emulation.dilation == 1.0  # the host's scenario is not dilated again


def test_dilation_beyond_a_limit_names_it() -> None:
    with pytest.raises(ScenarioError) as excinfo:
        dilated(Scenario.from_dict({"name": "d", "topology": {"nodes": 2},
                                    "link": {"rate": "1gbit", "delay": "100ms"}}), 200)
    assert "emulation.dilation" in excinfo.value.field and "delay" in excinfo.value.field


@pytest.mark.parametrize("value", [0.5, 0, 5000, "fast"])
def test_bad_dilation_is_refused(value: object) -> None:
    with pytest.raises(ScenarioError) as excinfo:
        scenario(dilation=value)
    assert excinfo.value.field.startswith("emulation.dilation")


def test_auto_dilation() -> None:
    assert scenario(dilation="auto").emulation.auto
    assert not scenario(dilation=2).emulation.auto
