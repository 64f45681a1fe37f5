"""Projections from a calibration (nccl-tests output), and the honest one without: at the
calibrated world size the calibrated times come back; beyond it ring or tree, named; far past
the measured sizes without a calibration, the fitted and a typical latency side by side."""

from pathlib import Path

import pytest
from click.testing import CliRunner
from test_sweep_synthetic import base, fake_runner

from netsim_ddp import Scenario
from netsim_ddp.cli import main
from netsim_ddp.projection.calibrate import CalibrationError, load_allreduce
from netsim_ddp.projection.cluster import collective_time, project_calibrated
from netsim_ddp.projection.costmodel import TYPICAL_ETHERNET_ALPHA_S
from netsim_ddp.report.tables import projection_table
from netsim_ddp.run.sweep import run_sweep
from netsim_ddp.scenario.sweep_spec import SweepConfig
from netsim_ddp.verdicts.scenario_report import results_document

ROOT = Path(__file__).resolve().parents[2]
A3MEGA = ROOT / "tests" / "unit" / "nccl-tests" / "a3mega-2x8-h100.txt"
ONE_SERVER_RUN = ROOT / "scenarios" / "calibrations" / "gloo-1node-2ranks.txt"
ONE_HOST = ROOT / "tests" / "unit" / "nccl-tests" / "old-format-error-column.txt"
# The shipped network calibrations (2+ hosts); gloo-1node-2ranks.txt is one server's.
SHIPPED = sorted((ROOT / "scenarios" / "calibrations").glob("gloo-*nodes-*.txt"))


