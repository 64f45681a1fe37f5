"""The history gate on synthetic results documents: series, splits, change points, verdicts,
the CLI, the CI outputs and the plots. No training."""

from __future__ import annotations

import datetime
import json
from pathlib import Path

import numpy as np
import pytest
from click.testing import CliRunner

from netsim_ddp.cli import main
from netsim_ddp.measure.document import (
    SCHEMA_VERSION,
    ResultsDocument,
    load_document,
    parse_document,
    save,
)
from netsim_ddp.measure.machine import CpuInfo, MachineInfo
from netsim_ddp.report.ci import bencher_metrics, github_benchmark, history_summary, run_summary
from netsim_ddp.verdicts.acceptance import ACCEPTED_FILE
from netsim_ddp.verdicts.changepoint import runs_to_reach, segment, smallest_p_value
from netsim_ddp.verdicts.gate import Metric
from netsim_ddp.verdicts.history import (
    HistoryError,
    judge_history,
    load_runs,
    parse_metrics,
)

HOST = MachineInfo(node="ci-1", machine="x86_64", cpu=CpuInfo(brand_raw="AMD EPYC", count=2),
                   torch_version="2.13.0")
START = datetime.datetime(2026, 12, 1, tzinfo=datetime.UTC)


def _summary(values: list[float]) -> dict:
    return {"n": len(values), "median": float(np.median(values))}


def make_document(level: float, number: int, *, seed: int = 0, scenario: str = "default",
                  digest: str = "d1", host: MachineInfo | None = HOST, comm_share: float = 0.75,
                  wire: float = 140e6, status: str = "passed",
                  trained: tuple[str, ...] = ("fp32", "amp-fp16"),
                  backend: str | None = None) -> ResultsDocument:
    """One run of `scenario`: fp32 at `level` seconds per iteration (20 iterations, 1% noise),
    amp-fp16 at half the comm."""
    rng = np.random.default_rng(seed * 1000 + number)
    modes = {}
    for mode, comm_factor in (("fp32", 1.0), ("amp-fp16", 0.5)):
        if mode not in trained:
            continue
        compute = [level * (1 - comm_share) * (1 + 0.01 * rng.standard_normal())
                   for _ in range(20)]
        comm = [level * comm_share * comm_factor * (1 + 0.01 * rng.standard_normal())
                for _ in range(20)]
        iteration = [c + m for c, m in zip(compute, comm, strict=True)]
        modes[mode] = {"iteration_s": iteration, "comm_s": comm, "compute_s": compute,
                       "summary": {"iteration_s": _summary(iteration), "comm_s": _summary(comm),
                                   "compute_s": _summary(compute)},
                       "scaling_efficiency": float(np.median(compute) / np.median(iteration)),
                       "wire_bytes_per_iteration": wire * comm_factor}
    data = {"version": SCHEMA_VERSION, "netsim_ddp": "0.1.0",
            "created_at": (START + datetime.timedelta(hours=number)).isoformat(),
            "machine_info": host.dump() if host else None,
            "scenarios": [{"name": scenario, "status": status, "modes": modes,
                           "checks": [{"name": "fidelity", "passed": True, "detail": "ok"}],
                           "scenario_digest": digest}]}
    if backend is not None:
        data["scenarios"][0]["placement"] = {"requested": "auto", "backend": backend}
    if host is None:
        del data["machine_info"]
    return parse_document(data)


def write_history(folder: Path, levels: list[float], **kwargs) -> list[Path]:
    paths = []
    for number, level in enumerate(levels, start=1):
        paths.append(save(make_document(level, number, **kwargs), folder / f"r{number:02d}.json"))
    return paths


def judged(folder: Path, levels: list[float], metrics=("iteration_s.median",), **kwargs):
    runs, _ = load_runs(write_history(folder, levels, **kwargs))
    chosen, tolerances = parse_metrics(list(metrics), [])
    return judge_history(runs, chosen, tolerances)


# -- change points -------------------------------------------------------------------------------

def test_a_step_is_found_where_it_is_with_its_size_and_significance():
    rng = np.random.default_rng(3)
    values = np.r_[rng.normal(1.0, 0.01, 12), rng.normal(1.1, 0.01, 8)]
    found = segment(values)
    assert [point.index for point in found.change_points] == [12]
    point = found.change_points[0]
    assert point.change == pytest.approx(0.10, abs=0.02) and point.p_value <= 0.01
    assert found.bounds == [(0, 12), (12, 20)]


