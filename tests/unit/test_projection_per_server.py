"""The public series across GPUs per server (issue 35, item 2): two clusters of two 8 x H100
servers, each run with 2, 4 and 8 GPUs per server (scenarios/calibrations/nccl-tests-scales/,
SOURCES.md there). Each file parses whole and its rows agree with themselves; each bench row
projects to the target's servers, and the 2-host tree NCCL ran is flagged on the servers' own
size. Nothing is fitted to these files: every projection of them is held out."""

import importlib.util
import sys
from pathlib import Path

import pytest

from netsim_ddp.projection.calibrate import load
from netsim_ddp.projection.nccl_tests import parse_file

ROOT = Path(__file__).resolve().parents[2]
SCALES = ROOT / "scenarios" / "calibrations" / "nccl-tests-scales"
BENCH = ROOT / "bench" / "projection_scales.py"
MIB = 2**20
FILES = [f"{cluster}-h100-2x{g}" for cluster in ("dgx06", "lambda1cc") for g in (2, 4, 8)]


def bench_module():
    spec = importlib.util.spec_from_file_location("projection_scales_per_server", BENCH)
    module = importlib.util.module_from_spec(spec)
    sys.modules[spec.name] = module  # its dataclasses look their module up
    spec.loader.exec_module(module)
    return module


BENCHED = bench_module()


def table(path):
    """The printed rows: size, then (time us, algbw, busbw) out of place and in place."""
    for line in path.read_text().splitlines():
        tokens = line.split()
        if len(tokens) == 13 and tokens[0].isdigit():
            yield int(tokens[0]), [tuple(map(float, tokens[i:i + 3])) for i in (5, 9)]


def rows_agree(path, run):
    """The printed rows, each agreeing with itself as nccl-tests prints them (GB/s rounded to
    2 decimals, times to 4 digits) and with the parser's sizes."""
    rows = list(table(path))
    assert [size for size, _ in rows] == [row.size for row in run.rows]
    n = run.world_size
    for size, timings in rows:
        for time_us, algbw, busbw in timings:
            exact = size / time_us / 1e3
            assert exact == pytest.approx(algbw, rel=3e-3, abs=6e-3)
            assert exact * 2 * (n - 1) / n == pytest.approx(busbw, rel=3e-3, abs=6e-3)
    return rows


@pytest.mark.parametrize("name", FILES)
def test_each_file_is_one_whole_run_whose_rows_agree(name):
    path = SCALES / f"{name}.txt"
    g = int(name[-1])
    (run,) = parse_file(path)
    assert run.collective == "all_reduce" and run.complete
    assert (run.world_size, len(run.hosts), run.gpus_per_host, run.n_gpus) == (2 * g, 2, g, g)
    assert all("H100" in rank.device_name for rank in run.ranks)
    rows = rows_agree(path, run)
    assert rows[0][0] == 8 and rows[-1][0] >= 8 * 2**30  # 8 B .. 8 or 16 GiB, every 2x
    (calibration,) = load([path])
    assert calibration.hosts == 2 and calibration.gpus_per_host == g


@pytest.mark.parametrize(("calibrated", "target"), BENCHED.PER_SERVER_ROWS,
                         ids=lambda name: name)
def test_each_row_projects_to_the_targets_servers_and_flags_the_tree(calibrated, target):
    row = BENCHED.Row(SCALES / f"{calibrated}.txt", SCALES / f"{target}.txt", 8, 400e9,
                      server_gpus=8)
    BENCHED.check(row, 64 * MIB)
    g0, g = int(calibrated[-1]), int(target[-1])
    assert (row.calibrated_gpus, row.gpus_per_server, row.hosts) == (g0, g, 2)
    assert BENCHED.cluster_of(row).gpus_per_server == g  # 2 servers of g, not 2g/g0 of g0
    assert len(row.sizes) >= 8 and row.sizes[0] == 64 * MIB
    # NCCL's default on 2 hosts is its tree: g0 GPUs drive g0 of the 8 NICs, and the bus
    # bandwidth is above what a ring over them carries.
    assert row.flagged and row.passed
    assert f"{g0} NIC(s) x 400 Gbit/s" in row.flags[0]


TEN = [f"xxrjun-cluster01-h100-10x{g}" for g in (1, 2, 4, 8)]


@pytest.mark.parametrize("name", TEN)
def test_the_ten_server_series_parses_whole_and_its_rows_agree(name):
    """10 servers of H100 run with 1, 2, 4, 8 GPUs each (float64, 32 MiB .. 16 GiB), collected
    after the model was fixed: the bench reports its projections, held out, never its exit."""
    path = SCALES / f"{name}.txt"
    g = int(name.rsplit("x", 1)[1])
    (run,) = parse_file(path)
    assert run.collective == "all_reduce" and run.complete
    assert (run.world_size, len(run.hosts), run.gpus_per_host) == (10 * g, 10, g)
    rows = rows_agree(path, run)
    assert rows[0][0] == 32 * MIB and rows[-1][0] == 16 * 2**30
    assert [r[1] for r in BENCHED.MORE_ROWS if r[0] == name] == (
        [f"xxrjun-cluster01-h100-10x{2 * g}"] if g < 8 else [])
