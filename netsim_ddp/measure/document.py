"""The results' shape, defined once: what `netsim-ddp run --json` writes and every reader loads.

The runtime objects (ScenarioReport, ModeReport, CollectiveFidelity, Verdict, SweepReport)
turn themselves into these records with `to_record()`; plots, timeline,
report and the history tool read the records back with `load_document`, so a key is named in
one place and a malformed file fails in one place, naming the file and the field.

Versions: a document without `version` was written before the schema was versioned (1); 2
adds `created_at`, `machine_info` and each scenario's `scenario_digest`. Keys are only ever
added, and unknown keys pass through untouched, so an older reader still reads a newer file's
known parts and CI scripts that read today's keys keep working.

This module imports nothing else of netsim-ddp but its base (record.py) and the host's record
(machine.py), whose names it hands on: everything else may import it.
"""

from __future__ import annotations

import datetime
import json
from pathlib import Path
from typing import Any

from pydantic import (
    AliasChoices,
    Field,
    ValidationError,
    field_validator,
    model_validator,
)

from netsim_ddp.common.files import write_whole
from netsim_ddp.measure.attribution import TailAttribution
from netsim_ddp.measure.machine import (
    MachineInfo,
    utc_now,
)
from netsim_ddp.measure.record import CheckKind, DocumentError, Finite, Record, Status

SCHEMA_VERSION = 2
LEGACY_VERSION = 1  # documents written before `version` existed


# -- one scenario ------------------------------------------------------------------------------

class SummaryRecord(Record):
    """metrics.Summary of one series."""

    n: int = 0
    mean: Finite = 0.0
    median: Finite
    std: Finite = 0.0
    p5: Finite = 0.0
    p95: Finite = 0.0
    iqr: Finite = 0.0
    min: Finite = 0.0
    max: Finite = 0.0
    p99: Finite = 0.0  # the tail (common.tails); 0 in documents written before it
    cv: Finite = 0.0
    slow_share: Finite = 0.0


class SeriesSummaries(Record):
    _omit_none = frozenset({"collective_s", "comm_s", "compute_s"})

    iteration_s: SummaryRecord
    comm_s: SummaryRecord | None = None  # absent: a user's script (no compute-only steps)
    compute_s: SummaryRecord | None = None
    collective_s: SummaryRecord | None = None  # absent: no collective timing in that result


class StragglerRow(Record):
    """Per iteration: the rank (and node) whose backward finished last, and the wait."""

    rank: int
    node: str | None = None
    wait_s: float


class StragglerSummary(Record):
    rank: int
    node: str | None = None
    iterations: int  # how often it straggled ...
    of: int  # ... of this many iterations
    median_wait_s: float
    max_wait_s: float


class LinkBytesRecord(Record):
    """What one node's NIC sent in the measured window, as its local rank 0 read it."""

    rank: int
    hostname: str | None = None
    node_rank: int | None = None  # the scenario's node (None: not recorded by the ranks)
    sent_bytes: float
    sent_packets: float
    window_s: float


class TcpCountersRecord(Record):
    """What the kernel's TCP did in one node's namespace during a mode's measured window:
    the growth of each counter of fabric.tcp_counters.COUNTERS (RetransSegs, TCPTimeouts, ...:
    the kernel's names), read by the node's local rank 0 at the window's edges. The node's
    background flows count too. A counter the kernel lacks is absent."""

    rank: int
    hostname: str | None = None
    node_rank: int | None = None  # the scenario's node (None: not recorded by the ranks)
    counters: dict[str, int]


class ScriptRecord(Record):
    """A user's script's run: command, variant, what the harness saw of it."""

    command: list[str]
    variant_args: list[str] = Field(default_factory=list)
    variant_env: dict[str, str] = Field(default_factory=dict)
    steps: str
    ddp_models: int = 0
    comm_hooks: list[str] = Field(default_factory=list)
    optimizers: list[str] = Field(default_factory=list)
    step_wire_bytes: list[int] | None = None


