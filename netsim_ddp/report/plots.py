"""Plots and a report from the JSON `netsim-ddp run --json` writes (and the sweeps it adds).

    from netsim_ddp.report.plots import report
    report("results.json", "report/")   # -> report/report.md (+ report.html and PNGs)

PNG via matplotlib's Agg backend (no display needed). Figures:
- per scenario (and per sweep point): the distributions of iteration and exposed comm time per
  mode (the jitter);
- wire bytes per iteration per mode;
- per sweep: scaling efficiency vs world size, measured and as the fitted model predicts it
  (the held-out point marked), throughput, and the projection to 16-1024 GPUs, labelled as one.
"""

from __future__ import annotations

import html
import re
import statistics
from collections.abc import Sequence
from pathlib import Path
from typing import TYPE_CHECKING, Any

from netsim_ddp.common.tails import SLOW_THRESHOLD, percentile
from netsim_ddp.fabric.fidelity import slowest_link_goodput
from netsim_ddp.measure.document import (
    CalibrationRecord,
    CostModelRecord,
    HeldOutPointRecord,
    ModeRecord,
    ResultsDocument,
    ScenarioRecord,
    SweepRecord,
    load_document,
)
from netsim_ddp.measure.record import DocumentError
from netsim_ddp.projection.costmodel import PROJECTION_LABEL, CostModel, StepPoint
from netsim_ddp.report.figures import fit_title, mode_color, pyplot
from netsim_ddp.report.tables import projection_cell, straggler_cell
from netsim_ddp.report.tcp_view import TCP_HEADER, tcp_rows, tcp_settings_line
from netsim_ddp.report.timeline import CHECK_HEADER, check_rows, has_timeline, plot_timeline
from netsim_ddp.scenario.spec import Scenario

if TYPE_CHECKING:
    from netsim_ddp.verdicts.history import HistoryReport, MetricHistory

RATE_STYLES = ["-", "--", ":", "-."]


def _slug(text: str) -> str:
    return re.sub(r"[^A-Za-z0-9]+", "-", text).strip("-").lower() or "x"


def plot_jitter(entry: ScenarioRecord, path: Path, title: str | None = None) -> Path:
    """Iteration and exposed comm time per mode: box plots with every sample drawn on top."""
    plt = pyplot()
    modes = entry.modes
    fig, axes = plt.subplots(1, 2, figsize=(9, 3.6), sharey=False)
    second = ("comm_s", "exposed comm time (ms)") if all(m.comm_s for m in modes.values()) \
        else ("collective_s", "collective time (ms)")  # a script: no exposed comm
    for ax, key, label in ((axes[0], "iteration_s", "iteration time (ms)"),
                           (axes[1], *second)):
        data = [[v * 1e3 for v in (getattr(modes[m], key) or [])] for m in modes]
        ax.boxplot(data, showfliers=False)
        ax.set_xticks(range(1, len(modes) + 1), list(modes))
        for i, (mode, values) in enumerate(zip(modes, data, strict=True)):
            xs = [i + 1 + 0.12 * ((j % 5) - 2) / 2 for j in range(len(values))]
            ax.scatter(xs, values, s=12, color=mode_color(mode, i), alpha=0.7, zorder=3)
        ax.set_ylabel(label)
        ax.set_ylim(bottom=0)
        ax.grid(axis="y", alpha=0.3)
    fig.suptitle(fit_title(title or f"{entry.name}: per-iteration distributions (jitter)", 80))
    fig.tight_layout()
    fig.savefig(path, dpi=110)
    plt.close(fig)
    return path


JITTER_SUBTITLE_WIDTH = 150  # characters of 8 pt text across the 12-inch figure


