"""Expectations and baselines -> verdicts with readable reasons.

A verdict on noisy samples needs more than a ratio of medians: it passes only when the ratio
is on the right side of the bound AND a one-sided Mann-Whitney test says the difference is not
noise (spread statistics are tested on absolute deviations from the median, Brown-Forsythe's
idea). A baseline regression is flagged the way asv does: only when the change exceeds the
tolerance AND is significant. Wire bytes are exact kernel counts: compared without a test.
"""

from __future__ import annotations

import math
import re
from collections.abc import Sequence
from dataclasses import dataclass

from netsim_ddp.common.metrics import (
    deviations,
    shift_test,
    statistic,
)
from netsim_ddp.common.tails import tail_test
from netsim_ddp.measure.document import CheckRecord, ModeRecord
from netsim_ddp.measure.mode_report import ModeReport
from netsim_ddp.measure.record import CheckKind
from netsim_ddp.precision.modes import REFERENCE_MODE, compresses
from netsim_ddp.scenario.expectations import (
    DEFAULT_ALPHA,
    HIGHER_IS_BETTER,
    NEEDS_COMPUTE,
    Expectation,
    MetricName,
)


@dataclass(frozen=True)
class Metric(MetricName):
    """A metric name that can read its value from a run's mode or from a results record."""

    def samples(self, mode: ModeReport | ModeRecord) -> list[float] | None:
        """The per-iteration samples behind the metric, of a run's mode or of its record in
        a results document; None for scalars."""
        r = mode if isinstance(mode, ModeRecord) else mode.result
        if self.series == "collective_s":
            if r.collective_s is None:
                raise ValueError("a mode's result has no collective timing (collective_s); "
                                 "rerun it with this netsim-ddp")
            return r.collective_s
        if self.series in NEEDS_COMPUTE and not r.compute_s:
            raise ValueError(f"{self.series} needs compute-only steps, and a user's script has "
                             "none: claim iteration_s, collective_s or wire_bytes_per_iteration")
        if self.series == "scaling_efficiency":
            return [c / i for c, i in zip(r.compute_s, r.iteration_s, strict=True)]
        return {"iteration_s": r.iteration_s, "comm_s": r.comm_s, "compute_s": r.compute_s
                }.get(self.series)

    def value(self, mode: ModeReport | ModeRecord) -> float:
        if self.stat is None:
            return float(getattr(mode, self.series))
        samples = self.samples(mode)
        assert samples is not None  # every series that takes a statistic has samples
        return statistic(samples, self.stat)

    def format(self, value: float) -> str:
        if self.series.endswith("_s"):
            return f"{value * 1e3:.1f} ms"
        if self.series == "wire_bytes_per_iteration":
            return f"{value / 1e6:.2f} MB"
        return f"{value:.3f}"


@dataclass(frozen=True)
class Verdict:
    """One check's outcome. `kind` says what a failure means: "code", the code under test
    regressed (the run failed); "host", this host could not emulate the scenario faithfully
    (the run is untrusted: measure.record.CheckKind)."""

    name: str
    passed: bool
    detail: str
    p_value: float | None = None
    kind: CheckKind = "code"

    def to_record(self) -> CheckRecord:
        return CheckRecord(name=self.name, passed=self.passed, detail=self.detail,
                           p_value=self.p_value, kind="host" if self.kind == "host" else None)


def host_verdict(name: str, passed: bool, detail: str) -> Verdict:
    """A check of this host's emulation (kind "host"): failing it makes the run untrusted."""
    return Verdict(name, passed, detail, kind="host")


def default_expectations(modes: Sequence[str]) -> list[Expectation]:
    """The mission's claim, where a run has fp32 and a compressing mode (one whose wire dtype
    is smaller, workload.modes.compresses): mixed precision with compression cuts the median
    comm time, significantly.

    Its spread is not claimed by default: on a CPU host the exposed comm time's spread follows
    the CPU's noise in the compute-only steps more than the network (README, "What the numbers
    mean"), so the claim would judge the host. Scenarios can still claim it (comm_s.std)."""
    if REFERENCE_MODE not in modes:
        return []
    return [Expectation(metric="comm_s.median", mode=mode, vs=REFERENCE_MODE, max_ratio=1.0)
            for mode in modes if compresses(mode)]


def evaluate(expectation: Expectation, modes: dict[str, ModeReport]) -> Verdict:
    metric = Metric.parse(expectation.metric)
    subject = modes[expectation.mode]
    if expectation.vs is not None:
        return _ratio_verdict(expectation, metric, subject, modes[expectation.vs])
    return _absolute_verdict(expectation, metric, subject)


