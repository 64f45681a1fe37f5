"""The history gate: a metric's series over many runs, its change points, and a verdict on the
newest run.

A baseline gate compares one run with one saved run: five merges each 3% slower never trip its
10%. Here every earlier run counts. Per scenario, mode and metric:

- the series of per-run values (e.g. each run's median iteration time), in the runs' order;
- its change points (verdicts.changepoint: E-divisive's permutation test), each with where,
  from what to what, how large and how sure;
- the verdict on the newest run, asv's rule: a regression is measured from the BEST level the
  history reached before it (so a creep of small steps adds up), and is flagged only when it
  is beyond the tolerance AND significant: its per-iteration samples against the best
  level's (the baseline gate's Mann-Whitney test; wire bytes are exact counts), and, where
  the best level has three runs or more, its value outside their run-to-run spread (the
  prediction interval of one more run), since a run's own samples cannot show how much whole
  runs move.

The reference is replayed run by run: each run is judged as it was when it was the newest,
and a run that was a regression then never joins a reference later, however many of them
follow (else the regression's own step would widen the "run-to-run spread" until it looked
like noise). The best level is one level: a segment of the earlier non-regressed runs, cut
at their change points and at those the gate reports for the whole series. What ends a
regression is an acknowledgement saved in the folder (verdicts.acceptance, `history
--accept RUN`), never the passage of runs: the accepted run and the regressions right before
it become the level later runs are judged against.

Series are never mixed silently: runs of a scenario whose file changed (its digest), or that
ran on another kind of host (CPU model and count, architecture, torch version; not the
hostname, since CI runners are new machines every time), form series of their own, the output
says so, and only the series with the newest run of that scenario gates.
"""

from __future__ import annotations

import dataclasses
import datetime
import math
from collections.abc import Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import numpy as np

from netsim_ddp.measure.document import ModeRecord, ResultsDocument, ScenarioRecord, load_document
from netsim_ddp.measure.machine import MachineInfo, content_digest
from netsim_ddp.measure.record import DocumentError
from netsim_ddp.measure.target_time import REAL_TIME, emulation_label
from netsim_ddp.scenario.expectations import DEFAULT_ALPHA, HIGHER_IS_BETTER
from netsim_ddp.verdicts.acceptance import (
    ACCEPTED_FILE,
    AcceptanceError,
    accepted_sources,
    record_acceptance,
)
from netsim_ddp.verdicts.changepoint import Segmentation, runs_to_reach, segment, smallest_p_value
from netsim_ddp.verdicts.gate import Metric, Tolerance, Verdict, regression_verdict

DEFAULT_METRICS = ("iteration_s.median", "comm_s.median", "scaling_efficiency.median",
                   "wire_bytes_per_iteration")
# Run-to-run, medians of `default` move 0.6-2.1% here (README); 5% is beyond that noise and
# below the baseline gate's 10%, which a creep slips under.
DEFAULT_TOLERANCE = 0.05
MIN_RUNS_FOR_SPREAD = 3  # runs of the best level before their spread is trusted


class HistoryError(ValueError):
    """History that cannot be judged: an unreadable file, a bad option."""


@dataclass(frozen=True)
class Run:
    """One results document of the history, numbered from 1 in the order judged."""

    number: int
    source: str
    document: ResultsDocument
    accepted: bool = False  # acknowledged as the new reference (verdicts.acceptance)


def load_runs(paths: Sequence[str | Path], by_time: bool = True) -> tuple[list[Run], list[str]]:
    """The documents, ordered by the time each records (`created_at`) when every one has it,
    else as given; the notes say which."""
    documents = []
    for path in paths:
        try:
            document = load_document(path)
        except DocumentError as exc:
            raise HistoryError(str(exc)) from None
        if "scenarios" not in document.model_fields_set:  # any JSON parses: keys may be added
            raise HistoryError(f"{path}: not a netsim-ddp results document (no scenarios); "
                               "give `run --json` files, or folders holding only those")
        documents.append((str(path), document))
    notes = []
    if by_time:
        if all(document.created_at for _, document in documents):
            documents.sort(key=lambda item: _time(item[1]))
        else:
            undated = [source for source, document in documents if not document.created_at]
            notes.append(f"{len(undated)} of {len(documents)} results files record no time "
                         f"(written before netsim-ddp stamped them: {', '.join(undated[:3])}"
                         f"{', ...' if len(undated) > 3 else ''}): judged in the order given")
    try:
        accepted = accepted_sources(source for source, _ in documents)
    except AcceptanceError as exc:
        raise HistoryError(str(exc)) from None
    return [Run(i + 1, source, document, source in accepted)
            for i, (source, document) in enumerate(documents)], notes