def plot_jitter_by_gpus(entries: Sequence[ScenarioRecord], path: Path,
                        title: str | None = None) -> Path:
    """How spread and pace change with the GPU count: per run (one per GPU count), each mode's
    per-iteration standard deviation of collective and iteration time, the median iteration
    (the slowest rank sets the pace) and its p99 (the tail a user feels). Times are the runs'
    own (a scale model's: the target's)."""
    plt = pyplot()
    fig, axes = plt.subplots(1, 4, figsize=(15, 3.6))
    modes = list(dict.fromkeys(mode for entry in entries for mode in entry.modes))
    panels = ((axes[0], "collective_s", statistics.stdev, "collective time sd (ms)"),
              (axes[1], "iteration_s", statistics.stdev, "iteration time sd (ms)"),
              (axes[2], "iteration_s", statistics.median, "iteration time median (ms)"),
              (axes[3], "iteration_s", lambda series: percentile(series, 99),
               "iteration time p99 (ms)"))
    for ax, key, statistic, label in panels:
        for index, mode in enumerate(modes):
            points = sorted(
                (entry.modes[mode].world_size, statistic(series) * 1e3)
                for entry in entries if mode in entry.modes
                and (series := getattr(entry.modes[mode], key)) and len(series) > 1)
            if points:
                ax.plot(*zip(*points, strict=True), "o-", label=mode,
                        color=mode_color(mode, index))
        ax.set_xscale("log", base=2)
        ax.set_xlabel("GPUs (ranks)")
        ax.set_ylabel(label)
        ax.legend(fontsize=8)
    notices = {entry.emulation.notice for entry in entries if entry.emulation}
    # Wrapped, never cut: a scale model's notice is what says its times are not measured ones.
    fig.suptitle((title or "spread and pace per iteration vs GPU count")
                 + ("\n" + fit_title("; ".join(sorted(notices)), JITTER_SUBTITLE_WIDTH)
                    if notices else ""), fontsize=8)
    fig.tight_layout()
    fig.savefig(path, dpi=110)
    plt.close(fig)
    return path


def plot_wire_bytes(groups: list[tuple[str, ScenarioRecord]], path: Path,
                    title: str = "wire bytes per iteration (all nodes, background excluded)"
                    ) -> Path:
    """Grouped bars: for each scenario or sweep point, the MB each mode put on the wire."""
    plt = pyplot()
    modes: list[str] = []
    for _, entry in groups:
        modes += [m for m in entry.modes if m not in modes]
    fig, ax = plt.subplots(figsize=(max(5, 1.6 * len(groups) + 2), 3.6))
    width = 0.8 / max(1, len(modes))
    for i, mode in enumerate(modes):
        xs, ys = [], []
        for g, (_, entry) in enumerate(groups):
            if mode in entry.modes:
                xs.append(g + (i - (len(modes) - 1) / 2) * width)
                ys.append(entry.modes[mode].wire_bytes_per_iteration / 1e6)
        bars = ax.bar(xs, ys, width, label=mode, color=mode_color(mode, i))
        ax.bar_label(bars, fmt="%.1f", fontsize=7)
    ax.set_xticks(range(len(groups)), [label for label, _ in groups])
    ax.set_ylabel("MB per iteration")
    ax.set_title(fit_title(title, 55), fontsize=10)
    ax.legend()
    ax.grid(axis="y", alpha=0.3)
    fig.tight_layout()
    fig.savefig(path, dpi=110)
    plt.close(fig)
    return path


def _sweep_mode_points(sweep: SweepRecord) -> dict[str, list[StepPoint]]:
    """Per mode, the measured StepPoints of the sweep's usable points, by world size."""
    out: dict[str, list[StepPoint]] = {}
    for point in sweep.points:
        for mode, numbers in point.modes.items():
            out.setdefault(mode, []).append(StepPoint(
                mode, point.world_size, _slowest_rate(point.scenario),
                numbers.hook_bytes_per_iteration, numbers.buckets, numbers.compute_s,
                numbers.step_s, point.label))
    for points in out.values():
        points.sort(key=lambda p: p.world_size)
    return out


def _slowest_rate(entry: ScenarioRecord) -> float:
    """The slowest link's rate, as the sweep measured against it (runner's own rule)."""
    if entry.scenario is None:
        raise DocumentError(f"scenario {entry.name}: no scenario recorded to read its links from")
    rate, _ = slowest_link_goodput(Scenario.from_dict(entry.scenario))
    return rate


