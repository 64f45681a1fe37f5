"""The calibrated cluster's two levels: NVLink inside a server (from a one-server nccl-tests run,
the [sweep.projection] fields, or typical H100 defaults, each named), the network between
servers (the multi-host calibration), and the hierarchical all-reduce that uses both."""

from pathlib import Path

import numpy as np
import pytest
from click.testing import CliRunner
from test_calibrated_projection import at
from test_sweep_synthetic import base, fake_runner

from netsim_ddp.cli import main
from netsim_ddp.projection.calibrate import (
    Calibration,
    CalibrationError,
    Curve,
    load,
    projection_use,
)
from netsim_ddp.projection.cluster import (
    TYPICAL_NVLINK,
    Cluster,
    NvlinkLevel,
    allreduce_time,
    build,
    load_cluster,
    project_calibrated,
)
from netsim_ddp.projection.nccl_tests import CALIBRATABLE
from netsim_ddp.report.tables import projection_table
from netsim_ddp.run.sweep import run_sweep
from netsim_ddp.scenario.sweep_spec import SweepConfig

ROOT = Path(__file__).resolve().parents[2]
A3MEGA = ROOT / "tests" / "unit" / "nccl-tests" / "a3mega-2x8-h100.txt"
NETWORK = ROOT / "scenarios" / "calibrations" / "gloo-3nodes-1gbit.txt"
ONE_SERVER = ROOT / "scenarios" / "calibrations" / "gloo-1node-2ranks.txt"
MIB = 2**20
SIZES = np.array([2.0**k for k in range(3, 34)])


def synthetic(collective="all_reduce", world=2, hosts=2, alpha=50e-6, algbw=10e9):
    """A calibration whose curve is t = alpha + S / algbw (one GPU per host unless said)."""
    curve = Curve(SIZES, alpha + SIZES / algbw)
    return Calibration(collective, world, hosts, world // hosts, ["synthetic"],
                       [f"synthetic-{collective}-{world}x{hosts}"], curve)


def test_nvlink_from_the_fields_is_latency_plus_the_bus_bandwidth_term():
    level = NvlinkLevel(8, "given", busbw_bytes_per_s=400e9, latency_s=5e-6)
    size = 64 * MIB
    phase = 5e-6 + 7 / 8 * size / 400e9
    assert level.reduce_scatter_s(size) == pytest.approx(phase)
    assert level.all_gather_s(size) == pytest.approx(phase)
    assert level.all_reduce_s(size) == pytest.approx(2 * phase)
    assert NvlinkLevel(1, "one GPU").all_reduce_s(size) == 0.0
    assert level.as_dict()["measured"] == [] and level.as_dict()["latency_s"] == 5e-6


def test_the_servers_gpus_come_from_the_field_then_the_one_server_run_then_the_rank_lines():
    network = synthetic(world=16, hosts=2)  # 2 hosts x 8
    assert build(network, []).gpus_per_server == 8
    assert "rank lines" in build(network, []).gpus_source
    one_server = synthetic("reduce_scatter", world=4, hosts=1)
    cluster = build(network, [one_server])
    assert cluster.gpus_per_server == 4 and "one-server run" in cluster.gpus_source
    assert build(network, [], gpus_per_server=2).gpus_per_server == 2
    with pytest.raises(CalibrationError, match=r"s.toml: sweep.projection.gpus_per_server = 8, "
                                               r"but the one-server calibration .* ran on 4"):
        build(network, [one_server], gpus_per_server=8, where="s.toml: sweep.projection")
    with pytest.raises(CalibrationError, match=r"one-server runs on \[2, 4\] GPUs"):
        build(network, [one_server, synthetic("all_gather", world=2, hosts=1)])