def test_noise_alone_has_no_change_point_and_the_answer_is_seeded():
    values = np.random.default_rng(4).normal(1.0, 0.01, 20)
    assert segment(values).change_points == ()
    assert segment(values) == segment(values)


def test_a_constant_series_and_a_short_one_have_no_change_point():
    assert segment([5.0] * 10).change_points == ()
    assert segment([1.0, 1.0, 1.2]).change_points == ()  # no two segments of two runs


def test_a_series_with_nan_is_refused():
    with pytest.raises(ValueError, match="NaN"):
        segment([1.0, float("nan"), 1.0, 1.0])


# -- verdicts ------------------------------------------------------------------------------------

def test_unchanged_runs_pass(tmp_path):
    report = judged(tmp_path, [0.7] * 8, metrics=())
    assert report.passed and len(report.verdicts) == len(report.metrics) == 4 * 2  # x modes
    assert all(v.passed for v in report.verdicts)
    assert {str(h.metric) for h in report.metrics} == {
        "iteration_s.median", "comm_s.median", "scaling_efficiency.median",
        "wire_bytes_per_iteration"}


def test_the_first_slower_run_is_flagged_against_the_level_before_it(tmp_path):
    report = judged(tmp_path, [0.7, 0.7, 0.7, 0.77])
    fp32 = next(h for h in report.metrics if h.key.mode == "fp32")
    assert not report.passed and fp32.verdict is not None and not fp32.verdict.passed
    assert fp32.verdict.name == "history:fp32:iteration_s.median"
    assert "REGRESSION" in fp32.verdict.detail and "best level (runs 1-3)" in fp32.verdict.detail
    assert fp32.reference == [0, 1, 2]


def test_an_untrusted_run_is_neither_judged_nor_a_reference(tmp_path):
    """A run whose host could not emulate the scenario measured the host: its slow numbers
    must not fail the gate, nor its fast ones move the reference."""
    paths = write_history(tmp_path, [0.7, 0.7, 0.7])
    paths.append(save(make_document(0.9, 4, status="untrusted"), tmp_path / "r04.json"))
    runs, _ = load_runs(paths)
    chosen, tolerances = parse_metrics(["iteration_s.median"], [])
    report = judge_history(runs, chosen, tolerances)
    assert report.passed
    assert any("run 4" in note and "untrusted" in note for note in report.notes)
    fp32 = next(h for h in report.metrics if h.key.mode == "fp32")
    assert len(fp32.values) == 3  # the untrusted run is not in the series


def test_a_regressed_run_before_the_newest_is_no_reference(tmp_path):
    report = judged(tmp_path, [0.70, 0.71, 0.69, 0.77, 0.77])  # runs 4, 5: one new level
    fp32 = next(h for h in report.metrics if h.key.mode == "fp32")
    assert fp32.segmentation.change_points == ()  # two runs: too few to be sure of a change
    assert fp32.verdict is not None and not fp32.verdict.passed
    assert fp32.reference == [0, 1, 2]  # run 4 was a regression itself when newest
    assert fp32.regressed == [3]


def write_step(folder: Path, before: int, after: int) -> list[Path]:
    """`before` runs on one level, then `after` runs 10% worse: iteration time and wire bytes
    (byte counts that agree to 0.01 MB within a level, as real runs' do)."""
    return [save(make_document(0.7 if n <= before else 0.77, n, trained=("fp32",),
                               wire=(140.70e6 if n <= before else 154.76e6) + 1e4 * (n % 2)),
                 folder / f"r{n:02d}.json") for n in range(1, before + after + 1)]


STEP_METRICS = ("iteration_s.median", "wire_bytes_per_iteration")