def plot_scaling(sweep: SweepRecord, path: Path) -> Path:
    """Scaling efficiency and throughput vs world size: measured, and the fitted model."""
    plt = pyplot()
    by_mode = _sweep_mode_points(sweep)
    fit = sweep.fit
    held_out = sweep.held_out
    held_labels = {(p.label, p.mode) for p in held_out.held_out} if held_out else set()
    fig, (ax, ax2) = plt.subplots(1, 2, figsize=(10, 3.8))
    for i, (mode, points) in enumerate(by_mode.items()):
        color = mode_color(mode, i)
        worlds = [p.world_size for p in points]
        ax.plot(worlds, [p.efficiency for p in points], "o-", color=color,
                label=f"{mode} measured")
        numbers = {p.world_size: p.modes[mode] for p in sweep.points if mode in p.modes}
        ax2.plot(sorted(numbers), [numbers[n].throughput_samples_s for n in sorted(numbers)],
                 "o-", color=color, label=mode)
        if fit:
            model = _cost_model(fit.model)
            ref = points[-1]
            compute = statistics.median(p.compute_s for p in points)
            grid = list(range(1, max(worlds) + 1))
            predicted = [model.efficiency(StepPoint(mode, n, ref.link_bps, ref.bytes_per_rank,
                                                    ref.buckets, compute)) for n in grid]
            ax.plot(grid, predicted, "--", color=color, alpha=0.6,
                    label=f"{mode} model (all points)")
        if held_out:
            for h in held_out.held_out:
                if h.mode == mode:
                    ax.scatter([h.world_size], [h.predicted_efficiency], marker="x", s=60,
                               color=color, zorder=4,
                               label=f"{mode} held-out prediction ({h.error:+.0%})")
        for p in points:
            if (p.label, mode) in held_labels:
                ax.scatter([p.world_size], [p.efficiency], s=120,
                           facecolors="none", edgecolors=color, zorder=4)
    ax.set_xlabel("world size (ranks; 1 per node unless swept)")
    ax.set_ylabel("scaling efficiency (compute / step)")
    ax.set_ylim(0, 1.05)
    ax.set_title("measured (o), model (--), held-out (circled; x = predicted)", fontsize=9)
    ax.grid(alpha=0.3)
    ax.legend(fontsize=7)
    ax2.set_xlabel("world size")
    ax2.set_ylabel("throughput (samples/s, all ranks)")
    ax2.set_title("measured throughput", fontsize=9)
    ax2.grid(alpha=0.3)
    ax2.legend(fontsize=7)
    fig.suptitle(f"{sweep.name}: scaling")
    fig.tight_layout()
    fig.savefig(path, dpi=110)
    plt.close(fig)
    return path


def _cost_model(record: CostModelRecord) -> CostModel:
    return CostModel(alpha_s=record.alpha_s, bandwidth_efficiency=record.bandwidth_efficiency,
                     overlap=record.overlap)