def test_nvlink_defaults_name_the_hardware_they_describe_and_fields_override_them():
    cluster = build(synthetic(world=16, hosts=2), [])
    assert cluster.nvlink.busbw_bytes_per_s == TYPICAL_NVLINK.busbw_bytes_per_s == 370e9
    assert "H100 SXM" in cluster.nvlink.source and "NVLink 4" in cluster.nvlink.source
    assert any("370 GB/s" in line for line in cluster.describe())
    given = build(synthetic(world=16, hosts=2), [], nvlink_busbw_bps=8 * 150e9,
                  where="s.toml: sweep.projection")
    assert given.nvlink.busbw_bytes_per_s == 150e9
    assert given.nvlink.latency_s == TYPICAL_NVLINK.latency_s
    assert "s.toml: sweep.projection.nvlink_busbw" in given.nvlink.source
    assert "typical" in given.nvlink.source and "nvlink_latency" in given.nvlink.source


def test_one_server_curves_give_the_phases_and_an_all_reduce_alone_gives_half_each():
    network = synthetic(world=2, hosts=2)
    rs = synthetic("reduce_scatter", world=4, hosts=1, alpha=20e-6, algbw=100e9)
    ag = synthetic("all_gather", world=4, hosts=1, alpha=30e-6, algbw=200e9)
    cluster = build(network, [rs, ag], nvlink_busbw_bps=1e9)
    assert cluster.nvlink.reduce_scatter_s(MIB) == pytest.approx(rs.curve(MIB))
    assert cluster.nvlink.all_gather_s(MIB) == pytest.approx(ag.curve(MIB))
    assert cluster.nvlink.measured == ["reduce_scatter", "all_gather"]
    assert any("nvlink_busbw/nvlink_latency not used" in note for note in cluster.notes)
    alone = build(network, [rs], nvlink_busbw_bps=8 * 100e9)  # no all-gather measured
    assert alone.nvlink.all_gather_s(MIB) == pytest.approx(10e-6 + 3 / 4 * MIB / 100e9)
    (note,) = alone.notes
    assert note.startswith("all_gather inside a server: not in the one-server run; 100 GB/s")
    ar = synthetic("all_reduce", world=4, hosts=1, alpha=40e-6, algbw=50e9)
    halves = build(network, [ar]).nvlink
    assert halves.reduce_scatter_s(MIB) == pytest.approx(ar.curve(MIB) / 2)
    assert halves.all_reduce_s(MIB) == pytest.approx(ar.curve(MIB))


def test_multi_host_reduce_scatter_is_said_to_be_unused():
    cluster = build(synthetic(world=16, hosts=2), [synthetic("reduce_scatter", 16, 2)])
    (note,) = cluster.notes
    assert "not used" in note and "no FSDP" in note
    smaller = build(synthetic(world=16, hosts=2), [synthetic(world=8, hosts=2)]).notes
    assert smaller == ["all_reduce on 8 GPUs (2 hosts x 4), from synthetic-all_reduce-8x2: not "
                       "used (the network is the largest all_reduce calibrated, 16 GPUs)"]
    assert load_cluster([NETWORK, ROOT / "scenarios" / "calibrations" / "gloo-2nodes-1gbit.txt"]
                        ).network.world_size == 3
    assert "not used by projections" in projection_use(synthetic("all_gather", 16, 2),
                                                       CALIBRATABLE)
    assert "NVLink level" in projection_use(synthetic("all_gather", 4, 1), CALIBRATABLE)
    assert "network level" in projection_use(synthetic("all_reduce", 16, 2), CALIBRATABLE)


def one_gpu_hosts_in_8_gpu_servers():
    """A network calibrated with one GPU per host (t = 50 us + S / 10 GB/s on 2 hosts),
    projected onto 8-GPU servers with H100 NVLink."""
    return build(synthetic(world=2, hosts=2), [], gpus_per_server=8)


