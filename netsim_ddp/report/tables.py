"""Results as people read them: compact tables."""

from __future__ import annotations

from rich import box
from rich.table import Table

from netsim_ddp.measure.document import ProjectionRecord, ProjectionRow, StragglerSummary
from netsim_ddp.measure.tcp_evidence import tcp_counters
from netsim_ddp.precision.modes import REFERENCE_MODE
from netsim_ddp.report.tcp_view import loss_cell
from netsim_ddp.scenario.units import format_rate
from netsim_ddp.verdicts.scenario_report import ScenarioReport


def _ms(seconds: float | None) -> str:
    return f"{seconds * 1e3:.1f}" if seconds is not None else "-"


def _ratio(value: float | None) -> str:
    return f"{value:.2f}" if value is not None else "-"


def mode_table(report: ScenarioReport) -> Table:
    scenario = report.scenario
    topology = scenario.topology
    workload = scenario.workload
    assert workload is not None  # only reports of runs that trained have a table
    what = (f"script {' '.join(workload.command)}" if workload.command is not None
            else f"{workload.layout or workload.model} {workload.params / 1e6:.1f}M params")
    title = (f"{scenario.name}: {topology.nodes} nodes x {topology.ranks_per_node} ranks, "
             f"{format_rate(scenario.link.rate)} links, {what}")
    placement = report.placement
    if placement is not None and placement.backend != "gloo":
        title += f", {placement.backend}"
        if placement.gpus is not None and placement.gpus.shared:
            title += " (ranks share GPUs: compute times include each other's work)"
    # Short headers, one space between columns and no frame: the table fits a 120-column log.
    table = Table(title=title, title_justify="left", box=box.SIMPLE_HEAD, show_edge=False,
                  padding=(0, 0, 0, 1))
    versus = f"vs {next(iter(report.modes), '-')}" if workload.is_script else "vs fp32"
    for column in ("mode", "iter ms", "p95", "comm ms", "comm sd", "coll ms", "coll sd",
                   "compute", "eff", "wire MB", versus, "busbw", "straggler"):
        table.add_column(column, justify="right", no_wrap=True)
    table.caption = ("medians over measured iterations; coll = time a gradient collective was "
                     "in flight; eff = compute / iteration; wire MB per iteration, all nodes, "
                     "background excluded; busbw = 2(n-1)/n x gradient bytes / coll, over "
                     "the link rate ('-': no collective timing); straggler: the node whose "
                     "backward finished last most often (iterations) and its median lead")
    if workload.is_script:
        table.caption += ("; a script's step is one optimizer.step() (or netsim_ddp.step()); "
                          "comm, compute and eff need the built-in loop's compute-only "
                          "steps: '-'; vs: against the first variant")
    if report.notice:  # a scale model says so, in one line, in every table
        table.title = f"{title}\n{report.notice}" + (
            f" [{report.dilation_chosen}]" if report.dilation_chosen else "")
    if report.retried:  # what was tried again is part of the result
        table.title = f"{table.title}\n{report.retried}"
    if report.target_busbw is not None:  # the links carry the target's transport, not gloo's
        table.title = f"{table.title}\n{report.target_busbw.summary}"
    loss = {name: loss_cell(tcp_counters(mode.result)) for name, mode in report.modes.items()}
    if any(loss.values()):  # the kernel's evidence of loss, only when there is some: a line
        # of the caption, not a column (a column pushed the table past a 120-column log, and
        # rich then cut the mode names)
        table.caption += ("; tcp loss in the window, all nodes' retransmitted segments (retx), "
                          "timeouts (rto), spurious RTOs (spur), loss probes (tlp): "
                          + "; ".join(f"{name} {cell}" for name, cell in loss.items() if cell))
    dropped = {name: c["drops"] for name, c in report.uplinks.items() if c.get("drops")}
    if dropped:  # where the racks' traffic met: the oversubscribed uplinks' own losses
        table.caption += ("; the racks' uplinks dropped (whole run, packets): "
                          + ", ".join(f"{name} {count}" for name, count in dropped.items()))
    reference = (next(iter(report.modes.values()), None) if workload.is_script
                 else report.modes.get(REFERENCE_MODE))
    for name, mode in report.modes.items():
        ratio = (mode.wire_bytes_per_iteration / reference.wire_bytes_per_iteration
                 if reference and reference.wire_bytes_per_iteration else None)
        collective = mode.collective
        table.add_row(
            name, _ms(mode.iteration.median), _ms(mode.iteration.p95),
            _ms(mode.comm.median if mode.comm else None),
            _ms(mode.comm.std if mode.comm else None),
            _ms(collective.median) if collective else "-",
            _ms(collective.std) if collective else "-",
            _ms(mode.compute.median if mode.compute else None),
            _ratio(mode.scaling_efficiency),
            f"{mode.wire_bytes_per_iteration / 1e6:.1f}",
            f"{ratio:.2f}" if ratio is not None else "-",
            _ratio(mode.busbw_bps / mode.link_bps if mode.busbw_bps is not None else None),
            straggler_cell(mode.straggler_summary()),
        )
    return table