def plot_projection(sweep: SweepRecord, path: Path) -> Path:
    plt = pyplot()
    projection = sweep.projection
    assert projection is not None  # only sweeps with a projection are plotted
    calibrated = projection.calibration is not None
    rows = projection.rows
    rates = sorted({row.link_bps for row in rows})
    fig, ax = plt.subplots(figsize=(7.5, 4.2))
    for i, mode in enumerate(projection.compute_s):
        for j, rate in enumerate(rates):
            mine = sorted((row for row in rows if row.mode == mode and row.link_bps == rate),
                          key=lambda row: row.gpus)
            where = "calibrated" if calibrated else f"{rate / 1e9:g} Gbit/s"
            ax.plot([r.gpus for r in mine], [r.efficiency for r in mine],
                    RATE_STYLES[j % len(RATE_STYLES)], marker="o", color=mode_color(mode, i),
                    label=f"{mode}, {where}")
            typical = [r for r in mine if r.efficiency_typical_alpha is not None]
            if typical:
                ax.plot([r.gpus for r in typical],
                        [r.efficiency_typical_alpha for r in typical], "o",
                        mfc="none", color=mode_color(mode, i),
                        label=f"{mode}, {where}, typical NCCL alpha" if j == 0 else None)
    ax.set_xscale("log", base=2)
    ax.set_xlabel("GPUs (ring, tree or hierarchical, as NCCL would pick, from the calibration)"
                  if calibrated
                  else "GPUs (one per link, flat ring)")
    ax.set_ylabel("projected scaling efficiency")
    ax.set_ylim(0, 1.05)
    ax.grid(alpha=0.3)
    ax.legend(fontsize=7, ncol=2)
    ax.set_title(fit_title("PROJECTION (all-reduce calibrated from nccl-tests, not measured here)"
                      if calibrated else "PROJECTION (cost model fitted here, not measured)",
                      55), color="#b00000", fontsize=10)
    fig.tight_layout()
    fig.savefig(path, dpi=110)
    plt.close(fig)
    return path


class _Doc:
    """A report written once, rendered as Markdown and as HTML."""

    def __init__(self) -> None:
        self.blocks: list[tuple[str, Any]] = []

    def heading(self, text: str, level: int = 2) -> None:
        self.blocks.append(("h", (level, text)))

    def para(self, text: str) -> None:
        self.blocks.append(("p", text))

    def table(self, header: list[str], rows: list[list[str]]) -> None:
        self.blocks.append(("t", (header, rows)))

    def image(self, name: str, alt: str) -> None:
        self.blocks.append(("i", (name, alt)))

    def markdown(self) -> str:
        out = []
        for kind, value in self.blocks:
            if kind == "h":
                out.append("#" * value[0] + " " + value[1])
            elif kind == "p":
                out.append(value)
            elif kind == "t":
                header, rows = value
                lines = ["| " + " | ".join(header) + " |", "|" + "---|" * len(header)]
                lines += ["| " + " | ".join(row) + " |" for row in rows]
                out.append("\n".join(lines))
            else:
                out.append(f"![{value[1]}]({value[0]})")
        return "\n\n".join(out) + "\n"

    def html(self, title: str) -> str:
        out = [f"<!doctype html><meta charset='utf-8'><title>{html.escape(title)}</title>",
               "<style>body{font-family:sans-serif;max-width:1100px;margin:auto}"
               "table{border-collapse:collapse}td,th{border:1px solid #ccc;padding:2px 6px;"
               "text-align:right}img{max-width:100%}</style>"]
        for kind, value in self.blocks:
            if kind == "h":
                out.append(f"<h{value[0]}>{html.escape(value[1])}</h{value[0]}>")
            elif kind == "p":
                out.append(f"<p>{html.escape(value)}</p>")
            elif kind == "t":
                header, rows = value
                cells = "".join(f"<th>{html.escape(h)}</th>" for h in header)
                body = "".join("<tr>" + "".join(f"<td>{html.escape(c)}</td>" for c in row)
                               + "</tr>" for row in rows)
                out.append(f"<table><tr>{cells}</tr>{body}</table>")
            else:
                out.append(f"<img src='{html.escape(value[0])}' alt='{html.escape(value[1])}'>")
        return "\n".join(out) + "\n"


def _mode_rows(entry: ScenarioRecord) -> list[list[str]]:
    rows = []
    for mode, m in entry.modes.items():
        s = m.summary
        comm, compute = s.comm_s, s.compute_s  # None for a user's script
        rows.append([mode, f"{s.iteration_s.median * 1e3:.1f}",
                     f"{s.iteration_s.p95 * 1e3:.1f}",
                     # the tail (docs/jitter.md); documents written before it hold no p99
                     f"{s.iteration_s.p99 * 1e3:.1f}" if s.iteration_s.p99 else "-",
                     f"{s.iteration_s.slow_share:.0%}" if s.iteration_s.p99 else "-",
                     f"{comm.median * 1e3:.1f}" if comm else "-",
                     f"{comm.std * 1e3:.1f}" if comm else "-",
                     f"{compute.median * 1e3:.1f}" if compute else "-",
                     f"{m.scaling_efficiency:.2f}" if m.scaling_efficiency is not None else "-",
                     f"{m.wire_bytes_per_iteration / 1e6:.1f}",
                     *_collective_cells(m)])
    return rows


