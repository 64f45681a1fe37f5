"""Baseline files: a run's raw samples and summaries, saved to gate later runs against.

The file is pytest-benchmark's JSON format (one benchmark per scenario and mode, its stats
those of the iteration time), so `pytest-benchmark compare FILE...` reads and tabulates it;
netsim-ddp's own data (every series' raw samples, wire bytes, the scenario) rides in each
benchmark's `extra_info`.
"""

from __future__ import annotations

import json
from collections.abc import Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Annotated, Any

from pydantic import BaseModel, ConfigDict, Field, ValidationError

from netsim_ddp.common.files import write_whole
from netsim_ddp.common.metrics import statistic
from netsim_ddp.common.version import __version__
from netsim_ddp.measure.machine import MachineInfo, content_digest, machine_warning, utc_now
from netsim_ddp.measure.target_time import REAL_TIME, emulation_label
from netsim_ddp.scenario.expectations import NEEDS_COMPUTE
from netsim_ddp.verdicts.gate import Tolerance, Verdict, regression_verdict
from netsim_ddp.verdicts.scenario_report import ScenarioReport

FORMAT = 1


class BaselineError(ValueError):
    """A baseline that cannot be used; the message names the file and what is wrong."""


def scenario_digest(report: ScenarioReport) -> str:
    """What the numbers depend on: network and workload (not names, descriptions, or the
    number of iterations measured)."""
    data = report.scenario.model_dump(mode="json", exclude={"name", "description", "fidelity"})
    if data.get("workload"):
        data["workload"].pop("iterations", None)
    return content_digest(data)


def _stats(samples: Sequence[float]) -> dict[str, object]:
    """pytest-benchmark's stats block for a list of seconds."""
    import statistics

    values = sorted(samples)
    n = len(values)
    q1, _, q3 = statistics.quantiles(values, n=4, method="inclusive") if n > 1 else (values * 3)
    iqr = q3 - q1
    mean = statistics.fmean(values)
    std = statistics.stdev(values) if n > 1 else 0.0
    low = min((v for v in values if v >= q1 - 1.5 * iqr), default=values[0])
    high = max((v for v in values if v <= q3 + 1.5 * iqr), default=values[-1])
    return {
        "min": values[0], "max": values[-1], "mean": mean, "stddev": std, "rounds": n,
        "median": statistics.median(values), "iqr": iqr, "q1": q1, "q3": q3,
        "iqr_outliers": sum(1 for v in values if v < low or v > high),
        "stddev_outliers": sum(1 for v in values if abs(v - mean) > std),
        "outliers": "", "ld15iqr": low, "hd15iqr": high, "ops": 1 / mean if mean else 0.0,
        "total": sum(values), "data": list(samples), "iterations": 1,
    }


def save(reports: Sequence[ScenarioReport], path: str | Path) -> Path:
    benchmarks = []
    for report in reports:
        for mode, result in report.modes.items():
            r = result.result
            benchmarks.append({
                "group": report.scenario.name,
                "name": f"{report.scenario.name}[{mode}]",
                "fullname": f"{report.scenario.path or report.scenario.name}::"
                            f"{report.scenario.name}[{mode}]",
                "params": {"mode": mode}, "param": mode, "options": {"timer": "perf_counter"},
                "stats": _stats(r.iteration_s),
                "extra_info": {"netsim_ddp": {
                    "scenario": report.scenario.name, "digest": scenario_digest(report),
                    "backend": _backend(r), "mode": mode, "iteration_s": r.iteration_s,
                    "comm_s": r.comm_s, "compute_s": r.compute_s, "collective_s": r.collective_s,
                    "wire_bytes_per_iteration": result.wire_bytes_per_iteration,
                    "emulation": emulation_label(report.dilation, report.compute_source)}},
            })
    document = {
        "machine_info": MachineInfo.of_this_host().dump(),
        "commit_info": {},
        "benchmarks": benchmarks,
        "datetime": utc_now(),
        "version": "5.1.0",  # the pytest-benchmark file format this follows
        "netsim_ddp": {"format": FORMAT, "version": __version__},
    }
    path = Path(path)
    path.parent.mkdir(parents=True, exist_ok=True)
    return write_whole(path, json.dumps(document, indent=1))  # never a half-written baseline