def straggler_cell(summary: StragglerSummary | None) -> str:
    """e.g. 'n1 12/16 +8.0ms': n1 finished its backward last in 12 of 16 iterations, and the
    first rank waited a median 8 ms for the straggler of each iteration."""
    if not summary:
        return "-"
    who = summary.node if summary.node is not None else f"rank {summary.rank}"
    return f"{who} {summary.iterations}/{summary.of} +{summary.median_wait_s * 1e3:.1f}ms"


def sweep_tables(sweep) -> list[object]:
    """A sweep (netsim_ddp.run.sweep.SweepReport) as tables: the measured points, the model's
    held-out error, and the projection, labelled as one."""
    points = Table(title=f"{sweep.scenario.name}: sweep over "
                         + ", ".join(f"{axis} {values}" for axis, values in
                                     sweep.config.axes().items()), title_justify="left")
    for column in ("point", "mode", "step ms", "compute ms", "comm ms", "eff", "samples/s",
                   "status"):
        points.add_column(column, justify="right", no_wrap=True)
    for point in sweep.points:
        label = point.label
        for mode, numbers in point.mode_numbers().items():
            points.add_row(label, mode, _ms(numbers["step_s"]), _ms(numbers["compute_s"]),
                           _ms(numbers["comm_s"]), f"{numbers['scaling_efficiency']:.2f}",
                           f"{numbers['throughput_samples_s']:.0f}", point.report.status)
    out: list[object] = [points]
    if sweep.fit is not None:
        m = sweep.fit.model
        out.append(f"cost model (all points): alpha {m.alpha_s * 1e3:.2f} ms per hop, "
                   f"all-reduce at {m.bandwidth_efficiency:.0%} of the link, overlap "
                   f"{m.overlap:.2f}; rms error {sweep.fit.rms_relative_error:.1%}")
    if sweep.held_out is not None:
        errors = ", ".join(f"{mode} {error:+.1%}" for mode, error in
                           sweep.held_out.errors_by_mode().items())
        out.append(f"held-out prediction of the largest points: {errors} "
                   f"(target within {sweep.held_out.target:.0%}: {sweep.held_out.verdict})")
    if sweep.projection is not None:
        out.append(projection_table(sweep.projection.to_record()))
        out.extend(f"note: {note}" for note in sweep.projection.notes)
    out.extend(f"note: {note}" for note in sweep.notes)
    return out


ALGORITHM_SHORT = {"as calibrated": "cal", "flat ring": "", "hierarchical": "hier",
                   "nvlink": "nvl"}


def projection_cell(row: ProjectionRow) -> str:
    """A projection cell: the efficiency; with a calibration, the algorithm; far past the
    measured sizes, the efficiency with the fitted and with a typical NCCL per-hop latency."""
    text = f"{row.efficiency:.2f}"
    if row.efficiency_typical_alpha is not None:
        text += f" / {row.efficiency_typical_alpha:.2f}"
    algorithm = ALGORITHM_SHORT.get(row.algorithm, row.algorithm)
    return f"{text} {algorithm}" if algorithm else text


def projection_table(projection: ProjectionRecord) -> Table:
    """A projection as a table: a row per mode and link rate (one per mode with a
    calibration: its link is the calibrated cluster's), a column per GPU count."""
    rows = projection.rows
    table = Table(title=projection.label, title_justify="left")
    gpus = sorted({row.gpus for row in rows})
    table.add_column("mode")
    table.add_column("link", justify="right")
    for count in gpus:
        table.add_column(f"{count} GPUs", justify="right")
    cells = {(row.mode, row.link_bps, row.gpus): row for row in rows}
    for mode in dict.fromkeys(row.mode for row in rows):
        for link in sorted({row.link_bps for row in rows}):
            shown = "calibrated" if projection.calibration else format_rate(link)
            table.add_row(mode, shown, *(projection_cell(cells[mode, link, count])
                                         for count in gpus))
    if projection.calibration:
        table.caption = ("scaling efficiency and the all-reduce algorithm: cal = the "
                         "calibration's measured curve at its world size; ring/tree/hier "
                         "(NVLink reduce-scatter, ring over servers, NVLink all-gather) beyond "
                         "it; nvl = inside one server; the notes say the servers' GPUs, NICs "
                         "and NVLink, and any flag")
    elif projection.typical_alpha_s:
        table.caption = (f"a / b: efficiency with the per-hop latency fitted here / with a "
                         f"typical NCCL-over-Ethernet {projection.typical_alpha_s * 1e6:.0f} "
                         "us (see the note)")
    return table