@pytest.mark.parametrize("worse", [3, 5, 10])
def test_a_regression_fails_at_every_length_until_it_is_accepted(tmp_path, worse):
    """The reference never takes in runs that were regressions when they were the newest,
    however many follow; only a recorded acceptance ends the regression."""
    paths = write_step(tmp_path, 3, worse)
    chosen, tolerances = parse_metrics(list(STEP_METRICS), [])
    for length in range(4, 4 + worse):
        report = judge_history(load_runs(paths[:length])[0], chosen, tolerances)
        assert not report.passed, f"{length} runs passed"
        for history in report.metrics:
            assert history.verdict is not None and not history.verdict.passed, (
                length, history.metric, history.verdict.detail)
            assert history.reference == [0, 1, 2]  # one level: its spread is the runs' own
            assert history.regressed == list(range(3, length - 1))
    accepted = CliRunner().invoke(main, ["history", str(tmp_path), "--accept", str(3 + worse),
                                         *(a for m in STEP_METRICS for a in ("--metric", m))])
    assert accepted.exit_code == 0, accepted.output
    assert "accepted" in accepted.output and (tmp_path / ACCEPTED_FILE).is_file()
    # The next run on the accepted level passes against it; one worse again fails against it.
    again = judged_after(tmp_path, paths, 0.77, 154.76e6)
    assert again.passed
    level = [h.reference for h in again.metrics]
    assert level == [list(range(3, 3 + worse))] * 2  # the accepted runs are the reference
    worse_again = judged_after(tmp_path, paths, 0.85, 170e6)
    assert not worse_again.passed


def judged_after(folder: Path, paths: list[Path], level: float, wire: float):
    number = len(paths) + 1
    extra = save(make_document(level, number, trained=("fp32",), wire=wire),
                 folder / "next" / f"r{number:02d}.json")
    runs, _ = load_runs([*paths, extra])
    chosen, tolerances = parse_metrics(list(STEP_METRICS), [])
    return judge_history(runs, chosen, tolerances)


def test_a_reported_change_point_bounds_the_reference(tmp_path):
    report = judge_history(load_runs(write_step(tmp_path, 3, 10))[0],
                           *parse_metrics(list(STEP_METRICS), []))
    for history in report.metrics:
        assert [p.index for p in history.segmentation.change_points] == [3]
        assert history.reference == [0, 1, 2]  # never the new level of its own step


def test_a_series_too_short_for_a_significant_change_point_says_so(tmp_path):
    report = judge_history(load_runs(write_step(tmp_path, 3, 3))[0],
                           *parse_metrics(list(STEP_METRICS), []))
    assert not report.passed
    assert all(not h.segmentation.change_points for h in report.metrics)
    (note,) = [n for n in report.notes if "too few for a change point" in n]
    assert "6 runs" in note and "is 0.100" in note and "from 8 runs on" in note
    longer = judge_history(load_runs(write_step(tmp_path, 3, 10))[0],
                           *parse_metrics(list(STEP_METRICS), []))
    assert not any("too few for a change point" in n for n in longer.notes)


def test_the_smallest_attainable_p_of_the_permutation_test():
    assert smallest_p_value(3) == 1.0  # no two segments of two runs
    assert smallest_p_value(6) == pytest.approx(0.1)  # 2 of C(6, 3) = 20 placements
    assert smallest_p_value(8) == pytest.approx(2 / 70)
    assert smallest_p_value(40) == pytest.approx(1 / 200)  # the shuffles' resolution
    assert runs_to_reach(0.05) == 8
    # A clean step at 6 runs is as good as its mirror: p is about 0.1, never significant.
    found = segment([1.0, 1.0, 1.0, 1.1, 1.1, 1.1], alpha=0.2)
    assert found.change_points and found.change_points[0].p_value > 0.05


def test_accept_names_a_run_and_a_broken_marker_names_its_line(tmp_path):
    write_step(tmp_path, 3, 1)
    runner = CliRunner()
    missing = runner.invoke(main, ["history", str(tmp_path), "--accept", "9"])
    assert missing.exit_code == 2 and "--accept 9: no such run" in missing.output
    by_file = runner.invoke(main, ["history", str(tmp_path), "--accept", "r04.json",
                                   "--metric", "wire_bytes_per_iteration"])
    assert by_file.exit_code == 0, by_file.output
    assert '"run": "r04.json"' in (tmp_path / ACCEPTED_FILE).read_text()
    (tmp_path / ACCEPTED_FILE).write_text("not json\n")
    broken = runner.invoke(main, ["history", str(tmp_path)])
    assert broken.exit_code == 2 and f"{ACCEPTED_FILE}, line 1" in broken.output


