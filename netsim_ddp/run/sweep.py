"""Sweeps: run one scenario at several points (nodes, ranks per node, link rate, model size),
report scaling efficiency and throughput per mode at each, fit the cost model, check it on a
held-out point, and project to cluster sizes one host cannot emulate.

In a scenario file (once `Scenario.sweep` is wired; until then pass a `SweepConfig`):

    [sweep]
    nodes = [1, 2, 3]                # any of nodes, ranks_per_node, rate, params: the cross product
    held_out = "largest"              # fit on the smaller points, predict the largest world size
    target_error = 0.15
    [sweep.projection]
    gpus = [16, 64, 256, 1024]
    rates = ["10gbit", "25gbit", "100gbit"]
    compute = "120ms"                # your GPU's step time; default: the compute measured here
    calibration = "allreduce.txt"    # nccl-tests output of your cluster (projection.calibrate)
    gpus_per_server = 8              # default: the calibration's; NVLink: projection.cluster
    nics_per_server = 8              # default 1; NICs carry the network, not GPUs

The JSON a sweep adds to `netsim-ddp run --json` (see `scenario_report.results_document`): a
top-level "sweeps" list, each entry {name, axes, points: [{values, world_size, modes: {mode:
per-point numbers}, scenario: the same per-scenario dict as "scenarios"}], fit, held_out,
projection}.
"""

from __future__ import annotations

import math
import statistics
import time
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from netsim_ddp.fabric.fidelity import slowest_link_goodput
from netsim_ddp.hostfacts.hostload import STEAL_NOTICEABLE, max_steal
from netsim_ddp.measure.document import SweepPointRecord, SweepRecord
from netsim_ddp.projection.calibrate import CalibrationError
from netsim_ddp.projection.cluster import Cluster, calibrated_projection, load_cluster
from netsim_ddp.projection.costmodel import (
    HOST_ALPHA_REACH,
    TYPICAL_ETHERNET_ALPHA_S,
    FitError,
    FitResult,
    HeldOutResult,
    Projection,
    StepPoint,
    check_held_out,
    fit,
    project,
)
from netsim_ddp.projection.nccl_tests import NcclParseError
from netsim_ddp.run.runner import run_scenario
from netsim_ddp.scenario.spec import Scenario, point_label
from netsim_ddp.scenario.sweep_spec import SweepConfig
from netsim_ddp.verdicts.scenario_report import ScenarioReport

Progress = Callable[[str], None]
RunScenario = Callable[..., ScenarioReport]


def point_scenario(scenario: Scenario, values: dict[str, Any]) -> Scenario:
    """The scenario at one sweep point, validated again (a swept value can be invalid there)."""
    return scenario.at_sweep_point(values)


@dataclass
class SweepPoint:
    values: dict[str, Any]
    report: ScenarioReport
    seconds: float  # wall time of the point's run

    @property
    def world_size(self) -> int:
        topology = self.report.scenario.topology
        return topology.nodes * topology.ranks_per_node

    @property
    def usable(self) -> bool:
        return self.report.status in ("passed", "failed") and bool(self.report.modes)

    def step_points(self) -> list[StepPoint]:
        """One StepPoint per mode, from the medians."""
        link_bps, _ = slowest_link_goodput(self.report.scenario)
        out = []
        for mode, report in self.report.modes.items():
            assert report.compute is not None  # a sweep trains the built-in loop (spec.py)
            out.append(StepPoint(
                mode=mode, world_size=report.result.world_size, link_bps=link_bps,
                bytes_per_rank=report.result.sent_bytes_per_iteration,
                buckets=_buckets(report), compute_s=report.compute.median,
                step_s=report.iteration.median, label=point_label(self.values),
                step_samples=tuple(report.result.iteration_s)))
        return out

    def mode_numbers(self) -> dict[str, dict[str, float | int]]:
        numbers = {}
        for mode, report in self.report.modes.items():
            assert report.compute is not None and report.comm is not None  # built-in loop
            assert report.scaling_efficiency is not None
            numbers[mode] = {
                "step_s": report.iteration.median,
                "compute_s": report.compute.median,
                "comm_s": report.comm.median,
                "comm_sd_s": report.comm.std,
                "scaling_efficiency": report.scaling_efficiency,
                "throughput_samples_s": 1 / report.seconds_per_sample,
                "wire_bytes_per_iteration": report.wire_bytes_per_iteration,
                "hook_bytes_per_iteration": report.result.sent_bytes_per_iteration,
                "buckets": _buckets(report),
                "params": report.result.params,
            }
        return numbers

    @property
    def label(self) -> str:
        return point_label(self.values)

    def to_record(self) -> SweepPointRecord:
        return SweepPointRecord.model_validate(
            {"values": self.values, "label": self.label, "world_size": self.world_size,
             "seconds": self.seconds, "status": self.report.status,
             "modes": self.mode_numbers(), "scenario": self.report.to_record()}, strict=False)


