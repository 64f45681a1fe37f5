"""Compute replay: the schedule, the never-early releases, the noise, the zero-page parameters
and DDP's buckets on a replayed model (one process, a gloo group of one)."""

from __future__ import annotations

import os
import time

import pytest
import torch
import torch.distributed as dist
from torch.nn.parallel import DistributedDataParallel

from netsim_ddp.precision.modes import get_mode
from netsim_ddp.scenario.compute_noise import ComputeNoise
from netsim_ddp.scenario.layouts import named_layout
from netsim_ddp.scenario.workload import WorkloadConfig
from netsim_ddp.workload.contract.compute_profile import ComputeProfile, LayerTime
from netsim_ddp.workload.contract.noise_draws import NoiseModel
from netsim_ddp.workload.ranks.replay import (
    ReplayClock,
    ReplayModel,
    ReplayTrainer,
    build_replay,
    model_layout,
    noise_factor,
    replay_layout,
    replay_schedule,
)


def test_schedule_splits_compute_by_share_and_releases_last_layer_first() -> None:
    config = WorkloadConfig(layout="generic", params=4000, compute="90ms",
                            forward_fraction=1 / 3)
    layout = replay_layout(config)
    schedule = replay_schedule(config, get_mode("fp32"), layout)
    assert schedule.compute_s == pytest.approx(0.09)
    assert schedule.forward_s == pytest.approx(0.03)
    offsets = schedule.release_offsets()
    assert offsets == sorted(offsets, reverse=True)  # the last layer is released first
    assert offsets[0] == pytest.approx(0.09) and offsets[-1] > schedule.forward_s


def test_amp_modes_take_the_amp_time() -> None:
    config = WorkloadConfig(layout="resnet50", compute="200ms", amp_ratio=0.5)
    layout = named_layout("resnet50")
    assert replay_schedule(config, get_mode("amp-fp16"), layout).compute_s == \
        pytest.approx(0.1)
    assert replay_schedule(config, get_mode("fp32"), layout).compute_s == pytest.approx(0.2)


def test_profile_sets_the_per_layer_split() -> None:
    config = WorkloadConfig(layout="generic", params=2400, compute="100ms", forward_fraction=0)
    layout = replay_layout(config)
    times = [0.0] * (len(layout.layers) - 1) + [1.0]  # all backward in the last layer
    profile = ComputeProfile(device="cpu", timer="perf_counter", model="m", params=2400,
                             batch_size=1, mode="fp32", forward_s=[0.01], backward_s=[0.02],
                             optimizer_s=[0.0],
                             layers=[LayerTime(name=layer.name, backward_s=t)
                                     for layer, t in zip(layout.layers, times, strict=True)])
    schedule = replay_schedule(config, get_mode("fp32"), layout, profile)
    assert schedule.backward_s[-1] == pytest.approx(schedule.compute_s - schedule.forward_s)
    assert schedule.forward_s == pytest.approx(100e-3 / 3)  # the profile's forward share
    wrong = profile.model_copy(update={"layers": profile.layers[:-1]})
    with pytest.raises(ValueError, match="does not match the layout"):
        replay_schedule(config, get_mode("fp32"), layout, wrong)


def test_noise_is_seeded_per_rank_and_iteration() -> None:
    noise = ComputeNoise(distribution="lognormal", spread=0.1, seed=3)
    draws = [noise_factor(noise, 0, i) for i in range(2000)]
    assert draws[:5] == [noise_factor(noise, 0, i) for i in range(5)]  # reproducible
    assert draws[:5] != [noise_factor(noise, 1, i) for i in range(5)]  # per rank
    mean = sum(draws) / len(draws)
    cv = (sum((d - mean) ** 2 for d in draws) / len(draws)) ** 0.5 / mean
    assert mean == pytest.approx(1.0, abs=0.01) and cv == pytest.approx(0.1, abs=0.01)
    normal = ComputeNoise(distribution="normal", spread=0.5, seed=0)
    assert min(noise_factor(normal, 0, i) for i in range(2000)) >= 0.05
    assert noise_factor(None, 0, 0) == noise_factor(ComputeNoise(spread=0), 5, 9) == 1.0


def test_model_layout_of_a_meta_model() -> None:
    config = WorkloadConfig(model="mlp", params="1M", compute="10ms")
    layout = replay_layout(config)
    assert layout.params == pytest.approx(1_000_000, rel=0.02)
    assert [len(layer.shapes) for layer in layout.layers] == [2] * 5  # weight + bias each
    tied = torch.nn.Sequential(torch.nn.Embedding(10, 4), torch.nn.Linear(4, 10, bias=False))
    tied[1].weight = tied[0].weight
    assert model_layout(tied, "tied").params == 40