def _tail_causes(entry: ScenarioRecord) -> str:
    """One line: per mode with slow iterations, what share of its tail each cause explains
    (measure.attribution)."""
    parts = []
    for mode, m in entry.modes.items():
        if m.attribution is not None and m.attribution.slow:
            causes = ", ".join(f"{c.cause} {c.share:.0%}" for c in m.attribution.shares)
            parts.append(f"{mode}: {len(m.attribution.slow)} slow of "
                         f"{m.attribution.iterations} ({causes})")
    return ("The tail (iterations over the median by more than "
            f"{SLOW_THRESHOLD:.0%}), by cause: " + "; ".join(parts)) if parts else ""


def _collective_cells(m: ModeRecord) -> list[str]:
    collective = m.summary.collective_s
    if collective is None:
        return ["-", "-", "-"]
    return [f"{collective.median * 1e3:.1f}", f"{collective.std * 1e3:.1f}",
            straggler_cell(m.straggler_summary)]


MODE_HEADER = ["mode", "iter ms", "p95", "p99", "slow", "comm ms", "comm sd", "compute ms", "eff",
               "wire MB", "collective ms", "coll sd", "straggler"]


def report(results_json_path: str | Path, out_dir: str | Path,
           calibration: str | Path | Sequence[str | Path] | None = None,
           history: HistoryReport | None = None, *, nics_per_server: int | None = None,
           nic_bandwidth_bps: float | None = None) -> Path:
    """Plots (PNG) and a Markdown + HTML report of a results JSON; returns report.md's path.
    DocumentError if the file is not a results document. `calibration` (nccl-tests output, one
    file or several) projects each sweep again from it (cluster.reproject), its servers'
    NICs as given; it raises calibrate.CalibrationError or ncclparse.NcclParseError on a bad
    file."""
    document = load_document(results_json_path)
    calibrated = None
    if calibration is not None:
        from netsim_ddp.projection.cluster import load_cluster

        paths = [calibration] if isinstance(calibration, str | Path) else list(calibration)
        calibrated = load_cluster(paths, nics_per_server=nics_per_server,
                                  nic_bandwidth_bps=nic_bandwidth_bps, where="--calibration")
    try:
        if calibrated is not None:
            from netsim_ddp.projection.cluster import reproject

            for sweep in document.sweeps:
                if sweep.projection is not None:
                    sweep.projection = reproject(sweep.projection, calibrated)
        return _report(document, results_json_path, out_dir, history)
    except (KeyError, ValueError, ZeroDivisionError) as exc:
        # Valid records that do not fit together: a held-out check naming a mode no point has, a
        # projection without the GPU counts its rows promise.
        if isinstance(exc, DocumentError) or _is_calibration_error(exc):
            raise
        raise DocumentError(f"{results_json_path}: its records do not fit together: "
                            f"{type(exc).__name__}: {exc}") from None


def _is_calibration_error(exc: Exception) -> bool:
    from netsim_ddp.projection.calibrate import CalibrationError
    from netsim_ddp.projection.nccl_tests import NcclParseError

    return isinstance(exc, (CalibrationError, NcclParseError))