@dataclass
class SweepReport:
    scenario: Scenario
    config: SweepConfig
    points: list[SweepPoint] = field(default_factory=list)
    fit: FitResult | None = None  # on every usable point: the model the projection uses
    held_out: HeldOutResult | None = None
    projection: Projection | None = None
    notes: list[str] = field(default_factory=list)  # why a fit, check or projection is absent
    seconds: float = 0.0
    calibration: Cluster | None = None  # nccl-tests times (network, NVLink) the projection uses

    @property
    def status(self) -> str:
        """"failed" when a point failed its checks or broke; else "untrusted" when this host
        could not emulate a point faithfully (as for a single scenario, no verdict: the model
        and its held-out check were fitted on what was left), or when the held-out check missed
        while the hypervisor stole noticeable CPU time (the points were measured minutes apart, so a
        neighbour can shift one against another); else "failed" when the held-out check missed
        (`HeldOutResult.met`); else "passed"."""
        statuses = {point.report.status for point in self.points}
        if statuses & {"failed", "error"}:
            return "failed"
        if "untrusted" in statuses or self._held_out_disturbed:
            return "untrusted"
        return "failed" if self.held_out and not self.held_out.met else "passed"

    @property
    def steal(self) -> float:
        """The largest share of CPU time the hypervisor took while a point trained."""
        return max_steal(point.report.host_load for point in self.points)

    @property
    def _held_out_disturbed(self) -> bool:
        return (self.held_out is not None and not self.held_out.met
                and self.steal >= STEAL_NOTICEABLE)

    @property
    def passed(self) -> bool:
        return self.status == "passed"

    @property
    def refusals(self) -> list[str]:
        reasons = [f"point {point_label(point.values)}: "
                   + (point.report.refused or ", ".join(point.report.untrusted_checks))
                   for point in self.points if point.report.status == "untrusted"]
        if self._held_out_disturbed:
            assert self.held_out is not None
            reasons.append(
                f"the cost model missed the held-out points by up to "
                f"{self.held_out.max_abs_error:.1%} (target {self.held_out.target:.0%}) while the "
                f"hypervisor took up to {self.steal:.0%} of this host's CPU time: not judged, "
                "since a neighbour shifts points measured minutes apart. Rerun on a quieter host")
        return reasons

    def to_record(self) -> SweepRecord:
        return SweepRecord.model_validate({
            "name": self.scenario.name,
            "file": str(self.scenario.path) if self.scenario.path else None,
            "passed": self.passed,
            "status": self.status,
            "refusals": self.refusals,
            "host_steal": self.steal,
            "seconds": self.seconds,
            "axes": self.config.axes(),
            "config": self.config.model_dump(mode="json"),
            "points": [point.to_record() for point in self.points],
            "fit": self.fit.to_record() if self.fit else None,
            "held_out": self.held_out.to_record() if self.held_out else None,
            "projection": self.projection.to_record() if self.projection else None,
            "notes": self.notes,
        }, strict=False)