def _rss_bytes() -> int:
    with open("/proc/self/statm") as statm:
        return int(statm.read().split()[1]) * os.sysconf("SC_PAGE_SIZE")


def test_parameters_take_no_memory() -> None:
    """VGG-16's 553 MB of parameters, read in full, add (almost) nothing to the resident set:
    they are views of a mapping nothing writes."""
    config = WorkloadConfig(layout="vgg16", compute="10ms")
    before = _rss_bytes()
    model, _ = build_replay(config, get_mode("fp32"), 1.0, 0)
    total = sum(float(p.detach().sum()) for p in model.parameters())
    grown = _rss_bytes() - before
    assert total == 0.0
    assert sum(p.numel() for p in model.parameters()) == 138_357_544
    assert grown < 50 * 2**20, f"parameters took {grown / 2**20:.0f} MiB"


@pytest.fixture
def group_of_one(tmp_path):
    dist.init_process_group("gloo", init_method=f"file://{tmp_path / 'rdv'}", rank=0,
                            world_size=1)
    yield
    dist.destroy_process_group()


def test_backward_never_releases_early_and_fills_real_buckets(group_of_one) -> None:
    """Each layer's gradient reaches its parameters no earlier than the schedule says, every
    layer in reverse order; DDP hands the layout's real buckets to the backend, the first while
    later layers still "compute" (the overlap is the target's); and a release the host makes
    late is measured, never hidden."""
    config = WorkloadConfig(layout="generic", params=240_000, compute="100ms",
                            bucket_size="200KiB")  # 24 layers of 10,000 parameters
    mode = get_mode("fp32")
    k = 2.0
    model, clock = build_replay(config, mode, k, 0)
    layers = len(model.layers)
    assert layers == 24
    ddp = DistributedDataParallel(model, bucket_cap_mb=config.bucket_size / 2**20,
                                  gradient_as_bucket_view=True, init_sync=False)
    ready: dict[int, float] = {}
    handed: list[tuple[int, int, float]] = []  # (bucket index, bytes, when) per hand-off
    delay_s: dict[int, float] = {}  # layer -> how long its gradient hook holds the host

    def mark(index: int) -> None:
        ready.setdefault(index, time.perf_counter())
        if index in delay_s:
            time.sleep(delay_s[index])

    def counting_hook(state, bucket):
        buffer = bucket.buffer()
        handed.append((bucket.index(), buffer.numel() * buffer.element_size(),
                       time.perf_counter()))
        return dist.all_reduce(buffer, async_op=True).get_future().then(
            lambda fut: fut.value()[0])

    for index, holder in enumerate(model.layers):
        for param in holder.params:
            param.register_post_accumulate_grad_hook(lambda _p, index=index: mark(index))
    ddp.register_comm_hook(None, counting_hook)
    trainer = ReplayTrainer(ddp, mode, clock)
    offsets = clock.schedule.release_offsets()

    def step(iteration: int) -> float:
        ready.clear()
        handed.clear()
        trainer.begin_iteration(iteration)
        started = time.perf_counter()
        trainer.step([(torch.zeros(1), torch.zeros(1))], sync=True)
        return started

    step(0)  # DDP rebuilds its buckets after the first step
    started = step(1)
    assert sorted(ready) == list(range(layers))  # every layer released
    for index, at in ready.items():
        assert at - started >= offsets[index] * k - 1e-3  # never early
    assert sorted(ready, key=ready.__getitem__) == list(reversed(range(layers)))
    # 200 KiB buckets of 40 KB layers: 4 of 6 layers, 960,000 bytes in all, each handed off
    # once, last layers first; the first before the backward's last release is due
    assert [(index, size) for index, size, _ in handed] == [(b, 240_000) for b in range(4)]
    assert handed[0][2] - started < offsets[0] * k
    assert trainer.scheduled_compute_s(1) == pytest.approx(0.1 * k)
    # the host held up on purpose: the last layer's hook (released first) sleeps 30 ms past
    # the next layer's deadline, so that release is at least 30 ms late
    delay_s[layers - 1] = (offsets[layers - 2] - offsets[layers - 1]) * k + 0.03
    step(2)
    assert trainer.late_s() >= 0.03 - 1e-3


