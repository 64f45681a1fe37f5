"""Reading nccl-tests output as people paste it: real pastes (tests/unit/nccl-tests/, sources in
its README), the wrappers pasting adds, nccl-tests' JSON, and one clear line for what is not a
whole run."""

import json
from pathlib import Path

import numpy as np
import pytest
from click.testing import CliRunner

from netsim_ddp.cli import main
from netsim_ddp.projection.nccl_tests import NcclParseError, parse_file, parse_json, parse_text

PASTED = Path(__file__).parent / "nccl-tests"
A3MEGA = PASTED / "a3mega-2x8-h100.txt"


def test_a_whole_real_run_two_hosts_of_eight():
    (run,) = parse_file(A3MEGA)
    assert run.collective == "all_reduce"  # from the `all_reduce_perf` command line
    assert run.world_size == 16 and run.hosts == ["ztan-mig-235z", "ztan-mig-gq73"]
    assert run.gpus_per_host == 8 and run.complete
    assert [r.size for r in run.rows] == [8 * 2**i for i in range(31)]  # 8 B .. 8 GiB
    last = run.rows[-1]
    assert (last.out_of_place_us, last.in_place_us) == (47535, 47743)
    assert last.time_s == pytest.approx(47743e-6)  # in place, as DDP all-reduces
    assert last.busbw_gbs == pytest.approx(337.35)


@pytest.mark.parametrize(("name", "world", "hosts", "sizes"), [
    ("v2.20-two-hosts.txt", 2, 2, 4),  # nccl-tests 2.20: `Collective test starting` names it
    ("old-format-error-column.txt", 4, 1, 4),  # no root, `error` column, starts at `Using devices`
])
def test_other_real_formats(name, world, hosts, sizes):
    (run,) = parse_file(PASTED / name)
    assert run.collective == "all_reduce"
    assert (run.world_size, len(run.hosts), len(run.rows)) == (world, hosts, sizes)


@pytest.mark.parametrize(("name", "says"), [
    ("separate-jobs.txt", "ran as separate jobs"),
    ("mpi-tagged-no-ranks.txt", "a result row before the header"),
    ("interleaved-rows-tagged.txt", "a result row before the header"),
    ("ncclinfo-mixed-old.txt", "no result rows"),
    ("markdown-ate-hashes.txt", "no result rows"),
])
def test_partial_real_pastes_get_one_clear_line(name, says):
    with pytest.raises(NcclParseError) as caught:
        parse_file(PASTED / name)
    message = str(caught.value)
    assert says in message and "\n" not in message and name in message


def test_the_wrappers_pasting_adds_change_nothing():
    reference = parse_file(A3MEGA)[0]
    text = A3MEGA.read_text()
    lines = text.splitlines()
    variants = {
        "open mpi --tag-output": "\n".join(f"[1,0]<stdout>:{line}" for line in lines),
        "srun --label": "\n".join(f"0: {line}" for line in lines),
        "markdown quote": "\n".join(f"> {line}" for line in lines),
        "windows line ends": "\r\n".join(lines),
        "nccl info between rows": "\n".join(
            f"{line}\nztan-mig-235z:6899:6950 [0] NCCL INFO Channel 00/0 : 0[0] -> 1[1] via P2P"
            for line in lines),
        "rank tags mid-row": "\n".join(
            line.replace("     -1 ", "     -1[0] ") for line in lines),
    }
    for what, variant in variants.items():
        (run,) = parse_text(variant, what)
        assert run.rows == reference.rows, what
        assert run.ranks == reference.ranks, what