def load_calibration(scenario: Scenario, config: SweepConfig,
                     override: str | Path | Sequence[str | Path] | None = None) -> Cluster | None:
    """The sweep's calibrated cluster: `override` (command-line paths) or the files named by
    [sweep.projection] calibration, relative to the scenario file, with its gpus_per_server,
    NVLink and NIC fields. Raises CalibrationError naming the file and the field."""
    projection = config.projection
    if override is not None and not isinstance(override, str | Path):
        override = list(override) or None
    if override is not None:
        paths = [Path(p) for p in (override if isinstance(override, list) else [override])]
        field_name = "--calibration"
    elif projection.calibration is not None:
        base = scenario.path.parent if scenario.path else Path.cwd()
        paths = [base / name for name in projection.calibration_files()]
        field_name = f"{scenario.path}: sweep.projection.calibration"
    else:
        return None
    try:
        where = f"{scenario.path}: sweep.projection" if scenario.path else "sweep.projection"
        return load_cluster(paths, **projection.cluster_fields(), where=where)
    except (CalibrationError, NcclParseError) as exc:
        raise CalibrationError(f"{field_name}: {exc}") from None


def run_sweep(scenario: Scenario, config: SweepConfig, *, iterations: int | None = None,
              out_dir: Path | None = None, allow_untrusted: bool = False,
              timeout_s: float | None = None, progress: Progress = lambda message: None,
              runner: RunScenario = run_scenario,
              calibration: str | Path | Sequence[str | Path] | None = None) -> SweepReport:
    """Run every point of the sweep, then fit, check and project (see the module doc);
    `calibration` (nccl-tests output) replaces the file the sweep's projection names."""
    started = time.monotonic()
    report = SweepReport(scenario, config,
                         calibration=load_calibration(scenario, config, calibration))
    for index, values in enumerate(config.points()):
        at = point_scenario(scenario, values)
        progress(f"{scenario.name}: point {index + 1}: {point_label(values)}")
        point_out = Path(out_dir) / f"point{index}" if out_dir else None
        t0 = time.monotonic()
        result = _run_point(at, runner, iterations=iterations, out_dir=point_out,
                            allow_untrusted=allow_untrusted, timeout_s=timeout_s,
                            progress=progress)
        report.points.append(SweepPoint(values, result, time.monotonic() - t0))
    analyse(report)
    report.seconds = time.monotonic() - started
    return report


def analyse(report: SweepReport) -> None:
    """Fit on every usable point, check a held-out one, project. Fills report in place."""
    usable = [point for point in report.points if point.usable]
    for point in report.points:
        if not point.usable:
            why = point.report.refused or point.report.error
            report.notes.append(f"point {point_label(point.values)}: {point.report.status}"
                                + (f" ({why})" if why else "") + ", left out of the model")
    steps = [step for point in usable for step in point.step_points()]
    try:
        report.fit = fit(steps)
    except FitError as exc:
        report.notes.append(f"no model: {exc}")
        return
    if not report.fit.identifiable:
        report.notes.append(
            f"the points barely separate alpha, bandwidth and overlap (condition "
            f"{report.fit.condition:.0f}): vary nodes and model size for a firmer fit")
    if report.config.held_out == "largest":
        train, held = split_largest(usable)
        if not held or not train:
            report.notes.append("no held-out check: the sweep has one size only")
        else:
            try:
                report.held_out = check_held_out([s for p in train for s in p.step_points()],
                                         [s for p in held for s in p.step_points()],
                                         report.config.target_error)
            except FitError as exc:
                report.notes.append(f"no held-out check: the smaller points alone: {exc}")
    report.projection = _project(report, usable)


def split_largest(points: list[SweepPoint]) -> tuple[list[SweepPoint], list[SweepPoint]]:
    """(train, held out): hold out the points with the largest world size; where every point
    has it, those with the largest model."""
    if not points:
        return [], []
    largest = max(point.world_size for point in points)
    held = [p for p in points if p.world_size == largest]
    if len(held) == len(points):
        biggest = max(_params(p) for p in points)
        held = [p for p in points if _params(p) == biggest]
        if len(held) == len(points):
            return points, []
    return [p for p in points if p not in held], held