def test_replay_clock_records_lateness() -> None:
    config = WorkloadConfig(layout="generic", params=2400, compute="10ms")
    schedule = replay_schedule(config, get_mode("fp32"), replay_layout(config))
    clock = ReplayClock(schedule, 1.0, NoiseModel(None), 0)
    clock.begin_iteration(0)
    clock.start_pass()
    time.sleep(0.03)  # the host was busy past every deadline
    clock.release(0)
    assert clock.late_s >= 0.02
    model = ReplayModel(replay_layout(config), clock)
    assert sum(p.numel() for p in model.parameters()) == 2400


def test_profile_compute_feeds_the_replay(tmp_path) -> None:
    """The profile command's layers are the replay layout's (same names, same order), every
    layer of an MLP gets some backward time, and the replay splits compute by it."""
    from click.testing import CliRunner

    from netsim_ddp.cli import main
    from netsim_ddp.workload.contract.compute_profile import read_profile

    scenario = tmp_path / "s.toml"
    scenario.write_text('name = "s"\n[topology]\nnodes = 2\n[link]\nrate = "1gbit"\n'
                        '[workload]\nmodel = "mlp"\nparams = "200k"\nbatch_size = 64\n')
    out = tmp_path / "profile.json"
    result = CliRunner().invoke(main, ["profile-compute", str(scenario), "--out", str(out),
                                       "--steps", "3", "--warmup", "1"])
    assert result.exit_code == 0, result.output
    profile = read_profile(out)
    assert len(profile.forward_s) == len(profile.backward_s) == 3
    assert profile.timer == "perf_counter" and profile.device == "cpu"
    config = WorkloadConfig(model="mlp", params="200k", profile=str(out))
    layout = replay_layout(config)
    assert [layer.name for layer in profile.layers] == [layer.name for layer in layout.layers]
    assert all(layer.backward_s > 0 for layer in profile.layers)
    schedule = replay_schedule(config, get_mode("fp32"), layout, profile)
    assert schedule.compute_s == pytest.approx(profile.compute_s)
    assert config.compute_source == "replay (profile)"


def test_a_replay_on_a_cuda_device_is_refused_before_any_cuda_call(group_of_one,
                                                                    monkeypatch) -> None:
    """Replay keeps its model on the CPU (zero-page parameters): a rank handed a CUDA device
    (an NCCL backend) refuses, naming the fix, before it touches CUDA; checked on any host,
    with every CUDA entry point the rank would use made to fail the test."""
    from netsim_ddp.workload.ranks.rank import run_mode

    def no_cuda(name: str):
        def called(*args, **kwargs):
            raise AssertionError(f"torch.cuda.{name} was called before the refusal")
        return called  # one function per name: torch._dynamo's rules refuse a shared one

    for name in ("is_available", "device_count", "set_device", "synchronize", "Event",
                 "current_stream", "Stream"):
        monkeypatch.setattr(torch.cuda, name, no_cuda(name))
    config = WorkloadConfig(layout="generic", params=2400, compute="10ms", iterations=1)
    with pytest.raises(RuntimeError, match=r"compute replay keeps its model on the CPU.*"
                       r"workload\.backend = 'gloo'"):
        run_mode(config, "fp32", torch.device("cuda", 0), None)


def test_a_stall_delays_the_first_pass_and_counts_in_the_scheduled_compute() -> None:
    """The replay serves the stall it drew before the step's first forward (every release of
    that pass later by it, k x in host time), and its compute-only time includes it."""
    config = WorkloadConfig(layout="generic", params=2400, compute="10ms", noise={
        "spread": 0.0, "stalls": {"probability": 1.0, "scale": "20ms", "max": "20ms"}})
    schedule = replay_schedule(config, get_mode("fp32"), replay_layout(config))
    clock = ReplayClock(schedule, 2.0, NoiseModel.load(config.noise), 0)
    clock.begin_iteration(0)
    assert clock.stall_s == pytest.approx(0.02)
    assert clock.step_s(2) == pytest.approx(2.0 * (2 * 0.01 + 0.02))
    clock.start_pass()
    started = time.perf_counter()
    clock.forward()
    assert time.perf_counter() - started >= 2.0 * (schedule.forward_s + 0.02) - 1e-3
    clock.start_pass()  # the second micro-batch: the stall is served already
    started = time.perf_counter()
    clock.forward()
    assert time.perf_counter() - started < 2.0 * (schedule.forward_s + 0.02) - 5e-3