def test_too_few_runs_on_the_best_level_are_not_judged_yet(tmp_path):
    report = judged(tmp_path, [0.70, 0.70, 0.80])
    fp32 = next(h for h in report.metrics if h.key.mode == "fp32")
    assert report.passed and fp32.verdict is not None
    assert "not judged yet" in fp32.verdict.detail and "has 2 run(s)" in fp32.verdict.detail


def test_a_run_within_the_runs_own_spread_is_no_regression(tmp_path):
    report = judged(tmp_path, [0.70, 0.75, 0.66, 0.70, 0.76])  # runs move +-5% here
    fp32 = next(h for h in report.metrics if h.key.mode == "fp32")
    assert fp32.verdict is not None and fp32.verdict.passed
    assert "+8" in fp32.verdict.detail  # over the tolerance ...
    assert "could be one noisy run" in fp32.verdict.detail  # ... but not beyond the spread


def test_a_creep_of_small_steps_adds_up_against_the_best_level(tmp_path):
    levels = [0.70] * 4 + [0.72] * 4 + [0.74] * 4 + [0.76]  # +2.9% steps, +8.6% in all
    report = judged(tmp_path, levels)
    fp32 = next(h for h in report.metrics if h.key.mode == "fp32")
    assert fp32.verdict is not None and not fp32.verdict.passed
    assert fp32.reference is not None and fp32.reference[0] == 0  # the first, best level
    assert fp32.segmentation.change_points  # the steps are seen as change points


def test_a_faster_run_is_no_regression_and_a_change_point_is_reported(tmp_path):
    report = judged(tmp_path, [0.7] * 6 + [0.6] * 4)
    fp32 = next(h for h in report.metrics if h.key.mode == "fp32")
    assert report.passed
    assert [p.index for p in fp32.segmentation.change_points] == [6]
    assert fp32.segmentation.change_points[0].change < -0.1


def test_lower_scaling_efficiency_is_the_regression(tmp_path):
    report = judged(tmp_path, [0.7, 0.7, 0.7, 0.7], metrics=["scaling_efficiency.median"],
                    comm_share=0.75)
    assert report.passed
    runs, _ = load_runs([*sorted(tmp_path.glob("*.json")),
                         save(make_document(0.9, 5, comm_share=0.85), tmp_path / "r05.json")])
    report = judge_history(runs, [Metric.parse("scaling_efficiency.median")],
                           {Metric.parse("scaling_efficiency.median"): 0.05})
    assert not report.passed


def test_a_tolerance_names_its_metric_and_the_others_keep_the_default():
    metrics, tolerances = parse_metrics([], ["comm_s.p95:15%", "median:8%"])
    assert tolerances[Metric.parse("comm_s.p95")] == 0.15
    assert tolerances[Metric.parse("iteration_s.median")] == 0.08
    assert tolerances[Metric.parse("wire_bytes_per_iteration")] == 0.05
    assert Metric.parse("comm_s.p95") in metrics
    assert parse_metrics(["p95"], [])[0] == [Metric.parse("iteration_s.p95")]  # as tolerances
    with pytest.raises(HistoryError, match="METRIC:PERCENT"):
        parse_metrics([], ["median"])
    with pytest.raises(HistoryError, match="unknown metric"):
        parse_metrics(["speed"], [])


# -- series are never mixed silently ---------------------------------------------------------------

def test_a_changed_scenario_splits_the_series_and_only_the_newest_gates(tmp_path):
    old = write_history(tmp_path, [0.5, 0.5, 0.5], digest="old")
    new = [save(make_document(0.7, n, digest="new"), tmp_path / f"n{n}.json")
           for n in (4, 5, 6)]
    runs, _ = load_runs([*old, *new])
    report = judge_history(runs, [Metric.parse("iteration_s.median")], {})
    assert report.passed  # 0.7 is not judged against the other scenario's 0.5
    assert any("split into 2 series" in note and "scenario changed" in note
               for note in report.notes)
    assert {h.key.digest for h in report.metrics if h.gating} == {"new"}


