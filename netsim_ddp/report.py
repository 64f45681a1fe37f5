"""Results as people read them: compact tables."""

from __future__ import annotations

from rich.table import Table

from .runner import ScenarioReport
from .units import format_rate


def _ms(seconds: float) -> str:
    return f"{seconds * 1e3:.1f}"


def mode_table(report: ScenarioReport) -> Table:
    scenario = report.scenario
    topology = scenario.topology
    workload = scenario.workload
    title = (f"{scenario.name}: {topology.nodes} nodes x {topology.ranks_per_node} ranks, "
             f"{format_rate(scenario.link.rate)} links, {workload.model} "
             f"{workload.params / 1e6:.1f}M params")
    table = Table(title=title, title_justify="left")
    # Short headers: the table must fit an 80-column CI log.
    for column in ("mode", "iter ms", "p95", "comm ms", "comm sd", "compute", "eff",
                   "wire MB", "vs fp32", "busbw"):
        table.add_column(column, justify="right", no_wrap=True)
    table.caption = ("medians over measured iterations; eff = compute / iteration; wire MB per "
                     "iteration, all nodes, background excluded; busbw / link rate")
    reference = report.modes.get("fp32")
    for name, mode in report.modes.items():
        ratio = (mode.wire_bytes_per_iteration / reference.wire_bytes_per_iteration
                 if reference else None)
        table.add_row(
            name, _ms(mode.iteration.median), _ms(mode.iteration.p95), _ms(mode.comm.median),
            _ms(mode.comm.std), _ms(mode.compute.median), f"{mode.scaling_efficiency:.2f}",
            f"{mode.wire_bytes_per_iteration / 1e6:.1f}",
            f"{ratio:.2f}" if ratio is not None else "-",
            f"{mode.busbw_bps / mode.link_bps:.2f}",
        )
    return table