def test_each_algorithm_has_its_regime_and_the_row_names_it():
    cluster = one_gpu_hosts_in_8_gpu_servers()
    assert allreduce_time(cluster, 8, 25 * MIB).algorithm == "nvlink"  # one server
    # 2 servers, 1 GiB: the hierarchical all-reduce puts S, not 2(n-1)/n S, through each NIC.
    big = allreduce_time(cluster, 16, 2**30)
    assert big.algorithm == "hierarchical" and big.servers == 2
    assert big.seconds < 1.1 * 2**30 / 10e9
    # 64 GPUs, a DDP bucket: hierarchical beats the ring's 2(n-1) steps and the tree's bandwidth.
    mid = allreduce_time(cluster, 64, 25 * MIB)
    assert mid.algorithm == "hierarchical" and mid.servers == 8
    assert mid.seconds == pytest.approx(mid.nvlink_s + mid.network_s)
    nvlink = TYPICAL_NVLINK
    assert mid.nvlink_s == pytest.approx(2 * (nvlink.latency_s + 7 / 8 * 25 * MIB
                                              / nvlink.busbw_bytes_per_s))
    # Across 8 servers: 2 x 7 ring steps of the calibration's (50 us over its 2 steps), and
    # 2 x 7/8 x S through each server's NIC at the calibrated 10 GB/s.
    assert mid.network_s == pytest.approx(14 * 25e-6 + 2 * 7 / 8 * 25 * MIB / 10e9, rel=1e-4)
    # 1024 GPUs, a small message: the tree's log2(servers) depth wins.
    assert allreduce_time(cluster, 1024, 2**10).algorithm == "tree"


def test_the_calibrated_world_on_other_servers_is_not_the_calibration():
    network = synthetic(world=16, hosts=2)
    assert allreduce_time(build(network, []), 16, MIB).algorithm == "as calibrated"
    other = allreduce_time(build(network, [], gpus_per_server=4), 16, MIB)
    assert other.algorithm != "as calibrated" and other.servers == 4


def test_more_servers_never_beat_the_calibration_and_ring_or_tree_never_beat_nvlink():
    cluster = one_gpu_hosts_in_8_gpu_servers()
    slow_nvlink = build(synthetic(world=2, hosts=2), [], gpus_per_server=8,
                        nvlink_busbw_bps=8 * 1e9)  # NVLink slower than the network
    for n in (16, 64, 256, 1024):
        for size in (2**10, MIB, 25 * MIB, 2**30):
            assert allreduce_time(cluster, n, size).seconds >= synthetic().curve(size)
            one = allreduce_time(slow_nvlink, n, size)
            assert one.seconds >= slow_nvlink.nvlink.all_reduce_s(size) * (1 - 1e-12)


def test_projection_rows_name_algorithm_servers_and_levels():
    rows = project_calibrated(one_gpu_hosts_in_8_gpu_servers(), overlap=0.0,
                              compute_s={"fp32": 0.1}, bytes_per_rank={"fp32": 100 * MIB},
                              buckets={"fp32": 4}, gpus=[8, 64, 1024])
    by = {row["gpus"]: row for row in rows}
    assert [by[n]["servers"] for n in (8, 64, 1024)] == [1, 8, 128]
    assert {row["gpus_per_server"] for row in rows} == {8}
    assert by[8]["algorithm"] == "nvlink" and by[64]["algorithm"] == "hierarchical"
    assert by[64]["allreduce_s"] == pytest.approx(by[64]["nvlink_s"] + by[64]["network_s"])
    assert by[64]["allreduce_s"] == pytest.approx(
        4 * allreduce_time(one_gpu_hosts_in_8_gpu_servers(), 64, 25 * MIB).seconds)


def test_the_shipped_one_server_file_gives_measured_nvlink_phases():
    found = load([ONE_SERVER])
    assert sorted(c.collective for c in found) == ["all_gather", "all_reduce", "reduce_scatter"]
    assert {(c.hosts, c.world_size) for c in found} == {(1, 2)}
    cluster = load_cluster([NETWORK, ONE_SERVER])
    assert cluster.network.hosts == 3 and cluster.gpus_per_server == 2
    assert cluster.nvlink.measured == ["reduce_scatter", "all_gather", "all_reduce"]
    rs = next(c for c in found if c.collective == "reduce_scatter")
    assert cluster.nvlink.reduce_scatter_s(4 * MIB) == pytest.approx(rs.curve(4 * MIB))
    assert allreduce_time(cluster, 2, MIB).algorithm == "nvlink"
    with pytest.raises(CalibrationError, match="one host: it measures NVLink/PCIe"):
        load_cluster([ONE_SERVER])


