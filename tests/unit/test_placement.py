"""Where ranks run: GPUs assigned across emulated nodes, the backend, each node's environment,
and the refusal that names what a host lacks."""

import pytest

from netsim_ddp import Scenario
from netsim_ddp.hostfacts.gpus import (
    GPUS_ENV,
    GpuError,
    GpuInventory,
    assign_gpus,
    inventory_from,
    local_device_index,
    probe_gpus,
)
from netsim_ddp.hostfacts.placement import place

H200 = GpuInventory(1, ("NVIDIA H200",), "2.11.0+cu130", "13.0", "2.27.7")
EIGHT = GpuInventory(8, ("H100",) * 8, "2.11.0", "12.8", "2.27.7")
NONE = GpuInventory(0, missing="torch is a CPU-only build (no .../libtorch_cuda.so)")


def scenario(nodes=2, ranks=1, backend="nccl", share=False, **workload):
    return Scenario.from_dict({
        "name": "p", "topology": {"nodes": nodes, "ranks_per_node": ranks},
        "link": {"rate": "1gbit"},
        "workload": {"params": "1M", "backend": backend, "share_gpus": share, **workload}})


def test_each_rank_gets_its_own_gpu_across_nodes():
    gpus = assign_gpus(nodes=2, ranks_per_node=4, gpus=8, share=False)
    assert gpus.devices == ((0, 1, 2, 3), (4, 5, 6, 7))  # not cuda:r on every node
    assert not gpus.shared
    assert gpus.env(1) == {GPUS_ENV: "4,5,6,7"}


def test_fewer_gpus_than_ranks_needs_the_scenario_to_allow_sharing():
    with pytest.raises(GpuError, match="need 4 GPUs.*has 2.*share_gpus = true"):
        assign_gpus(nodes=2, ranks_per_node=2, gpus=2, share=False)
    shared = assign_gpus(nodes=2, ranks_per_node=2, gpus=2, share=True)
    assert shared.devices == ((0, 1), (0, 1)) and shared.shared
    assert "shared (up to 2 ranks per GPU" in shared.describe()
    assert assign_gpus(nodes=2, ranks_per_node=1, gpus=1, share=True).devices == ((0,), (0,))


def test_two_ranks_of_one_node_never_share_a_gpu():
    with pytest.raises(GpuError, match="NCCL cannot put two ranks of one node on one GPU"):
        assign_gpus(nodes=2, ranks_per_node=2, gpus=1, share=True)


def test_rank_side_reads_its_gpu_from_the_assignment():
    assert local_device_index(1, {GPUS_ENV: "4,5"}) == 5
    assert local_device_index(1, {}) == 1  # started without the harness: cuda:local_rank
    with pytest.raises(GpuError):
        local_device_index(2, {GPUS_ENV: "4,5"})


def test_nccl_without_gpus_is_refused_naming_what_is_missing():
    sc = scenario()
    placement = place(sc.workload, sc.topology, NONE, environ={})
    assert placement.refused and "needs CUDA GPUs and NCCL" in placement.refused
    assert "CPU-only build" in placement.refused
    auto = scenario(backend="auto")
    fallback = place(auto.workload, auto.topology, NONE, environ={})
    assert fallback.backend == "gloo" and not fallback.refused and "CPU-only" in fallback.note


def test_this_host_without_gpus_says_why():
    inventory = probe_gpus()
    if inventory.count:
        pytest.skip("this host has GPUs")
    assert not inventory.nccl_usable and inventory.missing


def test_two_nodes_share_one_gpu_when_the_scenario_says_so():
    refused = scenario()
    assert "share_gpus" in place(refused.workload, refused.topology, H200, environ={}).refused
    sc = scenario(share=True)
    placement = place(sc.workload, sc.topology, H200, environ={})
    assert placement.backend == "nccl" and placement.refused is None
    assert placement.as_dict()["shared_gpus"] is True
    assert placement.as_dict()["gpus"]["devices"] == [[0], [0]]
    n0, n1 = placement.node_env("abc123", ["n0", "n1"], environ={})
    assert n0[GPUS_ENV] == n1[GPUS_ENV] == "0"
    assert n0["NCCL_HOSTID"] != n1["NCCL_HOSTID"]
    assert n0["NCCL_SOCKET_IFNAME"] == "=eth0" and n0["NCCL_IB_DISABLE"] == "1"