def _project(report: SweepReport, usable: list[SweepPoint]) -> Projection | None:
    assert report.fit is not None
    config = report.config.projection
    reference = max(usable, key=_params)  # bytes and buckets of the largest model measured
    steps = {step.mode: step for step in reference.step_points()}
    scale = 1.0
    buckets = {mode: step.buckets for mode, step in steps.items()}
    if config.params is not None:
        scale = config.params / _params(reference)
        workload = reference.report.scenario.workload
        assert workload is not None  # a sweep point always trains
        bucket_bytes = workload.bucket_size
        fp32_bytes = config.params * 4
        buckets = {mode: max(1, math.ceil(fp32_bytes / bucket_bytes)) for mode in steps}
    if config.compute is None:
        compute: dict[str, float] | float = {
            mode: statistics.median(step.compute_s for p in usable for step in p.step_points()
                                    if step.mode == mode) for mode in steps}
    elif isinstance(config.compute, dict):
        missing = set(steps) - set(config.compute)
        if missing:
            report.notes.append(f"no projection: projection.compute lacks {sorted(missing)}")
            return None
        compute = dict(config.compute)
    else:
        compute = config.compute
    bytes_per_rank = {m: s.bytes_per_rank * scale for m, s in steps.items()}
    if report.calibration is not None:
        per_mode = compute if isinstance(compute, dict) else dict.fromkeys(steps, compute)
        try:
            return calibrated_projection(report.calibration, report.fit.model,
                                         compute_s=per_mode, bytes_per_rank=bytes_per_rank,
                                         buckets=buckets, gpus=config.gpus)
        except CalibrationError as exc:
            report.notes.append(f"no projection: {exc}")
            return None
    # Far past the measured sizes, or past them where the all-reduce is more latency than
    # bandwidth, the fitted per-hop latency (this host's stack) decides the result: show it
    # next to a typical NCCL one rather than as one number.
    largest = max(point.world_size for point in usable)
    projection = project(report.fit.model, compute_s=compute, bytes_per_rank=bytes_per_rank,
                         buckets=buckets, gpus=config.gpus, link_bps=config.rates,
                         alpha_s=config.alpha,
                         typical_alpha_s=TYPICAL_ETHERNET_ALPHA_S if config.alpha is None else None,
                         typical_beyond=HOST_ALPHA_REACH * largest, latency_bound_beyond=largest)
    if projection.typical_alpha_s is not None:
        projection.notes.append(
            f"beyond {HOST_ALPHA_REACH} x the largest measured world size ({largest}), and "
            "beyond it wherever the all-reduce is more latency than bandwidth, the latency term "
            f"is this host's stack (alpha {report.fit.model.alpha_s * 1e3:.3f} ms per hop, gloo "
            "on a CPU host): those cells show the efficiency with it / with a typical "
            f"NCCL-over-Ethernet {TYPICAL_ETHERNET_ALPHA_S * 1e6:.0f} us. Give your cluster's "
            "alpha, or better a calibration (nccl-tests output), for a real answer")
    return projection


def _params(point: SweepPoint) -> int:
    workload = point.report.scenario.workload
    return workload.params if workload else 0


def _buckets(report) -> int:
    counts = [count for rank in report.result.ranks for count in rank.buckets]
    return max(1, round(statistics.median(counts))) if counts else 1


def _run_point(scenario: Scenario, runner: RunScenario, **kwargs: Any) -> ScenarioReport:
    """One point. A single node runs one mode at a time: runner's wire-bytes checks divide by
    fp32's wire bytes, which a single node (no network traffic) leaves at zero."""
    workload = scenario.workload
    if scenario.topology.nodes > 1 or workload is None or len(workload.modes) == 1:
        return runner(scenario, **kwargs)
    merged = ScenarioReport(scenario)
    base_out = kwargs.pop("out_dir")
    for mode in workload.modes:
        one = scenario.model_copy(update={
            "workload": workload.model_copy(update={"modes": [mode]})})
        out = base_out / mode if base_out else None
        part = runner(one, out_dir=out, **kwargs)
        merged.run_id = merged.run_id or part.run_id
        merged.error = merged.error or part.error
        merged.refused = merged.refused or part.refused
        merged.placement = merged.placement or part.placement
        merged.modes.update(part.modes)
        merged.checks.extend(part.checks)
        merged.delay_backends.update(part.delay_backends)
        merged.tcp_settings.update(part.tcp_settings)
    return merged


__all__ = ["SweepPoint", "SweepReport", "analyse", "load_calibration", "point_scenario",
           "run_sweep", "split_largest"]