def _time(document: ResultsDocument) -> datetime.datetime:
    assert document.created_at is not None
    moment = datetime.datetime.fromisoformat(document.created_at)
    return moment if moment.tzinfo else moment.replace(tzinfo=datetime.UTC)


def accept(runs: list[Run], which: str) -> tuple[list[Run], Path]:
    """Acknowledge one run (its number as judged here, or its results file) as an intended
    change: saved in its folder (verdicts.acceptance), the runs returned with it accepted."""
    chosen = [run for run in runs
              if which == str(run.number) or Path(which).name == Path(run.source).name]
    if len(chosen) != 1:
        raise HistoryError(f"--accept {which}: " + (
            "no such run; give its number as this command lists the runs, or its results "
            "file" if not chosen else f"{len(chosen)} runs have that file name; give its "
            "number instead"))
    run, = chosen
    marker = record_acceptance(run.source, run.document.created_at)
    return [dataclasses.replace(other, accepted=True) if other is run else other
            for other in runs], marker


def runs_in(folder: str | Path) -> list[Path]:
    """A history folder's results files."""
    return sorted(Path(folder).glob("*.json"))


# -- series ------------------------------------------------------------------------------------

@dataclass(frozen=True)
class SeriesKey:
    """What a series' runs share: the scenario, its content, the kind of host, the mode."""

    scenario: str
    digest: str
    host: str
    mode: str
    # A scale model's runs (dilation, compute source) are a series of their own: never mixed
    # with real-time runs or another k.
    emulation: str = REAL_TIME

    @property
    def label(self) -> str:
        plain = self.emulation == REAL_TIME
        return f"{self.scenario}[{self.mode}]" + ("" if plain else f" ({self.emulation})")


def scenario_digest(record: ScenarioRecord) -> str:
    """The recorded digest; for documents written before it was recorded, the same digest
    computed from the scenario they hold."""
    if record.scenario_digest:
        return record.scenario_digest
    return content_digest(record.scenario) if record.scenario is not None else "unknown"


BACKEND_MARK = "; backend "


def run_kind(machine: MachineInfo | None, record: ScenarioRecord) -> str:
    """What a series' runs must share besides the scenario: the kind of host and the backend
    the ranks used ('auto' is NCCL on a GPU host and gloo elsewhere: never one series).
    Documents without a placement were written before NCCL was supported: gloo."""
    backend = record.placement.backend if record.placement is not None else "gloo"
    return f"{host_kind(machine)}{BACKEND_MARK}{backend}"


def host_kind(machine: MachineInfo | None) -> str:
    """The host as far as timings go: CPU model and count, architecture, torch."""
    if machine is None:
        return "unrecorded host"
    cpu = machine.cpu
    parts = [cpu.brand_raw if cpu and cpu.brand_raw else None,
             f"{cpu.count} CPUs" if cpu and cpu.count else None, machine.machine,
             f"torch {machine.torch_version}" if machine.torch_version else None]
    return ", ".join(part for part in parts if part) or "unrecorded host"


@dataclass
class MetricHistory:
    """One metric of one series: its values, change points and the newest run's verdict."""

    key: SeriesKey
    metric: Metric
    runs: list[Run]
    records: list[ModeRecord]
    values: list[float]
    segmentation: Segmentation
    gating: bool  # the series with the newest run of its scenario
    verdict: Verdict | None = None  # None: too few runs to judge
    reference: list[int] | None = None  # indices of the newest run's reference level
    regressed: list[int] = field(default_factory=list)  # indices: regressions when newest

    @property
    def passed(self) -> bool:
        return self.verdict is None or self.verdict.passed or not self.gating

    def as_dict(self) -> dict[str, Any]:
        points = self.segmentation.change_points
        return {"scenario": self.key.scenario, "mode": self.key.mode,
                "digest": self.key.digest, "host": self.key.host, "metric": str(self.metric),
                "gating": self.gating, "runs": [run.number for run in self.runs],
                "values": self.values,
                "change_points": [{"run": self.runs[p.index].number, "before": p.before,
                                   "after": p.after, "change": p.change, "p_value": p.p_value}
                                  for p in points],
                "reference_runs": ([self.runs[i].number for i in self.reference]
                                   if self.reference else None),
                "regressed_runs": [self.runs[i].number for i in self.regressed],
                "verdict": self.verdict.to_record().dump() if self.verdict else None}

    def run_span(self, indices: Sequence[int]) -> str:
        """'run 4', 'runs 1-3' or 'runs 1-3, 6': the runs at these indices."""
        numbers = [self.runs[i].number for i in indices]
        spans: list[list[int]] = []
        for number in numbers:
            if spans and number == spans[-1][-1] + 1:
                spans[-1].append(number)
            else:
                spans.append([number])
        text = ", ".join(f"{span[0]}" if len(span) == 1 else f"{span[0]}-{span[-1]}"
                         for span in spans)
        return f"run {text}" if len(numbers) == 1 else f"runs {text}"