class ModeRecord(Record):
    """One mode: its raw series, their summaries, the wire accounting and derived numbers."""

    _omit_none = frozenset({"script"})

    iteration_s: list[Finite]
    comm_s: list[Finite] = Field(default_factory=list)  # empty: a user's script
    compute_s: list[Finite] = Field(default_factory=list)
    collective_s: list[Finite] | None = None
    bucket_s: list[list[float]] | None = None
    iteration_start_s: list[float] | None = None  # from the first iteration's start
    summary: SeriesSummaries
    wire_bytes_per_iteration: Finite
    background_bytes_per_iteration: float = 0.0
    hook_bytes_per_iteration: float = 0.0
    stragglers: list[StragglerRow] | None = None
    straggler_summary: StragglerSummary | None = None
    attribution: TailAttribution | None = None  # the slow iterations and their causes
    link_states: list[str] | None = None
    scaling_efficiency: Finite | None = None  # None: a user's script
    busbw_bps: float | None = 0.0
    busbw_over_link: float | None = 0.0
    ring_lower_bound_s: float = 0.0
    comm_over_ring_lower_bound: float | None = None
    samples_per_iteration: int = 0
    seconds_per_sample: float = 0.0
    params: int = 0
    world_size: int = 0
    iterations: int = 0
    skipped_steps: int = 0
    profiler_allreduce_s: list[float] | None = None
    link_bytes: list[LinkBytesRecord] = Field(default_factory=list)
    tcp_counters: list[TcpCountersRecord] | None = None  # None: not read (older results)
    script: ScriptRecord | None = None  # how a user's script ran (its variant)

    @model_validator(mode="after")
    def _summaries_of_the_series(self) -> ModeRecord:
        for name in ("comm_s", "compute_s"):
            if getattr(self, name) and getattr(self.summary, name) is None:
                raise ValueError(f"summary.{name}: missing, while {name} holds "
                                 f"{len(getattr(self, name))} samples")
        return self
    # Scale model (measure.target_time): times above are the target's; the host's beside them.
    dilation: float = 1.0
    compute_source: str = "real"
    host_s: dict[str, list[float]] | None = None
    replay_late_s: list[float] | None = None  # per iteration, max over ranks (target s)


class CheckRecord(Record):
    """A verdict (gate.Verdict): a check's name, outcome and the numbers behind it."""

    _omit_none = frozenset({"kind"})

    name: str
    passed: bool
    detail: str
    p_value: float | None = None
    kind: CheckKind | None = None  # "host": a check of the emulation; absent: of the code


class CpuLoadRecord(Record):
    busy: float
    steal: float
    softirq: float


class FidelityRecord(Record):
    """The all-reduce probe (measure.probe.CollectiveFidelity) against the slowest link."""

    size_bytes: int
    world_size: int
    busbw_bps: float
    attempts_bps: list[float]
    dtype_bps: list[dict[str, float]] = Field(default_factory=list)
    expected_bps: float
    fraction: float
    min_fraction: float
    trusted: bool
    host_load: CpuLoadRecord | None = None
    reason: str


class NetworkRecord(Record):
    """Each node's delay stage, and the delay-line forwarders' final counters."""

    delay_backends: dict[str, str | None] = Field(default_factory=dict)
    delay_line: dict[str, dict[str, Any]] = Field(default_factory=dict)
    # Per node, the TCP settings its namespace held, read back from the kernel after the
    # fabric wrote [link.tcp] dilated by k (fabric.tcp_clocks.RECORDED; "route:RTAX_..." the
    # metrics on its routes).
    tcp: dict[str, dict[str, str | int]] = Field(default_factory=dict)
    # [link] busbw_from: the user's nccl-tests file, the job's sizes with the file's and the
    # probe's bus bandwidth at each (target time), the links' rate and delay for it.
    busbw_from: dict[str, Any] | None = None
    # [topology] racks: per rack and direction ("r0 up": rack -> spine), what its uplink's
    # qdisc passed and dropped over the whole run (probe and every mode).
    uplinks: dict[str, dict[str, int | None]] = Field(default_factory=dict)


class LinkChangeRecord(Record):
    mode: str
    label: str
    at_s: float  # planned offset in the window
    offset_s: float  # when it was applied, from the window's start
    monotonic_s: float


class ScheduleWindowRecord(Record):
    """One mode's measured window as [[link.schedule]] saw it."""

    mode: str
    start_monotonic: float
    end_monotonic: float | None = None
    changes: list[LinkChangeRecord] = Field(default_factory=list)