@dataclass(frozen=True)
class BaselineEntry:
    digest: str
    samples: dict[str, list[float]]
    wire_bytes_per_iteration: float
    backend: str | None = None  # gloo or nccl; None: saved before it was recorded
    emulation: str = REAL_TIME


FiniteSeconds = Annotated[float, Field(ge=0, allow_inf_nan=False)]


class _Saved(BaseModel):
    """One benchmark's netsim-ddp data, as `save` writes it."""

    model_config = ConfigDict(strict=True, allow_inf_nan=False)

    scenario: str
    mode: str
    digest: str
    backend: str | None = None  # baselines saved before it was recorded
    iteration_s: list[Annotated[float, Field(gt=0, allow_inf_nan=False)]] = Field(min_length=1)
    comm_s: list[FiniteSeconds] = Field(default_factory=list)  # empty: a user's script
    compute_s: list[FiniteSeconds] = Field(default_factory=list)
    collective_s: list[FiniteSeconds] | None = None  # baselines saved before it was measured
    wire_bytes_per_iteration: float = Field(ge=0)
    emulation: str = REAL_TIME  # baselines saved before scale models were: real time


class _ExtraInfo(BaseModel):
    netsim_ddp: _Saved


class _Benchmark(BaseModel):
    extra_info: _ExtraInfo


class _Document(BaseModel):
    """The parts of a baseline file netsim-ddp reads; pytest-benchmark's own fields pass."""

    benchmarks: list[_Benchmark] = Field(default_factory=list)
    machine_info: MachineInfo | None = None