def _ratio_verdict(e: Expectation, metric: Metric, x: ModeReport, y: ModeReport) -> Verdict:
    x_value, y_value = metric.value(x), metric.value(y)
    ratio = x_value / y_value if y_value else float("inf")
    lines, passed, p_worst = [], True, None
    for bound, direction in ((e.max_ratio, "less"), (e.min_ratio, "greater")):
        if bound is None:
            continue
        within = ratio <= bound if direction == "less" else ratio >= bound
        sign = "<=" if direction == "less" else ">="
        text = (f"{e.mode} {metric.format(x_value)} is {ratio:.3f} x {e.vs}'s "
                f"{metric.format(y_value)}; needs {sign} {bound:g} x")
        x_samples, y_samples = metric.samples(x), metric.samples(y)
        if x_samples is None or y_samples is None:  # exact counts: no noise to test against
            ok = within
        elif metric.is_tail and metric.stat is not None:
            p = tail_test(x_samples, y_samples, metric.stat, bound, direction)
            ok = within and p < e.alpha
            p_worst = max(p_worst or 0.0, p)
            text += f"; bootstrap p = {p:.2g} (alpha {e.alpha:g})"
            if within and not ok:
                text += ": not significant, could be noise"
        else:
            if metric.is_spread:
                x_samples, y_samples = deviations(x_samples), deviations(y_samples)
            test = shift_test(x_samples, [bound * v for v in y_samples], direction)
            ok = within and test.p_value < e.alpha
            p_worst = max(p_worst or 0.0, test.p_value)
            text += (f"; Mann-Whitney p = {test.p_value:.2g} (alpha {e.alpha:g}), "
                     f"effect {test.effect_text}")
            if within and not ok:
                text += ": not significant, could be noise"
                if math.comb(len(x_samples) + len(y_samples), len(x_samples)) <= 1 / e.alpha:
                    text += (f" (and {len(x_samples)} vs {len(y_samples)} samples can never "
                             f"reach p < {e.alpha:g}: measure more iterations)")
        passed &= ok
        lines.append(text)
    return Verdict(e.name, passed, f"{metric}: " + "; ".join(lines), p_worst)


def _absolute_verdict(e: Expectation, metric: Metric, x: ModeReport) -> Verdict:
    from scipy.stats import wilcoxon

    value = metric.value(x)
    samples = metric.samples(x)
    lines, passed, p_worst = [], True, None
    for bound, direction in ((e.max, "less"), (e.min, "greater")):
        if bound is None:
            continue
        within = value <= bound if direction == "less" else value >= bound
        sign = "<=" if direction == "less" else ">="
        text = f"{e.mode} {metric.format(value)}; needs {sign} {metric.format(bound)}"
        ok = within
        if samples is not None and not metric.is_spread and not metric.is_tail:
            # One-sample Wilcoxon signed-rank test of the location against the bound.
            differences = [v - bound for v in samples]
            if any(differences):
                p = float(wilcoxon(differences, alternative=direction).pvalue)
                ok = within and p < e.alpha
                p_worst = max(p_worst or 0.0, p)
                text += f"; Wilcoxon p = {p:.2g} (alpha {e.alpha:g})"
        passed &= ok
        lines.append(text)
    return Verdict(e.name, passed, f"{metric}: " + "; ".join(lines), p_worst)


# -- baselines: gating a release on regressions ------------------------------------------------

_TOLERANCE = re.compile(r"^(?P<metric>[a-z_]+(?:\.[a-z0-9_]+)?):(?P<pct>[0-9]*\.?[0-9]+)%$")


@dataclass(frozen=True)
class Tolerance:
    """How much worse than the baseline a metric may get: `median:10%` (iteration time),
    `comm_s.p95:15%`, `scaling_efficiency.median:5%`, `wire_bytes_per_iteration:2%`."""

    metric: Metric
    fraction: float

    @classmethod
    def parse(cls, text: str) -> Tolerance:
        match = _TOLERANCE.match(text.strip())
        if not match:
            raise ValueError(f"cannot read tolerance {text!r}; write METRIC:PERCENT, e.g. "
                             "'median:10%' or 'comm_s.p95:15%'")
        return cls(Metric.parse_option(match["metric"]), float(match["pct"]) / 100)

    def __str__(self) -> str:
        return f"{self.metric}:{self.fraction:.0%}"


def regression_verdict(scenario: str, mode: str, tolerance: Tolerance,
                       current: ModeReport | ModeRecord, baseline_value: float,
                       baseline_samples: list[float] | None, alpha: float = DEFAULT_ALPHA,
                       check: str = "baseline", reference: str = "baseline") -> Verdict:
    """Flag a regression only when over the tolerance AND significant. `check` names the
    verdict (check:mode:metric), `reference` what the baseline value is, in its detail."""
    metric = tolerance.metric
    worse_when_lower = metric.series in HIGHER_IS_BETTER
    value = metric.value(current)
    if worse_when_lower:
        threshold = baseline_value * (1 - tolerance.fraction)
        over = value < threshold
    else:
        threshold = baseline_value * (1 + tolerance.fraction)
        over = value > threshold
    change = (value / baseline_value - 1) if baseline_value else float("inf")
    detail = (f"{scenario}[{mode}] {metric}: {reference} {metric.format(baseline_value)}, current "
              f"{metric.format(value)} ({change:+.1%}), threshold {metric.format(threshold)} "
              f"({'-' if worse_when_lower else '+'}{tolerance.fraction:.0%})")
    samples = metric.samples(current)
    p = None
    if samples is not None and baseline_samples is not None and metric.is_tail \
            and metric.stat is not None:
        p = tail_test(samples, baseline_samples, metric.stat, 1.0,
                      "less" if worse_when_lower else "greater")
        detail += f", bootstrap p = {p:.2g} (alpha {alpha:g})"
        regressed = over and p < alpha
    elif samples is not None and baseline_samples is not None:
        if metric.is_spread:
            samples, baseline_samples = deviations(samples), deviations(baseline_samples)
        test = shift_test(samples, baseline_samples, "less" if worse_when_lower else "greater")
        p = test.p_value
        detail += f", Mann-Whitney p = {p:.2g} (alpha {alpha:g})"
        regressed = over and p < alpha
    else:
        regressed = over
    if over and not regressed:
        detail += ": over the tolerance but not significant"
    return Verdict(f"{check}:{mode}:{metric}", not regressed,
                   ("REGRESSION " if regressed else "") + detail, p)