@dataclass
class HistoryReport:
    runs: list[Run]
    metrics: list[MetricHistory] = field(default_factory=list)
    notes: list[str] = field(default_factory=list)

    @property
    def passed(self) -> bool:
        return all(history.passed for history in self.metrics)

    @property
    def verdicts(self) -> list[Verdict]:
        return [h.verdict for h in self.metrics if h.verdict is not None and h.gating]

    def as_dict(self) -> dict[str, Any]:
        """What `history --json` writes: per series and metric, the values, change points,
        the runs of the best earlier level, and the verdict."""
        return {"runs": [{"number": run.number, "source": run.source,
                          "created_at": run.document.created_at} for run in self.runs],
                "passed": self.passed, "notes": self.notes,
                "series": [h.as_dict() for h in self.metrics]}


def parse_metrics(metrics: Sequence[str], tolerances: Sequence[str]
                  ) -> tuple[list[Metric], dict[Metric, float]]:
    """--metric and --tolerance METRIC:PCT (the baseline gate's syntax); a metric named only
    by a tolerance is judged too, the others at DEFAULT_TOLERANCE."""
    try:
        chosen = [Metric.parse_option(text) for text in (metrics or DEFAULT_METRICS)]
        parsed = [Tolerance.parse(text) for text in tolerances]
    except ValueError as exc:
        raise HistoryError(str(exc)) from None
    fractions = {metric: DEFAULT_TOLERANCE for metric in chosen}
    for tolerance in parsed:
        fractions[tolerance.metric] = tolerance.fraction
    return list(fractions), fractions


def judge_history(runs: list[Run], metrics: Sequence[Metric] | None = None,
                  tolerances: dict[Metric, float] | None = None,
                  alpha: float = DEFAULT_ALPHA) -> HistoryReport:
    """Split the runs into series, find each metric's change points, judge the newest runs."""
    if metrics is None:
        metrics, tolerances = parse_metrics([], [])
    tolerances = tolerances or {}
    report = HistoryReport(runs)
    series: dict[SeriesKey, list[tuple[Run, ModeRecord]]] = {}
    parts: dict[str, dict[tuple[str, str], list[int]]] = {}  # scenario -> (digest, host) -> runs
    for run in runs:
        for record in run.document.scenarios:
            if record.status == "untrusted":  # its numbers measure the host, not the code
                report.notes.append(f"{record.name}: run {run.number} ({run.source}) untrusted "
                                    "on its host: skipped, neither judged nor a reference")
                continue
            if not record.modes:
                report.notes.append(f"{record.name}: run {run.number} ({run.source}) "
                                    f"{record.status}, no measurements: skipped")
                continue
            digest, host = scenario_digest(record), run_kind(run.document.machine_info, record)
            parts.setdefault(record.name, {}).setdefault((digest, host), []).append(run.number)
            for mode, mode_record in record.modes.items():
                emulation = emulation_label(mode_record.dilation, mode_record.compute_source)
                series.setdefault(SeriesKey(record.name, digest, host, mode, emulation),
                                  []).append((run, mode_record))
    current = {name: max(groups.items(), key=lambda item: max(item[1]))[0]
               for name, groups in parts.items()}
    for name, groups in parts.items():
        if len(groups) > 1:
            report.notes.append(_split_note(name, groups, current[name]))
        kinds = sorted({key.emulation for key in series if key.scenario == name})
        if len(kinds) > 1:  # a scale model's times never join another kind's series
            report.notes.append(f"{name}: its runs are of {len(kinds)} kinds ("
                                f"{'; '.join(kinds)}), judged as separate series")
    for key, points in series.items():
        gating = (key.digest, key.host) == current[key.scenario]
        for metric in metrics:
            history = _metric_history(key, metric, points, gating, alpha)
            if history is not None:
                _judge_newest(history, tolerances.get(metric, DEFAULT_TOLERANCE), alpha)
                report.metrics.append(history)
    report.notes += _too_short_notes(report.metrics, alpha)
    if not report.passed:
        newest = max(run.number for h in report.metrics if not h.passed for run in h.runs[-1:])
        report.notes.append(f"a regression stays one until it is accepted: if run {newest}'s "
                            f"change is intended, `netsim-ddp history ... --accept {newest}` "
                            "records that in its folder (docs/history.md)")
    return report


