"""The tail of every mode as a table: percentiles, spread, the share of slow iterations and
what share of that tail each cause explains (measure.attribution)."""

from __future__ import annotations

from rich import box
from rich.table import Table

from netsim_ddp.common.metrics import Summary
from netsim_ddp.common.tails import SLOW_THRESHOLD
from netsim_ddp.measure.attribution import CAUSES
from netsim_ddp.verdicts.scenario_report import ScenarioReport


def _ms(seconds: float) -> str:
    return f"{seconds * 1e3:.1f}"


def _tail_cells(summary: Summary | None) -> list[str]:
    if summary is None:
        return ["-"] * 4
    return [_ms(summary.p95), _ms(summary.p99), _ms(summary.max), f"{summary.cv:.1%}"]


def tail_table(report: ScenarioReport) -> Table:
    """A row per mode: iteration and collective p95 / p99 / max / cv, the slow share, and the
    cause shares of the tail's excess over the median."""
    table = Table(title=f"{report.scenario.name}: the tail", title_justify="left",
                  box=box.SIMPLE_HEAD, show_edge=False, padding=(0, 0, 0, 1))
    for column in ("mode", "iter p50", "p95", "p99", "max", "cv", "slow", "coll p95", "p99",
                   "max", "cv", *CAUSES):
        table.add_column(column, justify="right", no_wrap=True)
    table.caption = (f"ms; slow: iterations above the median by more than {SLOW_THRESHOLD:.0%}; "
                     "stall / compute / timeout / network: the share of the slow iterations' "
                     "summed excess over the median each cause explains; network*: some of it "
                     "by elimination (no node's TCP loss counters grew, no link change; "
                     "docs/jitter.md)")
    if report.notice:
        table.title = f"{table.title}\n{report.notice}"
    for name, mode in report.modes.items():
        attribution = mode.attribution()
        shares = {share.cause: f"{share.share:.0%}" for share in attribution.shares}
        if any(not slow.evidenced for slow in attribution.slow):
            shares["network"] += "*"
        table.add_row(name, _ms(mode.iteration.median), *_tail_cells(mode.iteration),
                      f"{mode.iteration.slow_share:.0%}", *_tail_cells(mode.collective),
                      *(shares.get(cause, "-") for cause in CAUSES))
    return table


__all__ = ["tail_table"]