class Baseline:
    def __init__(self, path: str | Path):
        self.path = Path(path)
        try:
            document = json.loads(self.path.read_text())
        except FileNotFoundError:
            raise BaselineError(f"{self.path}: no such baseline file; make one with "
                                "--save-baseline (netsim-ddp run) or --netsim-save-baseline "
                                "(pytest)") from None
        except (OSError, ValueError) as exc:
            raise BaselineError(f"{self.path}: not a readable baseline: {exc}") from None
        except RecursionError:
            raise BaselineError(f"{self.path}: not a readable baseline: nested too deeply"
                                ) from None
        meta = document.get("netsim_ddp") if isinstance(document, dict) else None
        if not isinstance(meta, dict) or "format" not in meta:
            raise BaselineError(f"{self.path}: not a netsim-ddp baseline (a plain "
                                "pytest-benchmark file has no netsim-ddp samples)")
        if meta["format"] != FORMAT:
            raise BaselineError(f"{self.path}: baseline format {meta['format']!r} (netsim-ddp "
                                f"{meta.get('version')!r}); this netsim-ddp reads format "
                                f"{FORMAT}: save a new baseline")
        try:
            parsed = _Document.model_validate(document)
        except ValidationError as exc:
            error = exc.errors(include_url=False)[0]
            where = ".".join(str(part) for part in error["loc"])
            raise BaselineError(f"{self.path}: {where}: {error['msg']} (a baseline written by "
                                "another tool or edited by hand? save a new one)") from None
        self.machine_info = parsed.machine_info
        self.entries: dict[tuple[str, str], BaselineEntry] = {}
        for bench in parsed.benchmarks:
            data = bench.extra_info.netsim_ddp
            if (len(data.comm_s) != len(data.compute_s)
                    or len(data.compute_s) not in (0, len(data.iteration_s))):
                raise BaselineError(f"{self.path}: {data.scenario}[{data.mode}]: iteration_s, "
                                    "comm_s and compute_s hold different numbers of samples")
            self.entries[(data.scenario, data.mode)] = BaselineEntry(
                data.digest,
                {"iteration_s": data.iteration_s}
                | ({"comm_s": data.comm_s, "compute_s": data.compute_s} if data.compute_s
                   else {})
                | ({"collective_s": data.collective_s} if data.collective_s is not None else {}),
                data.wire_bytes_per_iteration, data.backend, data.emulation)

    def machine_warning(self, current: MachineInfo | None = None) -> str | None:
        """A warning line naming the fields of `machine_info` (default: this host's) that
        differ from the host the baseline was measured on; None when they match."""
        return machine_warning(self.machine_info, current or MachineInfo.of_this_host(),
                               f"baseline {self.path}")

    def scenarios(self) -> set[str]:
        return {scenario for scenario, _ in self.entries}

    def compare(self, report: ScenarioReport, tolerances: Sequence[Tolerance],
                alpha: float) -> list[Verdict]:
        name = report.scenario.name
        if name not in self.scenarios():
            raise BaselineError(f"{self.path}: has no scenario {name!r} (it holds "
                                f"{', '.join(sorted(self.scenarios())) or 'none'}); save a "
                                "baseline of this scenario first")
        verdicts = []
        digest = scenario_digest(report)
        for mode, current in report.modes.items():
            entry = self.entries.get((name, mode))
            if entry is None:
                verdicts.append(Verdict(f"baseline:{mode}", False,
                                        f"{name}[{mode}]: not in baseline {self.path}"))
                continue
            backend = _backend(current.result)
            if None not in (entry.backend, backend) and entry.backend != backend:
                # 'auto' picks NCCL on a GPU host: gloo and NCCL numbers are never compared.
                verdicts.append(Verdict(
                    f"baseline:{mode}", False,
                    f"{name}[{mode}]: the baseline ran on {entry.backend}, this run on "
                    f"{backend}: not compared; save a baseline on {backend}, or set "
                    f"workload.backend = '{entry.backend}'"))
                continue
            emulation = emulation_label(report.dilation, report.compute_source)
            if entry.emulation != emulation:
                raise BaselineError(
                    f"{self.path}: {name}[{mode}] was saved from a run in {entry.emulation}, "
                    f"this run is in {emulation}: a scale model's times are not comparable "
                    "with another dilation or compute source; save a baseline of this kind")
            note = ("" if entry.digest == digest else
                    " (the baseline was taken with a different network or workload)")
            if entry.backend is None:
                note += " (the baseline did not record its backend)"
            for tolerance in tolerances:
                verdict = regression_verdict(name, mode, tolerance, current,
                                             _baseline_value(tolerance, entry),
                                             _baseline_samples(tolerance, entry), alpha)
                verdicts.append(Verdict(verdict.name, verdict.passed, verdict.detail + note,
                                        verdict.p_value))
        return verdicts


def _backend(result: Any) -> str | None:
    """The backend a mode's ranks used; None for a result built without one (model_construct
    in tests and tools that fill only the series)."""
    return getattr(result, "backend", None)


def _baseline_samples(tolerance: Tolerance, entry: BaselineEntry) -> list[float] | None:
    series = tolerance.metric.series
    if series in NEEDS_COMPUTE and "compute_s" not in entry.samples:
        raise BaselineError(f"{entry.digest}: {series} was not measured (a user's script has "
                            "no compute-only steps); gate it on iteration_s, collective_s or "
                            "wire_bytes_per_iteration")
    if series == "scaling_efficiency":
        return [c / i for c, i in zip(entry.samples["compute_s"], entry.samples["iteration_s"],
                                      strict=True)]
    samples = entry.samples.get(series)
    if samples is None and series == "collective_s":
        raise BaselineError(f"{entry.digest}: this baseline has no collective_s (saved by an "
                            "older netsim-ddp); save a new baseline to gate on it")
    return samples


def _baseline_value(tolerance: Tolerance, entry: BaselineEntry) -> float:
    if tolerance.metric.stat is None:
        return entry.wire_bytes_per_iteration
    samples = _baseline_samples(tolerance, entry)
    assert samples is not None  # every series that takes a statistic has samples
    return statistic(samples, tolerance.metric.stat)