def test_another_kind_of_host_splits_the_series_but_a_new_hostname_does_not(tmp_path):
    renamed = HOST.model_copy(update={"node": "ci-2"})
    other = HOST.model_copy(update={"cpu": CpuInfo(brand_raw="Intel Xeon", count=2)})
    paths = [save(make_document(0.7, n, host=host), tmp_path / f"r{n}.json")
             for n, host in ((1, HOST), (2, renamed), (3, HOST), (4, other))]
    report = judge_history(load_runs(paths)[0], [Metric.parse("iteration_s.median")], {})
    hosts = {h.key.host for h in report.metrics}
    assert len(hosts) == 2 and any("different kinds of host" in n for n in report.notes)
    gating = [h for h in report.metrics if h.gating]  # one metric, two modes: two series
    assert sorted(h.key.mode for h in gating) == ["amp-fp16", "fp32"]
    assert all(len(h.values) == 1 and "Intel Xeon" in h.key.host for h in gating)


def test_gloo_and_nccl_runs_are_separate_series_and_the_split_says_why(tmp_path):
    """'auto' is gloo on a CPU runner and NCCL on a GPU one: never one series. Runs written
    before the placement was recorded were gloo."""
    paths = [save(make_document(level, n, backend=backend), tmp_path / f"r{n}.json")
             for n, level, backend in ((1, 0.7, None), (2, 0.7, "gloo"), (3, 0.7, "gloo"),
                                       (4, 0.2, "nccl"))]
    report = judge_history(load_runs(paths)[0], [Metric.parse("iteration_s.median")], {})
    assert report.passed  # NCCL's 0.2 s is not judged against gloo's 0.7 s
    assert any("ran on different backends (gloo, nccl)" in note for note in report.notes)
    assert "different kinds of host" not in " ".join(report.notes)
    gating = [h for h in report.metrics if h.gating]
    assert gating and all(len(h.values) == 1 and h.key.host.endswith("nccl") for h in gating)
    assert {len(h.values) for h in report.metrics if not h.gating} == {3}


def test_runs_are_ordered_by_their_recorded_time_and_undated_ones_as_given(tmp_path):
    late = save(make_document(0.7, 9), tmp_path / "a.json")
    early = save(make_document(0.7, 1), tmp_path / "b.json")
    runs, notes = load_runs([late, early])
    assert [run.source for run in runs] == [str(early), str(late)] and not notes
    legacy = tmp_path / "legacy.json"
    data = json.loads(late.read_text())
    for key in ("version", "created_at", "machine_info"):
        data.pop(key)
    legacy.write_text(json.dumps(data))
    runs, notes = load_runs([late, legacy, early])
    assert [run.source for run in runs] == [str(late), str(legacy), str(early)]
    assert "in the order given" in notes[0]


def test_a_run_without_measurements_is_skipped_and_said(tmp_path):
    paths = write_history(tmp_path, [0.7, 0.7])
    broken = make_document(0.7, 3).model_copy()
    broken.scenarios[0].modes = {}
    broken.scenarios[0].status = "error"
    runs, _ = load_runs([*paths, save(broken, tmp_path / "r03.json")])
    report = judge_history(runs, [Metric.parse("iteration_s.median")], {})
    assert any("run 3" in note and "error" in note for note in report.notes)
    assert [len(h.values) for h in report.metrics] == [2, 2]  # fp32 and amp-fp16, 2 runs each


def test_an_unreadable_file_or_another_json_names_itself(tmp_path):
    bad = tmp_path / "bad.json"
    bad.write_text("{")
    with pytest.raises(HistoryError, match="bad.json"):
        load_runs([bad])
    other = tmp_path / "package.json"
    other.write_text('{"name": "x"}')
    with pytest.raises(HistoryError, match="package.json: not a netsim-ddp results document"):
        load_runs([other])


# -- the command -----------------------------------------------------------------------------------