def test_auto_picks_nccl_with_a_gpu_per_rank_and_gloo_gets_no_nccl_env():
    auto = scenario(nodes=2, ranks=4, backend="auto")
    assert place(auto.workload, auto.topology, EIGHT, environ={}).backend == "nccl"
    fewer = place(auto.workload, auto.topology, H200, environ={})
    assert fewer.backend == "gloo" and "share_gpus" in fewer.note
    gloo = scenario(backend="gloo")
    placement = place(gloo.workload, gloo.topology, EIGHT, environ={})
    assert placement.node_env("r", ["n0", "n1"], environ={}) == [{}, {}]


def test_compute_replay_takes_gloo_on_a_gpu_host_and_refuses_nccl_before_the_network():
    """The replayed model stays on the CPU: on a GPU host 'auto' must not hand it to NCCL (its
    ranks would refuse after the network was built), and 'nccl' is refused at placement."""
    auto = scenario(nodes=2, ranks=4, backend="auto", compute="100ms")
    placed = place(auto.workload, auto.topology, EIGHT, environ={})
    assert placed.backend == "gloo" and not placed.refused and "replay" in placed.note
    nccl_ = scenario(nodes=2, ranks=4, backend="nccl", compute="100ms")
    refused = place(nccl_.workload, nccl_.topology, EIGHT, environ={})
    assert refused.refused and "gloo" in refused.refused


def test_users_nccl_settings_that_break_the_emulation_refuse_the_run():
    sc = scenario(nodes=2, ranks=4)
    environ = {"NCCL_SOCKET_IFNAME": "ib0", "NCCL_ALGO": "Ring"}
    placement = place(sc.workload, sc.topology, EIGHT, environ=environ)
    assert placement.refused.startswith("NCCL settings in the environment would break")
    assert "NCCL_SOCKET_IFNAME=ib0" in placement.refused and "NCCL_ALGO" not in placement.refused


def test_inventory_from_the_child_names_what_is_missing():
    assert inventory_from({"torch": "2.11", "cuda": "13.0", "count": 0}).missing.startswith(
        "CUDA sees no GPU")
    no_nccl = inventory_from({"torch": "2.11", "cuda": "13.0", "count": 1, "nccl": None})
    assert "without NCCL" in no_nccl.missing
    assert inventory_from({"torch": "2.11", "cuda": "13.0", "count": 1, "nccl": "2.27.7",
                           "names": ["H200"]}).nccl_usable


def test_nccl_is_pinned_to_ring_and_simple_unless_the_user_chose_and_it_says_so():
    """Ring or tree per message size: their bytes between nodes differ up to 1.75x with
    several ranks per node, and fp16 buckets are half the size."""
    sc = scenario(nodes=2, ranks=4)
    placement = place(sc.workload, sc.topology, EIGHT, environ={})
    (n0, _) = placement.node_env("r", ["n0", "n1"], environ={})
    assert n0["NCCL_ALGO"] == "Ring" and n0["NCCL_PROTO"] == "Simple"
    assert "NCCL_ALGO=Ring" in placement.describe()
    assert placement.as_dict()["nccl_pinned"] == {"NCCL_ALGO": "Ring", "NCCL_PROTO": "Simple"}
    mine = {"NCCL_ALGO": "Tree"}
    chosen = place(sc.workload, sc.topology, EIGHT, environ=mine)
    (n0, _) = chosen.node_env("r", ["n0", "n1"], environ=mine)
    assert "NCCL_ALGO" not in n0 and n0["NCCL_PROTO"] == "Simple"  # the user's Tree passes
    assert chosen.pinned == {"NCCL_PROTO": "Simple"}


def test_sharing_a_gpu_in_exclusive_compute_mode_is_refused_and_sharing_is_said():
    sc = scenario(nodes=2, ranks=1, share=True)
    exclusive = GpuInventory(1, ("NVIDIA H200",), "2.11.0", "13.0", "2.27.7",
                             compute_modes=("Exclusive_Process",))
    refused = place(sc.workload, sc.topology, exclusive, environ={})
    assert refused.refused and "Exclusive_Process" in refused.refused
    assert "nvidia-smi -c DEFAULT" in refused.refused
    shared = place(sc.workload, sc.topology, H200, environ={})  # compute mode unknown: shares
    assert shared.refused is None and shared.gpus.shared
    assert "time-slice" in shared.describe()
    assert "communication times" in shared.as_dict()["shared_gpu_note"]
    own = place(scenario(nodes=2, ranks=1).workload, sc.topology, EIGHT, environ={})
    assert own.as_dict()["shared_gpu_note"] is None


def test_the_gpu_probe_reads_compute_modes():
    found = inventory_from({"torch": "2.11", "cuda": "13.0", "count": 1, "nccl": "2.27.7",
                            "compute_modes": ["Exclusive_Process"]})
    assert found.compute_modes == ("Exclusive_Process",)
