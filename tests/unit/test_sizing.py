"""What a scale model's ranks cost a host, and how many machines of a kind it needs
(scenario.rank_costs, scenario.sizing, `netsim-ddp plan --machine`)."""

import subprocess
import sys
from pathlib import Path

import pytest

from netsim_ddp import Scenario, ScenarioError
from netsim_ddp.scenario.limits import HostResources, check_host
from netsim_ddp.scenario.rank_costs import (
    CPU_BUDGET,
    bytes_per_param,
    least_dilation,
    node_costs,
    scenario_memory_bytes,
)
from netsim_ddp.scenario.sizing import MachineSpec, size_machines, size_row

ROOT = Path(__file__).resolve().parents[2]
SCALE = ROOT / "scenarios" / "scale"
GiB = 2**30
THIS_KIND = HostResources(memory_bytes=23 * GiB, max_processes=100_000, max_net_namespaces=10_000)


def scenario(nodes=4, per_node=4, layout="vgg16", modes=("fp32",), rate="10gbit", replay=True,
             dilation=40):
    workload = {"layout": layout, "modes": list(modes)}
    if replay:
        workload["compute"] = "300ms"
    else:
        workload["model"] = "mlp"
        workload.pop("layout")
        workload["params"] = "138M"
    return Scenario.from_dict({"name": "s", "topology": {"nodes": nodes,
                                                         "ranks_per_node": per_node},
                               "link": {"rate": rate}, "emulation": {"dilation": dilation},
                               "workload": workload}, "s.toml")


def test_replayed_vgg16_at_16_ranks_fits_where_computing_ranks_do_not():
    """The old check charged every rank 20 bytes per parameter and refused VGG-16 x 16 on a
    23 GiB host as 45.6 GiB; a replayed rank holds DDP's buckets only."""
    check_host(scenario(), THIS_KIND)  # no refusal
    processes, models = scenario_memory_bytes(scenario())
    assert processes + models < 12 * GiB
    with pytest.raises(ScenarioError) as info:
        check_host(scenario(replay=False), THIS_KIND)
    assert info.value.field == "workload.params" and "20 bytes per parameter" in str(info.value)


def test_a_replayed_rank_holds_buckets_and_a_16_bit_hook_its_copies():
    assert bytes_per_param(scenario(modes=("fp32", "amp"))) == 4  # amp's buckets stay fp32
    assert bytes_per_param(scenario(modes=("fp32", "amp-fp16"))) == 6
    assert bytes_per_param(scenario(replay=False)) == 20


def test_a_replayed_script_is_charged_its_real_model_and_variant_names_are_not_modes():
    """A script in a scale model replays only its compute: its weights, gradients and optimizer
    are real; its variants ('script', 'release') are names, not precision modes."""
    script = Scenario.from_dict({
        "name": "s", "topology": {"nodes": 2, "ranks_per_node": 2}, "link": {"rate": "10gbit"},
        "emulation": {"dilation": 40},
        "workload": {"command": ["train.py"], "compute": "100ms", "params": "1M",
                     "variant": [{"name": "script"}, {"name": "release"}]}}, "s.toml")
    assert bytes_per_param(script) == 20
    check_host(script, THIS_KIND)


def test_32_resnet50_ranks_fit_this_kind_of_host_with_room():
    shipped = Scenario.load(SCALE / "10gbe-32gpu.toml")
    check_host(shipped, THIS_KIND)
    processes, models = scenario_memory_bytes(shipped)
    assert processes + models < THIS_KIND.memory_bytes / 2


def test_cpu_shrinks_with_dilation_and_grows_with_ranks():
    small, big = scenario(nodes=2), scenario(nodes=4, per_node=8)
    assert node_costs(big).cores(40) == pytest.approx(2 * node_costs(small).cores(40))
    assert node_costs(small).cores(80) == pytest.approx(node_costs(small).cores(40) / 2)
    # The least power of two whose demand fits the budget, and not one below it.
    k = least_dilation(10.0, cores=2)
    assert 10.0 / k <= 2 * CPU_BUDGET < 10.0 / (k / 2)


@pytest.mark.parametrize("text, problem", [
    ("cores=16", "memory"),
    ("cores=0,memory=64GiB", "cores"),
    ("cores=16,memory=lots", "memory"),
    ("cores=16,memory=64GiB,gpus=8", "gpus"),
    ("16 cores", "NAME=VALUE"),
    ("cores=16,cores=8,memory=1GiB", "twice"),
])
def test_a_bad_machine_names_what_is_wrong_and_the_form(text, problem):
    with pytest.raises(ValueError) as info:
        MachineSpec.parse(text)
    assert problem in str(info.value) and "cores=16,memory=64GiB" in str(info.value)


def test_the_128_gpu_25gbe_model_in_machines():
    model = Scenario.load(SCALE / "25gbe-128gpu.toml")
    with pytest.raises(ScenarioError):
        check_host(model, THIS_KIND)  # not on one host of this kind
    machine = MachineSpec.parse("cores=16,memory=64GiB")
    sizing = size_machines(model, machine)
    machines = [row.machines for row in sizing.rows if row.machines]
    assert machines == sorted(machines, reverse=True)  # a larger k never needs more machines
    assert sizing.row_at(1).machines is None  # 25 Gbit/s x 4 ranks in real time: no machine
    assert sizing.row_at(128).machines == 1 and sizing.least_k_one_machine == 128
    # Where memory binds, dilation no longer helps: 16 GiB machines hold 9 nodes at any k.
    small = size_machines(model, MachineSpec.parse("cores=64,memory=16GiB"))
    assert {row.machines for row in small.rows if row.dilation >= 16} == {4}
    assert small.row_at(256).bound_by == "memory" and small.least_k_one_machine is None


def test_a_machine_never_holds_more_nodes_than_its_budgets_allow():
    model = Scenario.load(SCALE / "25gbe-128gpu.toml")
    machine = MachineSpec.parse("cores=8,memory=32GiB")
    for k in (4, 16, 64):
        row = size_row(model, machine, k)
        node = node_costs(model)
        assert row.nodes_per_machine * node.memory_bytes <= 0.8 * machine.memory
        assert row.nodes_per_machine * node.cores(k) <= CPU_BUDGET * machine.cores
        assert (row.nodes_per_machine + 1) * node.memory_bytes > 0.8 * machine.memory or \
            (row.nodes_per_machine + 1) * node.cores(k) > CPU_BUDGET * machine.cores


def run_plan(*args):
    return subprocess.run([sys.executable, "-m", "netsim_ddp.cli", "plan", *map(str, args)],
                          capture_output=True, text=True, timeout=120)


def test_plan_sizes_the_128_gpu_model_in_machines():
    result = run_plan(SCALE / "25gbe-128gpu.toml", "--machine", "cores=16,memory=64GiB")
    assert result.returncode == 0, result.stderr
    assert "memory: about 42.28GiB" in result.stdout  # the host's share is printed first
    assert "at the scenario's x128: 1 machine(s) of 32 nodes" in result.stdout


def test_plan_refuses_a_bad_machine_as_bad_input():
    result = run_plan(SCALE / "25gbe-128gpu.toml", "--machine", "cores=16")
    assert result.returncode == 2 and "memory" in result.stderr