def _report(document: ResultsDocument, results_json_path: str | Path,
            out_dir: str | Path, history: HistoryReport | None = None) -> Path:
    out = Path(out_dir)
    out.mkdir(parents=True, exist_ok=True)
    doc = _Doc()
    doc.heading("netsim-ddp report", 1)
    doc.para(f"From `{Path(results_json_path).name}` (netsim-ddp {document.netsim_ddp}"
             + (f", {document.created_at}" if document.created_at else "") + "). "
             "Medians over measured iterations; eff = compute-only / iteration time; wire MB "
             "per iteration, all nodes.")
    scenarios = [s for s in document.scenarios if s.modes]
    for entry in document.scenarios:
        doc.heading(f"Scenario {entry.name}: {entry.status}")
        if entry.refused or entry.error:
            doc.para(entry.refused or entry.error or "")
            continue
        if not entry.modes:
            continue
        doc.table(MODE_HEADER, _mode_rows(entry))
        if rows := tcp_rows(entry):  # the kernel's own evidence of loss, per mode and node
            doc.heading(f"TCP in {entry.name}'s measured windows (kernel counters)", 3)
            doc.table(TCP_HEADER, rows)
        if settings := tcp_settings_line(entry):
            doc.para(settings)
        if tails := _tail_causes(entry):
            doc.para(tails)
        name = f"jitter-{_slug(entry.name)}.png"
        plot_jitter(entry, out / name)
        doc.image(name, f"{entry.name}: iteration and comm time distributions")
        _timeline_and_checks(doc, entry, out)
    if scenarios:
        plot_wire_bytes([(s.name, s) for s in scenarios], out / "wire-bytes.png")
        doc.heading("Wire bytes per mode")
        doc.image("wire-bytes.png", "wire bytes per iteration per mode")
    for sweep in document.sweeps:
        _sweep_section(doc, sweep, out)
    if history is not None:
        _history_section(doc, history, out)
    (out / "report.md").write_text(doc.markdown())
    (out / "report.html").write_text(doc.html("netsim-ddp report"))
    return out / "report.md"


def _timeline_and_checks(doc: _Doc, entry: ScenarioRecord, out: Path) -> None:
    if has_timeline(entry):
        name = f"timeline-{_slug(entry.name)}.png"
        plot_timeline(entry, out / name)
        doc.image(name, f"{entry.name}: per-iteration compute and collective time")
    if entry.checks:
        doc.heading(f"Checks of {entry.name} (failures first)", 3)
        doc.table(CHECK_HEADER, check_rows(entry))


