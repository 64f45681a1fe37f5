"""CI's language: a Markdown summary for the job's page, and the results in the formats that
benchmark-tracking services read.

- `$GITHUB_STEP_SUMMARY`: GitHub Actions shows the Markdown appended to that file on the run's
  page. `run` and `history` append theirs when it is set: the table, the failing checks first,
  the change points.
- github-action-benchmark's `customSmallerIsBetter` / `customBiggerIsBetter` JSON (a list of
  {name, unit, value, range, extra}): the action keeps the history on a branch and comments on
  regressions.
- Bencher Metric Format (BMF): {benchmark: {measure: {value, lower_value, upper_value}}}, what
  `bencher run --adapter json` reads.
"""

from __future__ import annotations

import os
from pathlib import Path
from typing import TYPE_CHECKING, Any

from netsim_ddp.measure.document import ModeRecord, ResultsDocument
from netsim_ddp.scenario.expectations import HIGHER_IS_BETTER, NEEDS_COMPUTE
from netsim_ddp.verdicts.gate import Metric

if TYPE_CHECKING:  # the history brings ruptures (seconds to import): not for a run's summary
    from netsim_ddp.verdicts.changepoint import ChangePoint
    from netsim_ddp.verdicts.history import HistoryReport, MetricHistory

STEP_SUMMARY = "GITHUB_STEP_SUMMARY"
EXPORTED = ("iteration_s.median", "comm_s.median", "scaling_efficiency.median",
            "wire_bytes_per_iteration")


def append_step_summary(markdown: str) -> Path | None:
    """Append to the file GitHub Actions shows on the job's page, when there is one."""
    target = os.environ.get(STEP_SUMMARY)
    if not target:
        return None
    path = Path(target)
    with path.open("a", encoding="utf-8") as summary:
        summary.write(markdown.rstrip("\n") + "\n\n")
    return path


def _cell(text: object) -> str:
    return str(text).replace("|", "\\|").replace("\n", " ")


def run_summary(document: ResultsDocument) -> str:
    """The results of a run: failing checks first, then per scenario the modes' medians."""
    lines = ["## netsim-ddp results", ""]
    failing = [(scenario.name, check) for scenario in document.scenarios
               for check in scenario.checks if not check.passed and check.kind != "host"]
    broken = [scenario for scenario in document.scenarios if scenario.error]
    if failing or broken:
        lines += ["### Failing", "", "| scenario | check | detail |", "|---|---|---|"]
        lines += [f"| {_cell(s.name)} | {s.status} | {_cell(s.error)} |" for s in broken]
        lines += [f"| {_cell(name)} | {_cell(check.name)} | {_cell(check.detail)} |"
                  for name, check in failing]
        lines.append("")
    # Not a regression, and not a pass either: nothing was judged on this host.
    untrusted = [s for s in document.scenarios if s.status == "untrusted"]
    if untrusted:
        lines += ["### Untrusted on this host (nothing judged)", "", "| scenario | why |",
                  "|---|---|"]
        lines += [f"| {_cell(s.name)} | {_cell(s.untrusted or s.refused)} |" for s in untrusted]
        lines.append("")
    lines += ["| scenario | status | mode | iteration ms | comm ms | efficiency | wire MB/it |",
              "|---|---|---|---|---|---|---|"]
    for scenario in sorted(document.scenarios, key=lambda s: s.passed):
        for mode, record in scenario.modes.items():
            lines.append(f"| {_cell(scenario.name)} | {scenario.status} | {mode} | "
                         f"{record.summary.iteration_s.median * 1e3:.1f} | "
                         + (f"{record.summary.comm_s.median * 1e3:.1f} | "
                            if record.summary.comm_s else "- | ")
                         + (f"{record.scaling_efficiency:.2f} | "
                            if record.scaling_efficiency is not None else "- | ")
                         + f"{record.wire_bytes_per_iteration / 1e6:.2f} |")
        if not scenario.modes:
            lines.append(f"| {_cell(scenario.name)} | {scenario.status} | | | | | |")
    passed = sum(check.passed for s in document.scenarios for check in s.checks)
    total = sum(len(s.checks) for s in document.scenarios)
    lines += ["", f"{passed} of {total} checks passed."]
    return "\n".join(lines)


