"""The calibrated curve (NCCL-shaped regimes): it predicts sizes it did not see from 1 MiB up,
NCCL's protocol switch included, extrapolates with its top regime's line, and refuses too
little."""

import json
from pathlib import Path

import numpy as np
import pytest

from netsim_ddp.projection.calibrate import (
    MIB,
    Calibration,
    CalibrationError,
    Curve,
    alpha_beta_line,
    load,
    load_allreduce,
)

ROOT = Path(__file__).resolve().parents[2]
A3MEGA = ROOT / "tests" / "unit" / "nccl-tests" / "a3mega-2x8-h100.txt"
# The shipped network calibrations (2+ hosts); gloo-1node-2ranks.txt is one server's.
SHIPPED = sorted((ROOT / "scenarios" / "calibrations").glob("gloo-*nodes-*.txt"))


def big(calibration: Calibration) -> list[dict]:
    return [row for row in calibration.table() if row["size"] >= MIB]


# Where the emulated shaper changes its own "protocol" (tbf's burst stops carrying the message at
# 1 MiB on the 2-node gloo run): no switch NCCL makes, so the regimes' faster-line rule does not
# place it; held out it is missed by 10.2%, held to 15% here.
SHAPER_STEPS = {"gloo-2nodes-1gbit.txt": {MIB}}


def held_out_errors(path: Path, calibration: Calibration) -> dict[int, float]:
    """Each size from 1 MiB up, predicted by the curve fitted on all the other sizes (the
    curve's own error is 0 by construction: it passes through the measured points), but for
    a shaper step, held to 15%."""
    errors = {row["size"]: row["held_out_error"] for row in big(calibration)}
    assert None not in errors.values(), errors
    for step in SHAPER_STEPS.get(path.name, ()):
        assert abs(errors.pop(step)) <= 0.15
    return errors


@pytest.mark.parametrize("path", [A3MEGA, *SHIPPED], ids=lambda p: p.name)
def test_the_curve_predicts_every_size_from_1mib_up_it_did_not_see(path):
    (calibration,) = load([path])
    errors = held_out_errors(path, calibration)
    assert len(errors) >= 6
    assert max(abs(e) for e in errors.values()) <= 0.10, errors


def test_a_single_alpha_beta_line_cannot_and_the_curve_can():
    (calibration,) = load([A3MEGA])
    sizes, times = calibration.curve.sizes, calibration.curve.measured_s
    alpha, bandwidth = alpha_beta_line(sizes, times)
    line_errors = np.abs(alpha + sizes / bandwidth - times) / times
    assert line_errors.max() > 0.5  # the middle of the range: several times off
    document = calibration.as_dict()
    assert document["alpha_beta_line"]["max_abs_error"] == line_errors.max()
    # The curve, on sizes it did not see, NCCL's switch between 16 and 32 MiB included (an
    # interpolant through the other sizes missed 16 MiB by 15.9%): within 10%.
    held = document["max_abs_held_out_error_from_1MiB"]
    assert held == max(abs(row["held_out_error"]) for row in big(calibration))
    assert held <= 0.10 and line_errors.max() > 5 * held


def test_held_out_sizes_of_a_real_run():
    # Fit on every other size of the H100 run, predict the others. NCCL switches protocol
    # between 16 and 32 MiB (16 MiB takes 952 us, 32 MiB 1054): the regimes on either side
    # meet there, and the faster one (NCCL's rule) places 16 MiB within 10% like the rest.
    (calibration,) = load([A3MEGA])
    sizes, times = calibration.curve.sizes, calibration.curve.measured_s
    curve = Curve(sizes[::2], times[::2])
    errors = {int(s): curve(s) / t - 1 for s, t in zip(sizes[1::2], times[1::2], strict=True)
              if s >= MIB}
    assert 16 * MIB in errors
    assert max(abs(e) for e in errors.values()) <= 0.10, errors
    # The switch is a regime boundary: one regime below 16 MiB, another from 32 MiB up.
    starts = [int(curve.sizes[r.first]) for r in curve.regimes]
    assert any(MIB < start <= 32 * MIB for start in starts), starts


