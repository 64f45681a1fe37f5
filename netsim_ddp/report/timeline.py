"""The report's timeline and checks list, from a scenario's record in the results document.

The timeline shows, per mode, each iteration where it ran in the measured window: its
compute-only time and its collective time (time with a gradient collective in flight), with
the link changes of `[[link.schedule]]` and the background flows' on-periods marked, so a
person sees where the jitter came from. Background on-periods are recomputed from the flows'
seeds: every mode meets the same schedule from its window's start.
"""

from __future__ import annotations

from itertools import takewhile
from pathlib import Path

from netsim_ddp.fabric.background import on_periods
from netsim_ddp.measure.document import ModeRecord, ScenarioRecord
from netsim_ddp.report.figures import fit_title, mode_color, pyplot
from netsim_ddp.scenario.spec import BackgroundFlow


def check_rows(entry: ScenarioRecord) -> list[list[str]]:
    """Every check: failures first, with verdict, p-value and the numbers behind it."""
    checks = sorted(entry.checks, key=lambda check: check.passed)
    return [["ok" if c.passed else "FAILED", c.name,
             f"{c.p_value:.2g}" if c.p_value is not None else "-", c.detail]
            for c in checks]


CHECK_HEADER = ["verdict", "check", "p", "detail"]


def _background_spans(entry: ScenarioRecord, horizon: float) -> list[tuple[float, float]]:
    spans = []
    for data in (entry.scenario or {}).get("background", []):
        flow = BackgroundFlow.model_validate(data)
        spans += list(takewhile(lambda span: span[0] < horizon, on_periods(flow)))
    return spans


def _timed_modes(entry: ScenarioRecord) -> dict[str, ModeRecord]:
    return {name: m for name, m in entry.modes.items() if m.iteration_start_s}


def has_timeline(entry: ScenarioRecord) -> bool:
    return bool(_timed_modes(entry))


def plot_timeline(entry: ScenarioRecord, path: Path) -> Path:
    plt = pyplot()
    modes = _timed_modes(entry)
    fig, axes = plt.subplots(len(modes), 1, figsize=(9, 1.9 * len(modes) + 0.8), sharex=True,
                             squeeze=False)
    horizon = max(m.iteration_start_s[-1] + m.iteration_s[-1]  # type: ignore[index]
                  for m in modes.values())
    spans = _background_spans(entry, horizon)
    for index, (ax, (name, m)) in enumerate(zip(axes[:, 0], modes.items(), strict=True)):
        starts = m.iteration_start_s
        collective = m.collective_s or [0.0] * len(starts)  # type: ignore[arg-type]
        widths = m.iteration_s
        compute = m.compute_s or [0.0] * len(widths)  # a user's script: none measured
        ax.bar(starts, [c * 1e3 for c in compute], width=widths, align="edge",
               color="#bbbbbb", edgecolor="white", label="compute-only")
        ax.bar(starts, [c * 1e3 for c in collective], width=widths, align="edge",
               bottom=[c * 1e3 for c in compute], color=mode_color(name, index),
               edgecolor="white", label="collective")
        for start, end in spans:
            ax.axvspan(start, min(end, horizon), color="#ff7f0e", alpha=0.12, lw=0)
        for change in entry.schedule_changes(name):
            ax.axvline(change.offset_s, color="#d62728", ls="--", lw=1)
            ax.annotate(change.label, (change.offset_s, 1), xycoords=("data", "axes fraction"),
                        fontsize=7, color="#d62728", xytext=(3, -10), textcoords="offset points")
        ax.set_ylabel(f"{name}\nms", fontsize=8)
        ax.grid(axis="y", alpha=0.3)
    axes[0, 0].legend(fontsize=7, loc="upper left", ncols=2)
    axes[-1, 0].set_xlabel("seconds into the measured window (bar: one iteration; shaded: "
                           "background on; dashed: link change)", fontsize=8)
    fig.suptitle(fit_title(f"{entry.name}: per-iteration compute and collective time"),
                 fontsize=10)
    fig.tight_layout()
    fig.savefig(path, dpi=110)
    plt.close(fig)
    return path