def _sweep_section(doc: _Doc, sweep: SweepRecord, out: Path) -> None:
    slug = _slug(sweep.name)
    doc.heading(f"Sweep {sweep.name} over {', '.join(sweep.axes)}")
    rows = []
    for point in sweep.points:
        for mode, m in point.modes.items():
            rows.append([point.label, mode, str(point.world_size),
                         f"{m.step_s * 1e3:.1f}", f"{m.compute_s * 1e3:.1f}",
                         f"{m.comm_s * 1e3:.1f}", f"{m.comm_sd_s * 1e3:.1f}",
                         f"{m.scaling_efficiency:.2f}", f"{m.throughput_samples_s:.0f}",
                         f"{m.wire_bytes_per_iteration / 1e6:.1f}"])
        if not point.modes:
            rows.append([point.label, "-", str(point.world_size), point.status] + [""] * 6)
    doc.table(["point", "mode", "ranks", "step ms", "compute ms", "comm ms", "comm sd", "eff",
               "samples/s", "wire MB"], rows)
    if any(p.modes for p in sweep.points):
        plot_scaling(sweep, out / f"scaling-{slug}.png")
        doc.image(f"scaling-{slug}.png", "scaling efficiency and throughput vs world size")
        groups = [(p.label, p.scenario) for p in sweep.points if p.modes]
        plot_wire_bytes(groups, out / f"wire-bytes-{slug}.png")
        doc.image(f"wire-bytes-{slug}.png", "wire bytes per mode at each sweep point")
        for i, point in enumerate(sweep.points):
            if point.modes and point.world_size > 1:
                name = f"jitter-{slug}-{i}.png"
                plot_jitter(point.scenario, out / name,
                            f"{sweep.name} at {point.label}: jitter")
                doc.image(name, f"jitter at {point.label}")
    held_out = sweep.held_out
    if held_out:
        model = held_out.fit.model
        doc.heading("Cost model: held-out check", 3)
        doc.para(f"Fitted on the smaller points only: alpha {model.alpha_s * 1e3:.2f} ms per "
                 f"hop, all-reduce bandwidth {model.bandwidth_efficiency:.0%} of the link, "
                 f"overlap {model.overlap:.2f} of compute. Max |error| on the held-out points "
                 f"{held_out.max_abs_error:.1%} (target {held_out.target:.0%}: "
                 f"{held_out.verdict or ('ok' if held_out.within_target else 'MISSED')}).")
        doc.table(["point", "mode", "measured step ms (95% interval)", "predicted ms", "error"],
                  [[h.label, h.mode, _measured_with_interval(h),
                    f"{h.predicted_s * 1e3:.1f}", f"{h.error:+.1%}"]
                   for h in held_out.held_out])
    fit = sweep.fit
    if fit:
        model = fit.model
        doc.para(f"Model on all points (used for the projection): alpha "
                 f"{model.alpha_s * 1e3:.2f} ms, bandwidth {model.bandwidth_efficiency:.0%} of "
                 f"the link, overlap {model.overlap:.2f}; rms relative error "
                 f"{fit.rms_relative_error:.1%}, condition {fit.condition:.0f}"
                 f"{'' if fit.identifiable else ' (parameters poorly separated)'}.")
    projection = sweep.projection
    if projection:
        doc.heading("PROJECTION (not measured)", 3)
        doc.para((projection.label or PROJECTION_LABEL) + ". Assumptions: "
                 + "; ".join(projection.assumptions) + ".")
        rates = sorted({row.link_bps for row in projection.rows})
        gpus = sorted({row.gpus for row in projection.rows})
        calibrated = projection.calibration
        rows = []
        for mode, compute in projection.compute_s.items():
            for rate in rates:
                cells = {row.gpus: row for row in projection.rows
                         if row.mode == mode and row.link_bps == rate}
                rows.append([mode, f"{compute * 1e3:.1f}",
                             "calibrated" if calibrated else f"{rate / 1e9:g}"]
                            + [projection_cell(cells[n]) for n in gpus])
        doc.table(["mode", "compute ms", "Gbit/s"] + [f"{n} GPUs" for n in gpus], rows)
        for note in projection.notes:
            doc.para(f"Note: {note}")
        if calibrated:
            _calibration_table(doc, calibrated)
            for intra in calibrated.cluster.intra_calibrations if calibrated.cluster else []:
                _calibration_table(doc, intra)  # the NVLink level's one-server runs
        plot_projection(sweep, out / f"projection-{slug}.png")
        doc.image(f"projection-{slug}.png", "PROJECTION of scaling efficiency")
    for note in sweep.notes:
        doc.para(f"Note: {note}")


def _calibration_table(doc: _Doc, calibration: CalibrationRecord) -> None:
    doc.para(f"Calibration: {calibration.collective} on {calibration.world_size} GPUs "
             f"({calibration.hosts} hosts), {', '.join(calibration.sources)}; "
             f"{calibration.method}. Per size, the measured time and the curve fitted "
             "without that size, predicting it (held out; fitted with it, the curve passes "
             "through the measurement).")
    doc.table(["size B", "measured us", "held-out us", "held-out error"],
              [[str(r.size), f"{r.measured_s * 1e6:.1f}",
                "-" if r.held_out_s is None else f"{r.held_out_s * 1e6:.1f}",
                "-" if r.held_out_error is None else f"{r.held_out_error:+.1%}"]
               for r in calibration.sizes])


def _measured_with_interval(held: HeldOutPointRecord) -> str:
    text = f"{held.step_s * 1e3:.1f}" if held.step_s is not None else "-"
    if held.measured_interval_s:
        low, high = held.measured_interval_s
        text += f" ({low * 1e3:.1f}-{high * 1e3:.1f})"
    return text