def test_a3mega_on_its_own_servers_uses_typical_nvlink_and_says_so():
    cluster = Cluster.of(load_cluster([A3MEGA]).network)
    assert cluster.gpus_per_server == 8 and cluster.nvlink.measured == []
    levels = " ".join(cluster.describe())
    assert "2 hosts x 8" in levels and "typical" in levels


def test_a_sweep_reads_the_cluster_fields_and_lists_of_files(tmp_path):
    scenario = base()
    config = SweepConfig(nodes=[1, 2, 3, 4], projection={
        "gpus": [16, 64, 1024], "calibration": [str(NETWORK), str(ONE_SERVER)]})
    sweep = run_sweep(scenario, config, runner=fake_runner())
    rows = sweep.projection.rows
    assert {row["gpus_per_server"] for row in rows} == {2}
    assert any(row["algorithm"] in ("hierarchical", "ring", "tree") for row in rows)
    notes = " ".join(sweep.projection.notes)
    assert "one-server run" in notes and "as measured" in notes
    assert "servers' GPUs, NICs and NVLink" in " ".join(sweep.projection.assumptions())
    relative = SweepConfig(nodes=[1, 2, 3, 4], projection={"gpus": [16], "calibration": [
        "calibrations/gloo-3nodes-1gbit.txt", "calibrations/gloo-1node-2ranks.txt"]})
    found = run_sweep(at(ROOT / "scenarios" / "sweep.toml"), relative, runner=fake_runner())
    assert found.calibration.network.hosts == 3 and found.calibration.nvlink.measured
    fields = SweepConfig(nodes=[1, 2, 3, 4], projection={
        "gpus": [16, 64], "calibration": str(NETWORK), "gpus_per_server": 8,
        "nvlink_busbw": "200GB/s", "nvlink_latency": "20us", "nics_per_server": 8,
        "nic_bandwidth": "1gbit"})
    cluster = run_sweep(scenario, fields, runner=fake_runner()).calibration
    assert cluster.gpus_per_server == 8
    assert (cluster.nics.per_server, cluster.nics.bits_per_s) == (8, 1e9)
    assert cluster.nics.source == "sweep.projection.nics_per_server"
    assert cluster.nic_scale == 8  # 1-GPU hosts calibrated, 8 NICs in each 8-GPU server
    assert cluster.gpus_source == "sweep.projection.gpus_per_server"
    assert cluster.nvlink.busbw_bytes_per_s == pytest.approx(200e9)
    assert cluster.nvlink.latency_s == pytest.approx(20e-6)
    table = projection_table(run_sweep(scenario, fields, runner=fake_runner())
                             .projection.to_record())
    assert "hier" in table.caption and "nvl" in table.caption


def test_calibrate_says_what_a_projection_does_with_each_run():
    done = CliRunner().invoke(main, ["calibrate", str(ONE_SERVER)])
    assert done.exit_code == 0, done.output
    assert done.output.count("NVLink level inside a server of 2 GPUs") == 3


@pytest.mark.parametrize("smallest", [8, 32 * MIB])
def test_the_networks_latency_is_the_reference_sizes_time_less_its_bytes(smallest):
    # t = 300 us + S / 10 GB/s on 16 GPUs: the ring's latency is 300 us, whether the run
    # started at 8 B or at 32 MiB (-b 32M: the smallest size's time is mostly its bytes, so it
    # bounds nothing; it once stood in for the latency and made 10 ring steps cost 1.2 ms).
    sizes = SIZES[SIZES >= smallest]
    curve = Curve(sizes, 300e-6 + sizes / 10e9)
    network = Calibration("all_reduce", 16, 2, 8, ["synthetic"], ["synthetic"], curve)
    level = build(network, []).level
    assert level.reference_size == max(MIB, smallest)
    assert level.latency_ref_s == pytest.approx(300e-6, rel=0.02)