def test_nccl_tests_json_reads_like_the_text():
    # The shape nccl-tests 2.19+ writes with -J (src/util.cu): config.devices, results.
    text_run = parse_file(A3MEGA)[0]
    document = {
        "version": 1, "args": ["/opt/src/nccl-tests/build/all_reduce_perf", "-b", "8"],
        "config": {"nthreads": 1, "ngpus": 1, "devices": [
            {"rank": r.rank, "group": 0, "pid": 1, "hostname": r.host, "device": r.device,
             "device_hex": "0000:04:00", "device_info": r.device_name}
            for r in text_run.ranks]},
        "results": [{"size": row.size, "count": row.count, "type": "float", "redop": "sum",
                     "root": "    -1",
                     "out_of_place": {"time": row.out_of_place_us, "alg_bw": 0, "bus_bw": 0,
                                      "nwrong": 0},
                     "in_place": {"time": row.in_place_us, "alg_bw": 0,
                                  "bus_bw": row.busbw_gbs, "nwrong": 3 * (row.size == 8)}}
                    for row in text_run.rows],
        "average_bus_bandwidth": {"bandwidth": 70.7, "okay": "unchecked"},
    }
    (run,) = parse_json(json.loads(json.dumps(document)), "x.json")
    assert run.collective == "all_reduce" and run.world_size == 16
    assert [r.time_s for r in run.rows] == [r.time_s for r in text_run.rows]
    assert [r.wrong for r in run.rows][:2] == [3, 0]  # the in-place check's count
    with pytest.raises(NcclParseError, match="not nccl-tests JSON"):
        parse_json({"config": {}}, "bad.json")


def test_a_truncated_row_names_its_line():
    text = A3MEGA.read_text().replace("    47535  180.71  338.82      0    47743", "    475")
    with pytest.raises(NcclParseError, match=r":62: a result row with 9 fields"):
        parse_text(text, "cut.txt")