class PlacementRecord(Record):
    """Backend and GPUs the ranks got (placement.Placement)."""

    requested: str
    backend: str
    gpus: dict[str, Any] | None = None
    shared_gpus: bool = False
    shared_gpu_note: str | None = None  # what sharing does to the times, when GPUs are shared
    host_gpus: dict[str, Any] = Field(default_factory=dict)
    refused: str | None = None
    note: str | None = None
    nccl_pinned: dict[str, str] | None = None  # what the harness pinned (NCCL_ALGO, ...)
    summary: str = ""


class TransportRecord(Record):
    """NCCL's own account of how it joined the nodes (hostfacts.nccl.TransportEvidence)."""

    ok: bool
    summary: str
    version: str | None = None
    interfaces: list[str] = Field(default_factory=list)
    networks: list[str] = Field(default_factory=list)
    nccl_nodes: list[int] = Field(default_factory=list)
    cross_node_transports: list[str] = Field(default_factory=list)
    problems: list[str] = Field(default_factory=list)
    evidence: list[str] = Field(default_factory=list)


class _Judged(Record):
    """A record with a status; `passed` (which CI scripts read) follows from it when absent."""

    @model_validator(mode="before")
    @classmethod
    def _passed_from_status(cls, data: Any) -> Any:
        if isinstance(data, dict) and "passed" not in data and "status" in data:
            data = {**data, "passed": data["status"] == "passed"}
        return data


class EmulationRecord(Record):
    """A scale-model run: its dilation (and how it was chosen) and where compute came from."""

    dilation: float
    compute_source: str
    notice: str
    chosen: str | None = None  # dilation = "auto": which k, and why


class ScenarioRecord(_Judged):
    """One scenario's run: its status, every mode's numbers, every check."""

    _omit_none = frozenset({"scenario_digest", "emulation", "untrusted", "retried"})

    name: str
    file: str | None = None
    passed: bool = False
    status: Status
    refused: str | None = None
    untrusted: str | None = None  # why this host could not be trusted, and what to try
    retried: str | None = None  # what was measured again before this outcome, and why
    error: str | None = None
    run_id: str = ""
    out_dir: str | None = None
    fidelity: FidelityRecord | None = None
    host_load: CpuLoadRecord | None = None
    network: NetworkRecord = Field(default_factory=NetworkRecord)
    link_schedule: list[ScheduleWindowRecord] | None = None
    hosts: dict[str, dict[str, Any]] | None = None  # multi-host: per node, its host and NIC
    placement: PlacementRecord | None = None
    transport: TransportRecord | None = None
    modes: dict[str, ModeRecord] = Field(default_factory=dict)
    checks: list[CheckRecord] = Field(default_factory=list)
    scenario: dict[str, Any] | None = None  # the validated scenario, as JSON
    scenario_digest: str | None = None  # content_digest(scenario): changes when the file does
    emulation: EmulationRecord | None = None  # a scale-model run (dilated or replayed)

    def schedule_changes(self, mode: str) -> list[LinkChangeRecord]:
        """The link changes [[link.schedule]] made in `mode`'s window."""
        for window in self.link_schedule or []:
            if window.mode == mode:
                return window.changes
        return []


# -- sweeps ------------------------------------------------------------------------------------

class PointModeRecord(Record):
    """One mode at one sweep point: medians and what the cost model is fitted on."""

    step_s: float
    compute_s: float
    comm_s: float
    comm_sd_s: float
    scaling_efficiency: float
    throughput_samples_s: float
    wire_bytes_per_iteration: float
    hook_bytes_per_iteration: float
    buckets: int
    params: int


class SweepPointRecord(Record):
    values: dict[str, Any]
    label: str
    world_size: int
    seconds: float = 0.0
    status: Status
    modes: dict[str, PointModeRecord] = Field(default_factory=dict)
    scenario: ScenarioRecord


class CostModelRecord(Record):
    alpha_s: float
    bandwidth_efficiency: float
    overlap: float


class StepPointRecord(Record):
    """costmodel.StepPoint: one measured (or predicted) configuration of one mode."""

    mode: str
    world_size: int
    link_bps: float
    bytes_per_rank: float
    buckets: int
    compute_s: float
    step_s: float | None = None
    label: str = ""
    step_samples: list[float] = Field(default_factory=list)