@pytest.mark.parametrize("path", [A3MEGA, *SHIPPED], ids=lambda p: p.name)
def test_at_the_calibrated_world_size_the_calibrated_times_come_back(path):
    calibration = load_allreduce(path)
    n = calibration.world_size
    sizes, measured = calibration.curve.sizes, calibration.curve.measured_s
    big = [(s, t) for s, t in zip(sizes, measured, strict=True) if s >= 2**20]
    for size, seconds in big:
        projected, algorithm = collective_time(calibration, n, size)
        assert algorithm == "as calibrated"
        assert projected == pytest.approx(seconds, rel=1e-9)
    # Through a DDP step: k buckets of the measured sizes, no overlap, 50 ms compute.
    size, seconds = big[len(big) // 2]
    (row,) = project_calibrated(calibration, overlap=0.0, compute_s={"fp32": 0.05},
                                bytes_per_rank={"fp32": 3 * size}, buckets={"fp32": 3},
                                gpus=[n])
    assert row["allreduce_s"] == pytest.approx(3 * seconds)
    assert row["step_s"] == pytest.approx(0.05 + 3 * seconds)
    assert row["algorithm"] == "as calibrated"


def test_beyond_it_ring_for_big_messages_tree_for_small_each_named():
    calibration = load_allreduce(A3MEGA)  # 16 H100 on 2 hosts
    small, _ = collective_time(calibration, 1024, 64 * 2**10)
    _, small_algorithm = collective_time(calibration, 1024, 64 * 2**10)
    _, big_algorithm = collective_time(calibration, 32, 4 * 2**30)
    assert (small_algorithm, big_algorithm) == ("tree", "ring")
    # The tree's latency grows with log2(hosts): 128 hosts = 7 x the 2-host time at that size
    # (158 us at 64 KiB: latency, whose protocol the calibration ran at that size).
    floor = calibration.curve(64 * 2**10)
    assert 7 * floor < small < 7 * floor + 0.05e-3
    # Ring at the bandwidth plateau: 2(n-1)/n x S / busbw at most ~5% off for 4 GiB on 32.
    ring, _ = collective_time(calibration, 32, 4 * 2**30)
    bound = 2 * 31 / 32 * 4 * 2**30 / calibration.busbw_bytes_per_s
    assert bound < ring < 1.15 * bound
    # More GPUs never make one all-reduce faster than calibrated.
    for n in (32, 64, 256, 1024):
        for size in (2**10, 2**20, 25 * 2**20, 2**30):
            assert collective_time(calibration, n, size)[0] >= calibration.curve(size)


def test_a_one_host_calibration_does_not_project_past_its_host():
    calibration = load_allreduce(ONE_HOST)  # 4 V100 in one server
    with pytest.raises(CalibrationError, match="one host: it measures NVLink/PCIe"):
        collective_time(calibration, 8, 2**20)


def at(path):
    """The synthetic scenario as if loaded from `path`."""
    return Scenario.from_dict(base().model_dump(mode="json", exclude_none=True), path)


def calibrated_config(path, gpus=(16, 64, 1024)):
    return SweepConfig(nodes=[1, 2, 3, 4], params=["2M", "4M"],
                       projection={"gpus": list(gpus), "calibration": str(path)})


def test_a_sweep_projects_from_its_calibration_and_says_so():
    sweep = run_sweep(base(), calibrated_config(A3MEGA), runner=fake_runner())
    projection = sweep.projection
    assert "calibration" in projection.label and projection.calibration["world_size"] == 16
    by = {(r["mode"], r["gpus"]): r for r in projection.rows}
    assert len(projection.rows) == 3 * 3  # one row per mode and GPU count: no link axis
    assert by["fp32", 16]["algorithm"] == "as calibrated"
    assert {by["fp32", n]["algorithm"] for n in (64, 1024)} <= {"ring", "tree"}
    # The buckets and bytes are the ones measured here; the overlap is the fitted one.
    bucket = projection.bytes_per_rank["fp32"] / projection.buckets["fp32"]
    allreduce = projection.buckets["fp32"] * load_allreduce(A3MEGA).curve(bucket)
    assert by["fp32", 16]["allreduce_s"] == pytest.approx(allreduce)
    exposed = max(0.0, allreduce - sweep.fit.model.overlap * projection.compute_s["fp32"])
    assert by["fp32", 16]["exposed_comm_s"] == pytest.approx(exposed)
    assumptions = " ".join(projection.assumptions())
    assert "nccl-tests" in assumptions and "ring 2(n-1)" in assumptions
    # And a sweep reading the file relative to itself:
    scenario = at(ROOT / "scenarios" / "sweep.toml")
    relative = calibrated_config(Path("..") / "tests" / "unit" / "nccl-tests" / A3MEGA.name)
    assert run_sweep(scenario, relative, runner=fake_runner()).calibration is not None


def test_a_bad_calibration_names_the_field_before_any_point_runs(tmp_path):
    calls = []
    bad = tmp_path / "bad.txt"
    bad.write_text("nothing here\n")
    scenario = at(tmp_path / "s.toml")
    with pytest.raises(CalibrationError, match=r"s.toml: sweep.projection.calibration: .*bad.txt"):
        run_sweep(scenario, calibrated_config("bad.txt"), runner=fake_runner(calls=calls))
    assert calls == []


def test_without_calibration_far_past_the_measured_sizes_two_latencies_side_by_side():
    # Measured up to 4 ranks with 3 ms hops: 64 and 1024 GPUs are past 8 x; 16 GPUs is not, but
    # at 100 Gbit/s its all-reduce is more latency (30 hops x 3 ms) than bandwidth, so the host's
    # latency decides it there too; at 1 Gbit/s 16 GPUs are bandwidth-bound: one number.
    config = SweepConfig(nodes=[1, 2, 3, 4], projection={"gpus": [16, 64, 1024],
                                                         "rates": ["100gbit", "1gbit"]})
    sweep = run_sweep(base(), config, runner=fake_runner())
    projection = sweep.projection
    by = {(r["gpus"], r["link_bps"]): r for r in projection.rows if r["mode"] == "fp32"}
    assert "efficiency_typical_alpha" not in by[16, 1e9]
    assert by[16, 100e9]["efficiency_typical_alpha"] > by[16, 100e9]["efficiency"]
    assert by[1024, 1e9]["efficiency_typical_alpha"] > by[1024, 1e9]["efficiency"]
    assert projection.typical_alpha_s == TYPICAL_ETHERNET_ALPHA_S
    assert "THIS HOST'S STACK" in " ".join(projection.assumptions())
    (note,) = projection.notes
    assert "latency term is this host's stack" in note
    assert "more latency than bandwidth" in note
    table = projection_table(projection.to_record())
    # Rows: fp32 at 1 Gbit/s, then at 100 Gbit/s; columns: mode, link, 16, 64, 1024 GPUs.
    assert " / " in list(table.columns[-1].cells)[0]
    assert [" / " in cell for cell in list(table.columns[2].cells)[:2]] == [False, True]
    # A cluster's alpha given: its own number, no side-by-side.
    given = config.model_copy(update={"projection": config.projection.model_copy(
        update={"alpha": 20e-6})})
    assert run_sweep(base(), given, runner=fake_runner()).projection.typical_alpha_s is None


def test_report_reprojects_a_results_file_from_a_calibration(tmp_path):
    sweep = run_sweep(base(), SweepConfig(nodes=[1, 2, 3, 4]), runner=fake_runner())
    results = tmp_path / "results.json"
    results.write_text(results_document([], [sweep]).to_json())
    out = tmp_path / "report"
    # The network from one file, NVLink from a one-server run in another (--calibration twice).
    done = CliRunner().invoke(main, ["report", str(results), "--out", str(out),
                                     "--calibration", str(A3MEGA),
                                     "--calibration", str(ONE_SERVER_RUN)])
    assert done.exit_code == 0, done.output
    text = (out / "report.md").read_text()
    assert "from the calibration's nccl-tests" in text and "held-out error" in text
    assert " tree" in text or " ring" in text or " hier" in text
    assert "2 GPU(s) per server (the one-server run" in text
    assert "Calibration: reduce_scatter on 2 GPUs (1 hosts)" in text  # its per-size table
    assert "1 NIC(s) per server (default" in text  # every projection says its NICs
    # The servers' NICs as given on the command line, named as options.
    nics = CliRunner().invoke(main, ["report", str(results), "--out", str(out),
                                     "--calibration", str(A3MEGA), "--nics-per-server", "8",
                                     "--nic-bandwidth", "200gbit"])
    assert nics.exit_code == 0, nics.output
    text = (out / "report.md").read_text()
    assert "8 NIC(s) per server (--nics-per-server)" in text
    assert "200 Gbit/s each (--nic-bandwidth)" in text
    alone = CliRunner().invoke(main, ["report", str(results), "--out", str(out),
                                      "--nics-per-server", "8"])
    assert alone.exit_code == 2 and "give the calibration too" in alone.stderr
    bad = CliRunner().invoke(main, ["report", str(results), "--out", str(out),
                                    "--calibration", str(ONE_HOST.parent / "separate-jobs.txt")])
    assert bad.exit_code == 2 and "--calibration:" in bad.stderr


def test_run_refuses_a_bad_calibration_before_building_anything(tmp_path):
    done = CliRunner().invoke(main, ["run", str(ROOT / "scenarios" / "sweep.toml"),
                                     "--calibration", str(tmp_path / "missing.txt")])
    assert done.exit_code == 2 and "--calibration: " in done.stderr