def test_which_collective_from_the_table_alone():
    # reduce_scatter and all_gather print the whole buffer: size = ranks x count x 4 bytes.
    header = ("# nThread 1 nGpus 2 minBytes 8 maxBytes 64 step: 2(factor)\n"
              "#  Rank  0 Group  0 Pid 1 on a device  0 [0x01] G\n"
              "#  Rank  1 Group  0 Pid 1 on a device  1 [0x02] G\n"
              "#       size         count      type   redop    root     time   algbw   busbw "
              "#wrong     time   algbw   busbw #wrong\n")
    row = "{size} {count} float {op} -1 10.0 0.0 0.0 0 10.0 0.0 0.0 0\n"
    for op, expected in (("sum", "reduce_scatter"), ("none", "all_gather")):
        text = header + "".join(row.format(size=s, count=s // 8, op=op) for s in (64, 128, 256))
        assert parse_text(text)[0].collective == expected
    odd = header + "".join(row.format(size=s, count=s // 4 + 1, op="sum") for s in (64, 128))
    with pytest.raises(NcclParseError, match="--collective"):
        parse_text(odd)


def test_cli_prints_per_size_and_writes_json(tmp_path):
    result = CliRunner().invoke(main, ["calibrate", str(A3MEGA), "--json", "-"])
    assert result.exit_code == 0, result.output
    document = json.loads(result.stdout)
    (calibration,) = document["calibrations"]
    assert calibration["world_size"] == 16 and len(calibration["sizes"]) == 31
    assert set(calibration["sizes"][0]) == {"size", "measured_s", "held_out_s",
                                            "held_out_error"}
    assert "held-out error" in result.stderr  # the table goes to stderr when stdout is JSON


def test_cli_bad_input_is_one_line_and_exit_2():
    result = CliRunner().invoke(main, ["calibrate", str(PASTED / "separate-jobs.txt")])
    assert result.exit_code == 2
    assert result.stderr.count("\n") == 1 and "separate jobs" in result.stderr
    missing = CliRunner().invoke(main, ["calibrate", "/nonexistent/file.txt"])
    assert missing.exit_code == 2 and "cannot read" in missing.stderr


def test_cli_names_the_collective_a_file_does_not(tmp_path):
    # A pasted table whose counts say neither all-reduce nor a sharded collective.
    text = A3MEGA.read_text().replace("> mpirun", "> launcher").replace(
        "/opt/src/nccl-tests/build/all_reduce_perf", "./bench")
    rows = [line for line in text.splitlines() if line.strip()[:1].isdigit()]
    for line in rows:
        size, count = line.split()[:2]
        text = text.replace(line, line.replace(f" {count} ", f" {int(count) + 1} ", 1))
    path = tmp_path / "unnamed.txt"
    path.write_text(text)
    refused = CliRunner().invoke(main, ["calibrate", str(path)])
    assert refused.exit_code == 2 and "--collective" in refused.stderr
    named = CliRunner().invoke(main, ["calibrate", str(path), "--collective", "all_reduce",
                                      "--json", "-"])
    assert named.exit_code == 0, named.output
    assert json.loads(named.stdout)["calibrations"][0]["collective"] == "all_reduce"


def test_runs_of_the_same_kind_merge(tmp_path):
    from netsim_ddp.projection.calibrate import load

    twice = tmp_path / "twice.txt"
    twice.write_text(A3MEGA.read_text() + A3MEGA.read_text().replace("    47743", "    49743"))
    (calibration,) = load([twice])
    assert len(calibration.sources) == 2 and calibration.world_size == 16
    assert calibration.curve.measured_s[-1] == pytest.approx((47743 + 49743) / 2 * 1e-6)


def test_a_row_whose_check_failed_is_left_out_of_the_calibration_and_named(tmp_path):
    from netsim_ddp.projection.calibrate import load

    # nccl-tests counts wrong values per time; the in-place one is the time DDP's is.
    text = A3MEGA.read_text().replace("99.06      0", "99.06     17")  # 64 MiB, in place
    broken = tmp_path / "broken.txt"
    broken.write_text(text)
    row = next(r for r in parse_file(broken)[0].rows if r.size == 2**26)
    assert (row.wrong, row.line) == (17, 55)
    (calibration,) = load([broken])
    assert 2**26 not in calibration.curve.sizes and 2**27 in calibration.curve.sizes
    assert calibration.dropped == [
        f"{broken}:55: 64MiB left out: #wrong 17 (nccl-tests' check failed: a broken "
        "all-reduce's time is not its cost; rerun to measure it)"]
    # A failed out-of-place check does not touch the in-place time a calibration uses.
    oop = tmp_path / "oop.txt"
    oop.write_text(A3MEGA.read_text().replace("99.74      0", "99.74      5"))
    assert load([oop])[0].dropped == [] and load([A3MEGA])[0].dropped == []
    result = CliRunner().invoke(main, ["calibrate", str(broken)])
    assert result.exit_code == 0 and "64MiB left out: #wrong 17" in result.output


def test_a_size_slower_than_a_larger_one_is_left_out_of_the_fit_and_named(tmp_path):
    from netsim_ddp.projection.calibrate import inverted, load

    times = np.array([10.0, 12.0, 40.0, 14.0, 30.0, 33.0])  # 40 > 1.25 x 14; 12 < 1.25 x 14
    assert inverted(times).tolist() == [False, False, True, False, False, False]
    # 2 MiB in place at 1780 us, 5x the 4 MiB time (356.6 us): a protocol's slow path.
    bumped = tmp_path / "bumped.txt"
    bumped.write_text(A3MEGA.read_text().replace("   252.9    8.29", "  1780.0    1.18"))
    (calibration,) = load([bumped])
    (left,) = calibration.left_out
    assert (left.size, left.time_s) == (2**21, pytest.approx(1780e-6))
    assert left.note.startswith(f"{bumped}:50: 2MiB left out of the fit: 1780 us, 5.0x the time "
                                "of 4MiB")
    assert 2**21 not in calibration.curve.sizes
    sizes, measured = calibration.measured_points()  # what a projection is compared with
    assert measured[list(sizes).index(2**21)] == pytest.approx(1780e-6)
    # Without it the fit follows the other sizes: 2 MiB between its neighbours' times.
    assert 170e-6 < calibration.curve(2**21) < 356.6e-6
    result = CliRunner().invoke(main, ["calibrate", str(bumped)])
    assert result.exit_code == 0 and "2MiB left out of the fit" in result.output