class FitRecord(Record):
    model: CostModelRecord
    method: str = ""
    fitted_points: list[StepPointRecord] = Field(default_factory=list)
    relative_residuals: list[float] = Field(default_factory=list)
    rms_relative_error: float
    condition: float
    identifiable: bool


class HeldOutPointRecord(StepPointRecord):
    """One point held out of the fit: the step time predicted without it, against measured."""

    predicted_s: float
    error: float
    measured_interval_s: list[float] | None = None
    missed: bool = False
    predicted_efficiency: float
    measured_efficiency: float | None = None


class HeldOutCheckRecord(Record):
    """The held-out check of a fit: every held-out point, the worst error, and its verdict."""

    fit: FitRecord
    held_out: list[HeldOutPointRecord]
    errors_by_mode: dict[str, float] = Field(default_factory=dict)
    max_abs_error: float
    target: float
    within_target: bool
    met: bool = True
    verdict: str | None = None


class CalibrationSizeRecord(Record):
    size: int
    measured_s: float
    modelled_s: float
    error: float
    held_out_s: float | None = None
    held_out_error: float | None = None


class ClusterRecord(Record):
    """cluster.Cluster: the servers a calibrated projection runs on (network and NVLink)."""

    gpus_per_server: int
    gpus_source: str = ""
    nvlink: dict[str, Any] = Field(default_factory=dict)
    intra_calibrations: list[CalibrationRecord] = Field(default_factory=list)
    notes: list[str] = Field(default_factory=list)
    nics: dict[str, Any] = Field(default_factory=dict)  # cluster.Nics: per_server, bits_per_s
    network: dict[str, Any] = Field(default_factory=dict)  # cluster.NetworkLevel: as a ring
    flags: list[str] = Field(default_factory=list)  # cannot be extrapolated honestly, and why


class CalibrationRecord(Record):
    """calibrate.Calibration: nccl-tests all-reduce times of a real cluster."""

    _omit_none = frozenset({"cluster"})

    collective: str
    world_size: int
    hosts: int
    gpus_per_host: int = 1
    devices: list[str] = Field(default_factory=list)
    sources: list[str]
    method: str
    busbw_bytes_per_s: float
    tail_algbw_bytes_per_s: float | None = None
    sizes: list[CalibrationSizeRecord]
    max_abs_error_from_1MiB: float | None = None
    max_abs_held_out_error_from_1MiB: float | None = None
    alpha_beta_line: dict[str, float] = Field(default_factory=dict)
    cluster: ClusterRecord | None = None  # a projection's network calibration: its servers


class ProjectionRow(Record):
    _omit_none = frozenset({"step_s_typical_alpha", "efficiency_typical_alpha", "servers",
                            "gpus_per_server", "nvlink_s", "network_s"})

    mode: str
    gpus: int
    link_bps: float  # 0 in a calibrated projection: the calibrated cluster's own links
    step_s: float
    allreduce_s: float
    exposed_comm_s: float
    efficiency: float
    algorithm: str = "flat ring"
    step_s_typical_alpha: float | None = None  # with a typical NCCL per-hop latency
    efficiency_typical_alpha: float | None = None
    servers: int | None = None  # calibrated: the servers the GPUs fill, and how many each holds
    gpus_per_server: int | None = None
    nvlink_s: float | None = None  # hierarchical and NVLink-only rows: the two levels' shares
    network_s: float | None = None


class ProjectionRecord(Record):
    """costmodel.Projection: scaling efficiency at cluster sizes not measured, labelled."""

    label: str
    model: CostModelRecord
    assumptions: list[str] = Field(default_factory=list)
    alpha_source: str = ""
    compute_s: dict[str, float]
    bytes_per_rank: dict[str, float]
    buckets: dict[str, int]
    calibration: CalibrationRecord | None = None
    typical_alpha_s: float | None = None
    notes: list[str] = Field(default_factory=list)
    rows: list[ProjectionRow]