def _too_short_notes(histories: list[MetricHistory], alpha: float) -> list[str]:
    """Where a gating series is too short for any change point to be significant: the
    permutation test cannot give a p-value under alpha with so few runs."""
    lengths: dict[str, int] = {}
    for history in histories:
        if history.gating and len(history.values) >= 2:
            lengths[history.key.scenario] = max(lengths.get(history.key.scenario, 0),
                                                len(history.values))
    notes = []
    for name, n in lengths.items():
        smallest = smallest_p_value(n)
        if smallest > alpha:
            notes.append(f"{name}: {n} runs are too few for a change point to be significant "
                         f"at alpha {alpha:g} (the permutation test's smallest attainable p with "
                         f"{n} runs is {smallest:.3f}; from {runs_to_reach(alpha)} runs on it "
                         "can be): none is reported yet; the newest run is judged all the same")
    return notes


def _split_note(name: str, groups: dict[tuple[str, str], list[int]],
                current: tuple[str, str]) -> str:
    digests = {digest for digest, _ in groups}
    hosts = {host.rsplit(BACKEND_MARK, 1)[0] for _, host in groups}
    backends = {host.rsplit(BACKEND_MARK, 1)[-1] for _, host in groups}
    why = " and ".join(reason for reason, differs in (
        ("the scenario changed (its digest)", len(digests) > 1),
        ("the runs come from different kinds of host", len(hosts) > 1),
        (f"the ranks ran on different backends ({', '.join(sorted(backends))})",
         len(backends) > 1)) if differs)
    listed = "; ".join(f"digest {digest[:8]} on {host}: runs "
                       f"{', '.join(map(str, numbers))}"
                       + (" (gates)" if (digest, host) == current else "")
                       for (digest, host), numbers in groups.items())
    return f"{name}: split into {len(groups)} series, since {why}: {listed}"


def _metric_history(key: SeriesKey, metric: Metric, points: list[tuple[Run, ModeRecord]],
                    gating: bool, alpha: float) -> MetricHistory | None:
    runs, records, values = [], [], []
    for run, record in points:
        try:
            values.append(metric.value(record))
        except ValueError:  # e.g. no collective timing in an older run
            continue
        runs.append(run)
        records.append(record)
    if not values:
        return None
    return MetricHistory(key, metric, runs, records, values, segment(values, alpha), gating)


def _judge_newest(history: MetricHistory, tolerance: float, alpha: float) -> None:
    """The newest run against the best level of the runs before it, replayed run by run: each
    run is judged as the newest in turn, and the regressions among them stay out of every
    later reference until a run of theirs is accepted (verdicts.acceptance)."""
    if len(history.values) < 2:
        return
    floor = 0  # runs before an accepted change are no reference any more
    regressed: list[int] = []
    for index in range(1, len(history.values)):
        candidates = [i for i in range(floor, index) if i not in regressed]
        reference = _best_level(history, candidates, alpha)
        verdict = _judged(history, index, reference, tolerance, alpha)
        if not verdict.passed and history.runs[index].accepted:
            streak = index  # the accepted run and the regressions right before it
            while streak - 1 in regressed:
                streak -= 1
            regressed = [i for i in regressed if i < streak]
            floor = streak
            verdict = Verdict(verdict.name, True, _accepted_text(history, verdict, streak,
                                                                 index), verdict.p_value)
        elif not verdict.passed:
            regressed.append(index)
        history.verdict, history.reference = verdict, reference
    history.regressed = [i for i in regressed if i < len(history.values) - 1]