# -- history -----------------------------------------------------------------------------------

def plot_history(history: MetricHistory, path: Path) -> Path:
    """A metric over the runs: each run's value, each segment's level, the change points
    (dashed), the best earlier level the newest run was judged against, the newest run red
    when it regressed."""
    plt = pyplot()
    unit, scale = (("ms", 1e3) if history.metric.series.endswith("_s") else
                   ("MB", 1e-6) if history.metric.series == "wire_bytes_per_iteration" else
                   ("", 1.0))
    numbers = [run.number for run in history.runs]
    values = [v * scale for v in history.values]
    fig, ax = plt.subplots(figsize=(8, 3.4))
    ax.plot(numbers, values, "o-", color="#1f77b4", lw=0.8, ms=4, label="per run")
    segmentation = history.segmentation
    for (start, stop), level in zip(segmentation.bounds, segmentation.levels, strict=True):
        ax.hlines(level * scale, numbers[start] - 0.4, numbers[stop - 1] + 0.4, color="#555",
                  lw=2, label="segment level" if start == 0 else None)
    for point in segmentation.change_points:
        x = (numbers[point.index - 1] + numbers[point.index]) / 2
        ax.axvline(x, color="#d62728", ls="--", lw=1)
        ax.annotate(f"{point.change:+.1%}\np={point.p_value:.3f}", (x, ax.get_ylim()[1]),
                    fontsize=7, ha="left", va="top", color="#d62728")
    if history.reference:
        best = [history.values[i] for i in history.reference]
        ax.axhspan(min(best) * scale, max(best) * scale, color="#2ca02c", alpha=0.12,
                   label="best earlier level")
    if history.regressed:  # earlier runs that were regressions when they were the newest
        ax.plot([numbers[i] for i in history.regressed], [values[i] for i in history.regressed],
                "o", mfc="none", color="#d62728", ms=9, label="regression when newest")
    if history.verdict is not None and not history.verdict.passed:
        ax.plot(numbers[-1:], values[-1:], "o", color="#d62728", ms=9, label="regression")
    ax.set_xlabel("run")
    ax.set_ylabel(f"{history.metric}" + (f" ({unit})" if unit else ""))
    ax.grid(alpha=0.3)
    ax.legend(fontsize=7, loc="best")
    title = f"{history.key.label} {history.metric}: {len(values)} runs, " \
            f"{len(segmentation.change_points)} change point(s)"
    ax.set_title(fit_title(title, 90), fontsize=10)
    fig.tight_layout()
    fig.savefig(path, dpi=110)
    plt.close(fig)
    return path


def _history_section(doc: _Doc, report: HistoryReport, out: Path) -> None:
    from netsim_ddp.report.ci import change_text

    doc.heading(f"History of {len(report.runs)} runs")
    for note in report.notes:
        doc.para(note)
    for history in sorted(report.metrics, key=lambda h: (h.passed, h.key.label)):
        verdict = history.verdict
        doc.heading(f"{history.key.label} {history.metric}", 3)
        name = f"history-{_slug(history.key.label)}-{_slug(str(history.metric))}.png"
        plot_history(history, out / name)
        doc.image(name, f"{history.key.label} {history.metric} over the runs")
        for point in history.segmentation.change_points:
            doc.para("Change " + change_text(history, point))
        if verdict is not None:
            doc.para(("ok " if verdict.passed else "FAILED ") + f"{verdict.name}: "
                     + verdict.detail + ("" if history.gating else " (an older series: "
                                         "not gated)"))


def history_report(report: HistoryReport, out_dir: str | Path) -> Path:
    """`history --out`: the plots and a Markdown + HTML page of a history."""
    out = Path(out_dir)
    out.mkdir(parents=True, exist_ok=True)
    doc = _Doc()
    doc.heading("netsim-ddp history", 1)
    _history_section(doc, report, out)
    (out / "history.md").write_text(doc.markdown())
    (out / "history.html").write_text(doc.html("netsim-ddp history"))
    return out / "history.md"