class SweepRecord(_Judged):
    """A scenario run at several points, the cost model fitted on them and its projection."""

    name: str
    file: str | None = None
    passed: bool = False
    status: Status
    refusals: list[str] = Field(default_factory=list)
    host_steal: float = 0.0
    seconds: float = 0.0
    axes: dict[str, Any] | list[str]
    config: dict[str, Any] = Field(default_factory=dict)
    points: list[SweepPointRecord]
    fit: FitRecord | None = None
    # Results saved before the rename spell it `holdout`.
    held_out: HeldOutCheckRecord | None = Field(
        None, validation_alias=AliasChoices("held_out", "holdout"))
    projection: ProjectionRecord | None = None
    notes: list[str] = Field(default_factory=list)



# -- the document ------------------------------------------------------------------------------

class ResultsDocument(Record):
    """What `netsim-ddp run --json` (and the plugin's --netsim-json) writes."""

    _omit_none = frozenset({"created_at", "machine_info"})

    version: int = LEGACY_VERSION
    netsim_ddp: str | None = None  # the netsim-ddp version that wrote it
    created_at: str | None = None  # UTC, ISO 8601: when the run's document was made
    machine_info: MachineInfo | None = None
    scenarios: list[ScenarioRecord] = Field(default_factory=list)
    sweeps: list[SweepRecord] = Field(default_factory=list)

    @field_validator("version")
    @classmethod
    def _known_version(cls, value: int) -> int:
        if not LEGACY_VERSION <= value <= SCHEMA_VERSION:
            raise ValueError(f"schema version {value}; this netsim-ddp reads versions "
                             f"{LEGACY_VERSION}-{SCHEMA_VERSION} (a newer netsim-ddp wrote it?)")
        return value

    @field_validator("created_at")
    @classmethod
    def _iso_time(cls, value: str | None) -> str | None:
        if value is not None:
            datetime.datetime.fromisoformat(value)  # ValueError names the field
        return value

    @classmethod
    def new(cls, tool_version: str, scenarios: list[ScenarioRecord],
            sweeps: list[SweepRecord]) -> ResultsDocument:
        """A document of this run, stamped with the time and this host."""
        return cls(version=SCHEMA_VERSION, netsim_ddp=tool_version, created_at=utc_now(),
                   machine_info=MachineInfo.of_this_host(), scenarios=scenarios, sweeps=sweeps)

    def to_json(self) -> str:
        return json.dumps(self.dump(), indent=2)


def parse_document(data: Any, source: str | Path = "<document>") -> ResultsDocument:
    """A document from parsed JSON; DocumentError naming `source` and the first bad field."""
    try:
        return ResultsDocument.model_validate(data)
    except ValidationError as exc:
        error = exc.errors(include_url=False)[0]
        where = ".".join(str(part) for part in error["loc"]) or "(document)"
        raise DocumentError(f"{source}: {where}: {error['msg']}") from None


def load_document(path: str | Path) -> ResultsDocument:
    """A results document from its file; DocumentError naming the file and the field if it
    is unreadable or not one."""
    try:
        data = json.loads(Path(path).read_text())
    except (OSError, UnicodeDecodeError, ValueError) as exc:
        raise DocumentError(f"{path}: cannot read: {exc}") from None
    except RecursionError:
        raise DocumentError(f"{path}: cannot read: nested too deeply") from None
    return parse_document(data, path)


def save(document: ResultsDocument, path: str | Path) -> Path:
    """Write atomically: a reader never sees half a document."""
    path = Path(path)
    path.parent.mkdir(parents=True, exist_ok=True)
    return write_whole(path, document.to_json() + "\n")


__all__ = ["LEGACY_VERSION", "SCHEMA_VERSION", "CalibrationRecord", "CheckRecord", "CpuLoadRecord",
           "FidelityRecord", "FitRecord", "HeldOutPointRecord", "HeldOutCheckRecord",
           "LinkBytesRecord", "LinkChangeRecord", "ModeRecord", "NetworkRecord", "PlacementRecord",
           "PointModeRecord", "ProjectionRecord", "ProjectionRow", "ResultsDocument",
           "ScenarioRecord", "ScheduleWindowRecord", "SeriesSummaries", "StepPointRecord",
           "StragglerRow", "StragglerSummary", "SummaryRecord", "SweepPointRecord", "SweepRecord",
           "TcpCountersRecord", "TransportRecord", "load_document", "parse_document", "save"]