def _accepted_text(history: MetricHistory, verdict: Verdict, first: int, index: int) -> str:
    return (f"accepted ({history.run_span([index])} is acknowledged in "
            f"{ACCEPTED_FILE}: {history.run_span(range(first, index + 1))} are the "
            f"reference from here on): " + verdict.detail.removeprefix("REGRESSION "))


def _best_level(history: MetricHistory, candidates: list[int], alpha: float) -> list[int]:
    """The best level among the candidate runs: their segments (the change points of their own
    values, and those the gate reports for the whole series, bound each level), the one with
    the best median."""
    if not candidates:
        return []
    values = [history.values[i] for i in candidates]
    reported = {point.index for point in history.segmentation.change_points}
    levels = []
    for start, stop in _segments(tuple(values), alpha):
        level: list[int] = []
        for i in candidates[start:stop]:
            if level and i in reported:
                levels.append(level)
                level = []
            level.append(i)
        levels.append(level)
    pick = max if history.metric.series in HIGHER_IS_BETTER else min
    return pick(levels, key=lambda level: float(np.median([history.values[i] for i in level])))


_SEGMENTS: dict[tuple[tuple[float, ...], float], list[tuple[int, int]]] = {}


def _segments(values: tuple[float, ...], alpha: float) -> list[tuple[int, int]]:
    """segment(values).bounds, remembered: the replay segments the same prefixes again."""
    key = (values, alpha)
    if key not in _SEGMENTS:
        if len(_SEGMENTS) > 4096:
            _SEGMENTS.clear()
        _SEGMENTS[key] = segment(values, alpha).bounds
    return _SEGMENTS[key]


def _judged(history: MetricHistory, index: int, reference: list[int], tolerance: float,
            alpha: float) -> Verdict:
    if len(reference) < MIN_RUNS_FOR_SPREAD:
        return Verdict(
            f"history:{history.key.mode}:{history.metric}", True,
            f"{history.key.label} {history.metric}: not judged yet: the best level "
            f"({history.run_span(reference)}) has {len(reference)} run(s), and "
            f"{MIN_RUNS_FOR_SPREAD} show how much whole runs move")
    return _verdict(history, index, reference, tolerance, alpha)


def _verdict(history: MetricHistory, index: int, reference: list[int], tolerance: float,
             alpha: float) -> Verdict:
    """Run `index` against the `reference` runs (one level): over the tolerance, significant
    by its samples, and beyond the runs' own spread."""
    samples: list[float] | None = []
    for i in reference:
        run_samples = history.metric.samples(history.records[i])
        samples = None if run_samples is None or samples is None else samples + run_samples
    level = [history.values[i] for i in reference]
    verdict = regression_verdict(
        history.key.scenario, history.key.mode, Tolerance(history.metric, tolerance),
        history.records[index], float(np.median(level)), samples, alpha,
        check="history", reference=f"best level ({history.run_span(reference)})")
    if verdict.passed:
        return verdict
    return _beyond_run_to_run_noise(history, verdict, index, reference, alpha)


def _beyond_run_to_run_noise(history: MetricHistory, verdict: Verdict, index: int,
                             reference: list[int], alpha: float) -> Verdict:
    """A run's own samples say nothing of how much whole runs move (the host, its neighbours):
    the run must also lie outside the spread of the reference runs, by the prediction interval
    of one more run (Student's t, one-sided)."""
    from scipy.stats import t as student

    level = np.asarray([history.values[i] for i in reference])
    spread = float(level.std(ddof=1)) if len(level) >= 2 else 0.0
    if spread == 0.0:  # exact counts
        return verdict
    distance = history.values[index] - float(level.mean())
    if history.metric.series in HIGHER_IS_BETTER:
        distance = -distance
    score = distance / (spread * math.sqrt(1 + 1 / len(level)))
    p = float(student.sf(score, len(level) - 1))
    text = (f"; against the run-to-run spread of {history.run_span(reference)} "
            f"(sd {history.metric.format(spread)}): t p = {p:.2g}")
    if p < alpha:
        return Verdict(verdict.name, False, verdict.detail + text, max(verdict.p_value or 0, p))
    return Verdict(verdict.name, True, verdict.detail.removeprefix("REGRESSION ") + text
                   + ": within the runs' own spread, could be one noisy run", p)