def test_history_command_exits_1_on_a_regression_and_writes_json_and_summary(
        tmp_path, monkeypatch):
    folder = tmp_path / "history"
    folder.mkdir()
    write_history(folder, [0.7, 0.7, 0.7, 0.77])
    summary = tmp_path / "summary.md"
    monkeypatch.setenv("GITHUB_STEP_SUMMARY", str(summary))
    result = CliRunner().invoke(main, ["history", str(folder), "--metric", "iteration_s.median",
                                       "--metric", "wire_bytes_per_iteration",
                                       "--json", str(tmp_path / "h.json")])
    assert result.exit_code == 1, result.output
    assert "FAILED" in result.output and "REGRESSION" in result.output
    assert "--accept 4` records that" in result.output  # what ends a regression
    data = json.loads((tmp_path / "h.json").read_text())
    assert data["passed"] is False and data["series"][0]["reference_runs"] == [1, 2, 3]
    markdown = summary.read_text()
    assert markdown.index("REGRESSION") < markdown.index("| pass |")  # failing first


def test_history_command_passes_unchanged_runs_and_refuses_bad_options(tmp_path):
    paths = [str(p) for p in write_history(tmp_path, [0.7] * 5)]
    runner = CliRunner()
    assert runner.invoke(main, ["history", *paths, "--metric", "comm_s.median"]).exit_code == 0
    bad = runner.invoke(main, ["history", *paths, "--tolerance", "speed:5%"])
    assert bad.exit_code == 2 and "unknown metric" in bad.output


# -- CI outputs ------------------------------------------------------------------------------------

def test_run_summary_puts_failing_checks_first(tmp_path):
    document = make_document(0.7, 1)
    document.scenarios[0].checks.append(
        document.scenarios[0].checks[0].model_copy(update={"name": "wire", "passed": False,
                                                           "detail": "1.0 | 0.5"}))
    markdown = run_summary(document)
    assert markdown.index("### Failing") < markdown.index("| scenario | status | mode")
    assert "1.0 \\| 0.5" in markdown and "1 of 2 checks passed" in markdown


def test_history_summary_lists_change_points(tmp_path):
    report = judged(tmp_path, [0.7] * 5 + [0.8] * 5)
    markdown = history_summary(report)
    assert "### Change points" in markdown and "at run 6" in markdown


def test_github_action_benchmark_and_bencher_exports(tmp_path):
    document = make_document(0.7, 1)
    smaller = github_benchmark(document)
    names = {entry["name"] for entry in smaller}
    assert "default[fp32] iteration_s.median" in names
    assert not any("scaling_efficiency" in name for name in names)
    entry = next(e for e in smaller if e["name"] == "default[fp32] iteration_s.median")
    assert entry["unit"] == "ms" and 650 < entry["value"] < 750 and ".." in entry["range"]
    bigger = github_benchmark(document, bigger_is_better=True)
    assert [e["name"] for e in bigger] == ["default[fp32] scaling_efficiency.median",
                                           "default[amp-fp16] scaling_efficiency.median"]
    bmf = bencher_metrics(document)
    measure = bmf["default[fp32]"]["iteration_s-median-ms"]
    assert measure["lower_value"] <= measure["value"] <= measure["upper_value"]
    path = save(document, tmp_path / "r.json")
    out = CliRunner().invoke(main, ["export", str(path), "--format", "bencher"])
    assert out.exit_code == 0 and json.loads(out.output) == json.loads(json.dumps(bmf))


def test_report_and_history_out_plot_the_history(tmp_path):
    paths = write_history(tmp_path, [0.7, 0.7, 0.7, 0.77], trained=("fp32",))
    out = tmp_path / "report"
    result = CliRunner().invoke(main, ["report", str(paths[-1]), "--out", str(out),
                                       "--history", str(paths[0]), "--history", str(paths[1]),
                                       "--history", str(paths[2])])
    assert result.exit_code == 0, result.output
    text = (out / "report.md").read_text()
    assert "History of 4 runs" in text and "FAILED history:fp32:iteration_s.median" in text
    assert (out / "history-default-fp32-iteration-s-median.png").stat().st_size > 1000
    assert load_document(paths[-1]).scenarios[0].name == "default"
    plotted = CliRunner().invoke(main, ["history", *map(str, paths), "--metric", "comm_s",
                                        "--out", str(tmp_path / "plots")])
    assert plotted.exit_code == 1
    assert [p.name for p in (tmp_path / "plots").glob("*.png")] == [
        "history-default-fp32-comm-s-median.png"]
    assert "FAILED history:fp32:comm_s.median" in (tmp_path / "plots" / "history.md").read_text()