def history_summary(report: HistoryReport) -> str:
    """The history verdicts: regressions first, then every gated metric, then change points."""
    lines = ["## netsim-ddp history", "",
             f"{len(report.runs)} runs; a regression is the newest run against the best level "
             "before it, over the tolerance and significant.", ""]
    ordered = sorted(report.metrics, key=lambda h: (h.passed, not h.gating, h.key.label))
    lines += ["| verdict | series | metric | runs | newest | best level | change points |",
              "|---|---|---|---|---|---|---|"]
    for history in ordered:
        lines.append(f"| {_verdict_word(history)} | {_cell(history.key.label)} | "
                     f"{history.metric} | {len(history.values)} | "
                     f"{history.metric.format(history.values[-1])} | {_best_level(history)} | "
                     f"{len(history.segmentation.change_points)} |")
    changes = [(h, point) for h in report.metrics for point in h.segmentation.change_points]
    if changes:
        lines += ["", "### Change points", ""]
        lines += [f"- {change_text(h, point)}" for h, point in changes]
    failed = [h.verdict for h in ordered if h.verdict is not None and not h.passed]
    if failed:
        lines += ["", "### Failing", ""] + [f"- `{v.name}`: {_cell(v.detail)}" for v in failed]
    if report.notes:
        lines += ["", "### Notes", ""] + [f"- {_cell(note)}" for note in report.notes]
    return "\n".join(lines)


def _verdict_word(history: MetricHistory) -> str:
    if not history.gating:
        return "older series"
    if history.verdict is None:
        return "too few runs"
    return "pass" if history.verdict.passed else "**REGRESSION**"


def _best_level(history: MetricHistory) -> str:
    if not history.reference:
        return "-"
    level = _median([history.values[i] for i in history.reference])
    return f"{history.metric.format(level)} ({history.run_span(history.reference)})"


def _median(values: list[float]) -> float:
    import statistics

    return statistics.median(values)


def change_text(history: MetricHistory, point: ChangePoint) -> str:
    """'default[fp32] iteration_s.median: at run 4 (x.json), 712.0 ms -> 781.0 ms (+9.7%),
    p = 0.005'."""
    run = history.runs[point.index]
    return (f"{history.key.label} {history.metric}: at run {run.number} ({run.source}), "
            f"{history.metric.format(point.before)} -> {history.metric.format(point.after)} "
            f"({point.change:+.1%}), p = {point.p_value:.3f}")


# -- exports -----------------------------------------------------------------------------------

def _unit(metric: Metric) -> tuple[str, float]:
    if metric.series.endswith("_s"):
        return "ms", 1e3
    if metric.series == "wire_bytes_per_iteration":
        return "MB", 1e-6
    return "ratio", 1.0


def _exported(document: ResultsDocument) -> list[tuple[str, Metric, ModeRecord]]:
    """Every exported metric a record has (a user's script has no compute-only steps, so no
    comm_s or scaling_efficiency; its collective_s is exported instead where DDP ran)."""
    exported = []
    for scenario in document.scenarios:
        for mode, record in scenario.modes.items():
            names = EXPORTED if record.compute_s else (
                *[text for text in EXPORTED if Metric.parse(text).series not in NEEDS_COMPUTE],
                *(["collective_s.median"] if record.collective_s else []))
            exported += [(f"{scenario.name}[{mode}]", Metric.parse(text), record)
                         for text in names]
    return exported


def github_benchmark(document: ResultsDocument, bigger_is_better: bool = False
                     ) -> list[dict[str, Any]]:
    """github-action-benchmark's custom format: `customSmallerIsBetter` entries (times,
    bytes), or with `bigger_is_better` the `customBiggerIsBetter` ones (scaling efficiency);
    the action takes one tool per file."""
    entries = []
    for name, metric, record in _exported(document):
        if (metric.series in HIGHER_IS_BETTER) != bigger_is_better:
            continue
        unit, scale = _unit(metric)
        entry: dict[str, Any] = {"name": f"{name} {metric}", "unit": unit,
                                 "value": metric.value(record) * scale}
        samples = metric.samples(record)
        if samples:
            low, high = min(samples) * scale, max(samples) * scale
            entry["range"] = f"{low:.4g}..{high:.4g}"
            entry["extra"] = f"{len(samples)} iterations"
        entries.append(entry)
    return entries


def bencher_metrics(document: ResultsDocument) -> dict[str, dict[str, dict[str, float]]]:
    """Bencher Metric Format: per benchmark (scenario[mode]) one measure per metric, with the
    per-iteration minimum and maximum as its bounds where there are samples."""
    benchmarks: dict[str, dict[str, dict[str, float]]] = {}
    for name, metric, record in _exported(document):
        unit, scale = _unit(metric)
        measure: dict[str, float] = {"value": metric.value(record) * scale}
        samples = metric.samples(record)
        if samples:
            measure |= {"lower_value": min(samples) * scale, "upper_value": max(samples) * scale}
        benchmarks.setdefault(name, {})[f"{str(metric).replace('.', '-')}-{unit}"] = measure
    return benchmarks