@pytest.mark.parametrize("path", SHIPPED, ids=lambda p: p.name)
def test_held_out_sizes_of_the_shipped_examples(path):
    # Made here from gloo all-reduces in the emulated fabric (bench/nccltests_gloo.py). Each
    # size from 1 MiB up, predicted by the curve fitted on all the others, within 10% (but for
    # the shaper's step, SHAPER_STEPS); and the sizes from 2 MiB up with every other size left
    # out.
    calibration = load_allreduce(path)
    assert calibration.hosts == calibration.world_size >= 2
    held = list(held_out_errors(path, calibration).values())
    assert len(held) >= 6 and max(abs(e) for e in held) <= 0.10, held
    sizes, times = calibration.curve.sizes, calibration.curve.measured_s
    curve = Curve(sizes[::2], times[::2])
    errors = [curve(s) / t - 1 for s, t in zip(sizes[1::2], times[1::2], strict=True)
              if s >= 2 * MIB]
    assert errors and max(abs(e) for e in errors) <= 0.10, errors


def test_tail_floor_and_monotone():
    (calibration,) = load([A3MEGA])
    curve = calibration.curve
    top, t_top = curve.sizes[-1], curve.smoothed_s[-1]
    # Above the largest size: the top regime's line (~180 GB/s).
    assert curve(2 * top) == pytest.approx(t_top + top / curve.tail_bytes_per_s)
    assert 170e9 < curve.tail_bytes_per_s < 200e9
    # Below the smallest: the bottom regime's line, here the latency floor; inside: never
    # decreasing with size, although the measurement dips (1 KiB in-place 123.1 us after
    # 512 B 123.4 us).
    assert curve(1) == pytest.approx(curve(curve.sizes[0]), rel=1e-3)
    assert curve(1) <= curve(curve.sizes[0])
    grid = np.geomspace(8, 16 * 2**30, 400)
    assert np.all(np.diff(curve.time_s(grid)) >= -1e-12)


def test_too_few_sizes_is_refused_in_one_line(tmp_path):
    text = A3MEGA.read_text().splitlines()
    short = [line for line in text if not line.strip()[:1].isdigit()]
    rows = [line for line in text if line.strip()[:1].isdigit()][:2]
    path = tmp_path / "two.txt"
    path.write_text("\n".join(short[:-2] + rows + short[-2:]) + "\n")
    with pytest.raises(CalibrationError, match=r"two.txt:\d+: 2 sizes measured: a curve needs 3"):
        load([path])


def test_three_sizes_fit_but_hold_nothing_out(tmp_path):
    text = A3MEGA.read_text().splitlines()
    keep = [line for line in text if not line.strip()[:1].isdigit()]
    rows = [line for line in text if line.strip()[:1].isdigit()][-3:]
    path = tmp_path / "three.txt"
    path.write_text("\n".join(keep[:-2] + rows + keep[-2:]) + "\n")
    (calibration,) = load([path])
    document = calibration.as_dict()
    assert [row["held_out_error"] for row in document["sizes"]] == [None] * 3
    assert document["max_abs_held_out_error_from_1MiB"] is None
    assert json.loads(json.dumps(document))["sizes"][0]["error"] == pytest.approx(0, abs=1e-9)


FIXTURES = sorted((ROOT / "tests" / "unit" / "nccl-tests").glob("*.txt"))
ALL_FILES = [*FIXTURES, *sorted((ROOT / "scenarios" / "calibrations").glob("*.txt"))]


def test_every_network_run_that_calibrates_predicts_its_sizes_from_1mib_up():
    # The done-when of issue 14, over every fixture and shipped file, every collective in it,
    # on sizes held out (the curve's own error is 0 by construction), but for a shaper step.
    # Files that are not whole runs are refused in one line (test_calibrate_parse); those with
    # no size of 1 MiB or more make no claim here; nor do one-server runs: two gloo ranks on
    # loopback are bound by a shared CPU, not a link, and a size left out is missed by 15-62%
    # (README, Calibrating).
    from netsim_ddp.projection.nccl_tests import NcclParseError

    checked, one_server = [], []
    for path in ALL_FILES:
        try:
            found = load([path])
        except (NcclParseError, CalibrationError):
            continue
        for calibration in found:
            if not big(calibration):
                continue
            if calibration.hosts == 1:
                one_server.append((path.name, calibration.collective))
                continue
            errors = held_out_errors(path, calibration)
            worst = max(abs(e) for e in errors.values())
            assert worst <= 0.10, (path.name, calibration.collective, errors)
            checked.append((path.name, calibration.collective))
    assert ("a3mega-2x8-h100.txt", "all_reduce") in checked
    assert len(checked) >= 3
    assert ("gloo-1node-2ranks.txt", "reduce_scatter") in one_server
