"""Scenario files: a typed, validated model of one emulated cluster network, loaded from TOML.

Validation is pydantic's; the parsers for the units people write live in `units`. Every error
becomes a `ScenarioError` that names the file, the field and the reason, raised before anything
is created in the kernel.
"""

from __future__ import annotations

import ipaddress
import json
import re
import tomllib
from dataclasses import dataclass
from pathlib import Path
from typing import Annotated, Any, Literal

from pydantic import (
    AfterValidator,
    BaseModel,
    BeforeValidator,
    ConfigDict,
    Field,
    PrivateAttr,
    ValidationError,
    WithJsonSchema,
    field_validator,
    model_validator,
)

from netsim_ddp.scenario import units
from netsim_ddp.scenario.compute_noise import check_episode_nodes
from netsim_ddp.scenario.expectations import NEEDS_COMPUTE, Expectation
from netsim_ddp.scenario.script_scale import SCRIPT_REPLAY_FIELDS, check_script_scale_model
from netsim_ddp.scenario.sweep_spec import SweepConfig
from netsim_ddp.scenario.tcp import TcpConfig, rto_bound_problem
from netsim_ddp.scenario.units import ETHERNET_HEADER
from netsim_ddp.scenario.workload import WorkloadConfig

# tbf carries the rate in a 32-bit field of bytes per second; below 1 kB/s a single frame takes
# longer than a second to send and the rate in whole bytes per second loses its precision.
MAX_RATE_BPS = (2**32 - 1) * 8
MIN_RATE_BPS = 8_000
# A Linux bridge has 1024 port numbers (BR_PORT_BITS = 10) and port 0 is never used.
MAX_NODES = 1023
# Longer than any real network path; a collective waiting on it would hit its own timeout.
MAX_DELAY_S = 10.0
# Background on/off periods and probe lengths: an hour is more than any run lasts.
MAX_PERIOD_S = 3600.0
# tc's queue limit is a 32-bit count of bytes.
MAX_QUEUE_BYTES = 2**32 - 1
MAX_BACKGROUND_FLOWS = 256
MAX_SWEEP_POINTS = 100
# Names the fabric gives its own objects: a node of that name would collide with them. The
# switch port of node X is "nsd-X", so node "br" would be named like the bridge ("nsd-br");
# "sw" is the switch's namespace role, "probe" the capability probe's (see fabric.naming).
RESERVED_NODE_NAMES = frozenset({"sw", "br", "probe"})
# A scenario's name becomes a folder under --out (and sweep points add "[2 nodes, 1e+08bit]"):
# letters, digits and a few punctuation marks, never a path separator or a leading dot.
_SAFE_NAME = re.compile(r"^[A-Za-z0-9_][A-Za-z0-9_.,+=@ ()\[\]-]*$")
# A node's switch port is named "nsd-<node>" and Linux interface names hold 15 characters.
IFNAMSIZ = 15
SWITCH_PORT_PREFIX = "nsd-"
MAX_NODE_NAME = IFNAMSIZ - len(SWITCH_PORT_PREFIX)
DEFAULT_QUEUE_PACKETS = 1000  # the kernel's default txqueuelen
# A 10/25GbE ToR's per-port share of its shared buffer (9-32 MB over 32-64 ports, a few hundred
# KB each when all ports are busy), for the racks' uplinks (docs/jitter.md).
TOR_QUEUE = "512KiB"


def _rate_in_range(bits: float) -> float:
    if not MIN_RATE_BPS <= bits <= MAX_RATE_BPS:
        raise ValueError(f"{units.format_rate(bits)} is outside what tbf can shape: "
                         f"{units.format_rate(MIN_RATE_BPS)} to {units.format_rate(MAX_RATE_BPS)}")
    return bits


# The scenario's own bounds on the shared unit types: what tbf and the delay line can do.
Rate = Annotated[units.Rate, AfterValidator(_rate_in_range)]
Duration = Annotated[units.Duration, Field(le=MAX_PERIOD_S)]
Delay = Annotated[Duration, Field(le=MAX_DELAY_S)]
Percent = units.Percent
def _queue_limit(value: object) -> int | str:
    """Packets (a plain integer) or bytes with a unit; positive, and within tc's 32-bit limit
    for the largest frame (checked again in bytes once the MTU is known)."""
    if isinstance(value, bool) or not isinstance(value, (int, str)):
        raise ValueError("write a number of packets (1000) or bytes with a unit ('2MiB'), "
                         f"got {value!r}")
    amount = value if isinstance(value, int) else units.parse_size(value)
    if amount <= 0:
        raise ValueError("must be positive")
    if amount > MAX_QUEUE_BYTES:
        raise ValueError(f"{value!r} is more than tc's queue limit of {MAX_QUEUE_BYTES} bytes")
    return value


QueueLimit = Annotated[
    int | str,
    BeforeValidator(_queue_limit),
    WithJsonSchema({"type": ["integer", "string"],
                    "description": "packets as an integer (1000) or bytes with a unit ('2MiB')"}),
]


def queue_limit_bytes(limit: int | str | None, frame_bytes: int) -> int:
    """Bytes a queue holds: packets x frame size, or the size given."""
    if limit is None:
        return DEFAULT_QUEUE_PACKETS * frame_bytes
    if isinstance(limit, int):
        return limit * frame_bytes
    return units.parse_size(limit)


JitterDistribution = Literal["uniform", "normal", "pareto", "paretonormal"]
DelayBackend = Literal["auto", "netem", "delay-line"]


class ScenarioError(ValueError):
    """A scenario that cannot be used: names the file, the field and the reason."""

    def __init__(self, path: str | Path | None, field: str, reason: str):
        self.path = str(path) if path is not None else "<scenario>"
        self.field = field
        self.reason = reason
        super().__init__(f"{self.path}: {field}: {reason}")


class _Strict(BaseModel):
    # strict: TOML's `true` is not the number 1, nor "2" the integer 2; no nan or infinity.
    model_config = ConfigDict(extra="forbid", frozen=True, strict=True, allow_inf_nan=False)


class LinkShape(_Strict):
    """What a link does to traffic. Every field may be overridden per node."""

    rate: Rate | None = Field(None, description="Line rate of the node's NIC, both directions.")
    delay: Delay | None = Field(None, description="One-way delay added on each direction.")
    jitter: Delay | None = Field(None, description="Random variation of the delay (+-).")
    loss: Percent | None = Field(None, description="Probability that a packet is dropped.")
    jitter_distribution: JitterDistribution | None = Field(
        None, description="How the delay varies within +-jitter: uniform (default), normal, "
        "pareto or paretonormal, as netem offers.")
    queue_limit: QueueLimit | None = Field(
        None, description="Queue in front of the link: packets (int) or bytes ('2MiB')."
    )


class LinkOverride(LinkShape):
    """A different link for one node, e.g. one slow node in an otherwise uniform cluster."""

    node: str | int = Field(description="Node name or index (0-based).")


class LinkChange(_Strict):
    """A change to the links during a run, at an offset from the start of every mode's
    measured window (every mode meets the same schedule). Applied in place (tc change), so
    no traffic passes unshaped while it happens."""

    at: Duration = Field(description="When, from the start of each mode's measured window.")
    node: str | int | None = Field(None, description="Node name or index; default: every node.")
    rate: Rate | None = None
    delay: Duration | None = None
    jitter: Duration | None = None
    loss: Percent | None = None
    queue_limit: QueueLimit | None = None
    down: Duration | None = Field(
        None, gt=0, description="A flap: the link carries next to nothing for this long, then "
        "returns to what it was.")

    @model_validator(mode="after")
    def _changes_something(self) -> LinkChange:
        changes = [name for name in ("rate", "delay", "jitter", "loss", "queue_limit")
                   if getattr(self, name) is not None]
        if not changes and self.down is None:
            raise ValueError("give at least one of rate, delay, jitter, loss, queue_limit or "
                             "down")
        if changes and self.down is not None:
            raise ValueError(f"down is a flap that restores the link afterwards; set "
                             f"{', '.join(changes)} in a separate entry")
        return self


class LinkConfig(LinkShape):
    """The link every node has, unless an override says otherwise."""

    rate: Rate = Field(description="Line rate of each node's NIC, both directions, e.g. '1gbit'.")
    delay: Delay = 0.0
    jitter: Delay = 0.0
    loss: Percent = 0.0
    jitter_distribution: JitterDistribution = "uniform"
    mtu: int = Field(1500, ge=68, le=65535, description="MTU of every NIC and the switch.")
    delay_backend: DelayBackend = Field(
        "auto", description="What applies delay, jitter and loss: the kernel's netem, or the "
        "userspace delay line (for kernels without netem); auto picks netem where it exists.")
    override: list[LinkOverride] = Field(default_factory=list)
    schedule: list[LinkChange] = Field(
        default_factory=list, description="Changes to the links during each measured window, "
        "in order of `at`.")
    tcp: TcpConfig = Field(default_factory=TcpConfig, description="The target's TCP settings "
                           "in every node (a scale model dilates them by k).")
    busbw_from: str | None = Field(
        None, description="The target's transport instead of the line rate: an nccl-tests "
        "all_reduce_perf output measured on the target cluster (relative to the scenario "
        "file). The links then get the rate and latency at which an all-reduce delivers that "
        "file's bus bandwidth at the job's DDP bucket sizes, and the all-reduce probe checks "
        "it at each size (fidelity:busbw). See docs/scale-model.md.")


class EffectiveLink(_Strict):
    """A node's link once overrides are applied: every field set."""

    rate: float
    delay: float
    jitter: float
    loss: float
    jitter_distribution: JitterDistribution
    queue_limit_bytes: int
    mtu: int

    @property
    def impaired(self) -> bool:
        return self.delay > 0 or self.jitter > 0 or self.loss > 0


class Uplink(_Strict):
    """The link from each rack's switch to the spine, both directions: where the traffic
    between racks meets (oversubscribed when the rack's nodes together send more than it)."""

    rate: Rate = Field(description="Rate of each rack's uplink, e.g. '40gbit' for 8 x 10GbE "
                       "nodes at 2:1 oversubscription.")
    queue_limit: QueueLimit = Field(
        TOR_QUEUE, description="Each direction's queue: bytes ('512KiB') or packets (int). "
        "Default: a 10/25GbE ToR's share of its shared buffer per port (a few hundred KB; "
        "docs/jitter.md).")


class Topology(_Strict):
    nodes: int = Field(ge=1, description="Emulated hosts, one network namespace "
                       f"each; at most {MAX_NODES}, the ports of a Linux bridge.")
    ranks_per_node: int = Field(1, ge=1, description="DDP ranks sharing each node's NIC.")
    names: list[str] | None = Field(
        None, description=f"Node names (default n0, n1, ...), at most {MAX_NODE_NAME} characters."
    )
    subnet: ipaddress.IPv4Network | None = Field(
        None, strict=False,
        description="IPv4 subnet of the nodes; default: a free /24 chosen per run."
    )

    racks: int = Field(1, ge=1, description="Rack switches the nodes sit behind, joined by "
                       "[topology.uplink] to one spine; nodes fill racks in order (rack_of "
                       "to choose).")
    rack_of: list[int] | None = Field(
        None, description="Each node's rack (0-based), in node order; default: contiguous "
        "blocks, as schedulers place a job.")
    uplink: Uplink | None = Field(None, description="Each rack's uplink; required with racks > 1.")

    @field_validator("nodes")
    @classmethod
    def _bridge_ports(cls, nodes: int) -> int:
        if nodes > MAX_NODES:
            raise ValueError(f"{nodes} nodes asked; a Linux bridge holds at most {MAX_NODES} "
                             "ports, one per node")
        return nodes

    @field_validator("names")
    @classmethod
    def _valid_names(cls, names: list[str] | None) -> list[str] | None:
        if names is None:
            return names
        for name in names:
            if len(name) > MAX_NODE_NAME:
                raise ValueError(
                    f"node name {name!r} is {len(name)} characters; interface names allow "
                    f"{IFNAMSIZ} and the switch port adds {SWITCH_PORT_PREFIX!r}, so use at most "
                    f"{MAX_NODE_NAME}"
                )
            if not name or not (name[0].isalpha() and name.isascii()
                                and all(c.isalnum() or c in "_-" for c in name)):
                raise ValueError(f"node name {name!r}: use letters, digits, '-' and '_', "
                                 "starting with a letter")
        reserved = RESERVED_NODE_NAMES.intersection(names)
        if reserved:
            raise ValueError(f"node name {sorted(reserved)[0]!r} is the name of one of the "
                             "switch's own objects; choose another (reserved: "
                             f"{', '.join(sorted(RESERVED_NODE_NAMES))})")
        if len(set(names)) != len(names):
            raise ValueError("node names must be unique")
        return names

    @model_validator(mode="after")
    def _consistent(self) -> Topology:
        if self.names is not None and len(self.names) != self.nodes:
            raise ValueError(f"names lists {len(self.names)} nodes but nodes = {self.nodes}")
        capacity = (self.subnet.num_addresses - 2) if self.subnet is not None else 254
        if self.nodes > capacity:
            where = f"subnet {self.subnet}" if self.subnet else "the default /24 subnet"
            raise ValueError(f"{self.nodes} nodes do not fit in {where}, which holds {capacity}; "
                             "set topology.subnet to a larger one")
        self._check_racks()
        return self

    def _check_racks(self) -> None:
        if self.racks > self.nodes:
            raise ValueError(f"racks = {self.racks} but only {self.nodes} nodes: every rack "
                             "needs a node; lower topology.racks")
        if self.racks > 1 and self.uplink is None:
            raise ValueError(f"racks = {self.racks} needs [topology.uplink] rate = ... (the "
                             "racks' link to the spine)")
        if self.racks == 1 and (self.uplink is not None or self.rack_of is not None):
            raise ValueError("uplink and rack_of need racks >= 2; set topology.racks")
        if self.rack_of is not None:
            if len(self.rack_of) != self.nodes:
                raise ValueError(f"rack_of lists {len(self.rack_of)} nodes but nodes = "
                                 f"{self.nodes}")
            if sorted(set(self.rack_of)) != list(range(self.racks)):
                raise ValueError(f"rack_of must put at least one node in each of racks "
                                 f"0..{self.racks - 1}: {self.rack_of}")

    @property
    def node_racks(self) -> list[int]:
        """Each node's rack, in node order."""
        if self.rack_of is not None:
            return list(self.rack_of)
        return [index * self.racks // self.nodes for index in range(self.nodes)]

    @property
    def node_names(self) -> list[str]:
        return list(self.names) if self.names else [f"n{i}" for i in range(self.nodes)]


class FidelityConfig(_Strict):
    """The throughput probe that checks the host, not the link, is not the bottleneck."""

    enabled: bool = True
    min_fraction: float = Field(
        0.9, gt=0, le=1,
        description="Least achieved/expected goodput for a run to be trusted.",
    )
    probe_duration: Duration = Field(1.0, description="How long the throughput probe runs.")
    attempts: int = Field(
        3, ge=1, le=10,
        description="All-reduce probe attempts before a run is refused. The link's cap makes "
                    "an attempt unable to overstate the host, so one attempt that reaches "
                    "min_fraction proves it can drive the link; a refusal must repeat, so a "
                    "passing stall on a shared host does not refuse a scenario it can run.",
    )


MAX_DILATION = 1000.0


class EmulationConfig(_Strict):
    """How the emulated world relates to the target's: time dilation (a scale model)."""

    dilation: float | Literal["auto"] = Field(
        1.0, description="Time dilation k: every clock of the emulated world runs k times "
        "slower (link rates / k; delays, jitter, schedules and background on/off periods x k; "
        "replayed compute x k) and measured times are divided by k, so a host that cannot "
        "drive the target's links in real time can emulate them. 'auto': the least power of "
        "two whose fidelity probe is trusted (at most max_dilation).")
    max_dilation: float = Field(
        256.0, ge=1, le=MAX_DILATION, description="The largest k 'auto' tries.")

    @field_validator("dilation")
    @classmethod
    def _dilation_range(cls, value: float | str) -> float | str:
        if isinstance(value, (int, float)) and not 1 <= value <= MAX_DILATION:
            raise ValueError(f"{value!r} is outside 1..{MAX_DILATION:g} (1: no dilation)")
        return value

    @property
    def auto(self) -> bool:
        return self.dilation == "auto"


class BackgroundFlow(_Strict):
    """A bulk TCP flow that switches on and off on a seeded schedule, competing with training."""

    source: str | int = Field(description="Sending node (name or index).")
    destination: str | int = Field(description="Receiving node (name or index).")
    on: Duration = Field(0.2, gt=0.001, description="Mean length of an on-period.")
    off: Duration = Field(0.3, ge=0, description="Mean length of an off-period.")
    start: Duration = Field(0.0, description="When the first on-period starts.")
    distribution: Literal["exponential", "fixed"] = Field(
        "exponential", description="How on/off lengths vary around their means.")
    rate: Rate | None = Field(None, description="Pace while on; default: as fast as TCP goes.")
    burst: units.Size | None = Field(
        None, gt=0, description="A neighbour job's all-reduce instead of a bulk flow: each "
        "on-period sends this many bytes (as fast as TCP goes, or at `rate`) and then idles "
        "until it ends. With distribution = 'fixed' and off = 0, a job that all-reduces "
        "`burst` bytes once per `on` (its step): e.g. burst = '100MB', on = '300ms'.")
    seed: int = Field(0, description="Seeds the schedule; the same for every mode.")


@dataclass(frozen=True)
class _LinkTable:
    topology: Topology
    link: LinkConfig
    indexes: dict[str, int]
    default: EffectiveLink
    overridden: dict[int, EffectiveLink]


class Scenario(_Strict):
    name: str = Field(min_length=1, max_length=64, description=(
        "Names the run and its folder under --out: letters, digits, spaces and _.,+=@()[]-, "
        "not starting with a dot, space or dash."))
    description: str = ""
    topology: Topology
    link: LinkConfig
    background: list[BackgroundFlow] = Field(default_factory=list,
                                             max_length=MAX_BACKGROUND_FLOWS)
    fidelity: FidelityConfig = Field(default_factory=FidelityConfig)
    emulation: EmulationConfig = Field(default_factory=EmulationConfig)
    workload: WorkloadConfig | None = Field(
        None, description="What to train on the network; without it, only the network is built.")
    sweep: SweepConfig | None = Field(
        None, description="Run this scenario at several points (nodes, ranks_per_node, rate, "
        "params), fit the DDP cost model, check it on held-out points, project to large "
        "clusters.")
    expect: list[Expectation] | None = Field(
        None, description="Claims checked on every run. Absent: the default claim that each "
        "mode whose wire dtype is smaller than fp32's (amp-fp16, amp-bf16) has a shorter "
        "median comm time than fp32, significantly.")

    _path: Path | None = PrivateAttr(None)

    @property
    def path(self) -> Path | None:
        return self._path

    @field_validator("name")
    @classmethod
    def _name_is_a_safe_folder(cls, name: str) -> str:
        if not _SAFE_NAME.match(name) or name.rstrip() != name:
            raise ValueError(f"{name!r} cannot name a folder safely (it becomes a folder under "
                             "--out); use letters, digits, spaces and _.,+=@()[]-, starting "
                             "with a letter, digit or '_'")
        return name

    @model_validator(mode="after")
    def _overrides_and_links(self) -> Scenario:
        names = {name: i for i, name in enumerate(self.topology.node_names)}
        seen: set[int] = set()
        for i, override in enumerate(self.link.override):
            where = f"link.override.{i}.node"
            index = _node_index(override.node, names, where)
            if index in seen:
                raise ValueError(f"{where}: node {override.node!r} is overridden twice")
            seen.add(index)
        _check_schedule(self, names)
        if self.workload is not None:
            check_episode_nodes(self.workload.noise, self.topology.nodes)
        for i, flow in enumerate(self.background):
            ends = [_node_index(node, names, f"background.{i}.{role}")
                    for role, node in (("source", flow.source), ("destination", flow.destination))]
            if ends[0] == ends[1]:
                raise ValueError(f"background.{i}.destination: a flow needs two different nodes")
        for i, expectation in enumerate(self.expect or []):
            modes = self.workload.modes if self.workload else []
            metric = expectation.metric.partition(".")[0]
            if self.workload is not None and self.workload.is_script and \
                    metric in NEEDS_COMPUTE:
                raise ValueError(f"expect.{i}.metric: {metric} needs the built-in loop's "
                                 "compute-only steps, which a script has not: claim "
                                 "iteration_s, collective_s or wire_bytes_per_iteration")
            for role in ("mode", "vs"):
                mode = getattr(expectation, role)
                if mode is not None and mode not in modes:
                    raise ValueError(f"expect.{i}.{role}: mode {mode!r} is not run by this "
                                     f"scenario; workload.modes are {', '.join(modes) or 'none'}")
        # Only the default link and the overridden nodes differ: check each distinct link once.
        for where, index in [("link", 0)] + [(f"link.override.{i}", _node_index(
                o.node, names, "node")) for i, o in enumerate(self.link.override)]:
            link = self.link_for(index)
            if link.jitter > 0 and link.delay == 0:
                raise ValueError(f"{where}.jitter: node {self.topology.node_names[index]!r} has "
                                 "jitter without a delay; set link.delay (jitter varies the "
                                 "delay around it)")
            if link.queue_limit_bytes > MAX_QUEUE_BYTES:
                raise ValueError(f"{where}.queue_limit: {link.queue_limit_bytes} bytes is more "
                                 f"than tc's queue limit of {MAX_QUEUE_BYTES} bytes")
        dilation = self.emulation.dilation
        bound = rto_bound_problem(self.link.tcp, float(dilation) if dilation != "auto"
                                  else self.emulation.max_dilation)
        if bound is not None:
            raise ValueError(f"emulation.{'max_' if dilation == 'auto' else ''}dilation: {bound}")
        if self.workload is not None and self.workload.is_script:
            check_script_scale_model(self.emulation.dilation, self.workload)
        if self.sweep is not None:
            if self.workload is not None and self.workload.is_script:
                raise ValueError("sweep: fits the built-in loop's cost model; a workload with a "
                                 "command cannot be swept (compare its variants instead)")
            self._check_sweep_points(self.sweep)
        return self

    def _check_sweep_points(self, sweep: SweepConfig) -> None:
        """Every point of the sweep must be a valid scenario, before the first one trains."""
        try:
            points = sweep.points()
        except ValueError as exc:
            raise ValueError(f"sweep.points: {exc}") from None
        if len(points) > MAX_SWEEP_POINTS:
            raise ValueError(f"sweep.points: the axes make {len(points)} points; at most "
                             f"{MAX_SWEEP_POINTS} (each one trains every mode)")
        for values in points:
            try:
                self.at_sweep_point(values)
            except ScenarioError as exc:
                raise ValueError(f"sweep.points: at {point_label(values)}: {exc.field}: "
                                 f"{exc.reason}") from None

    def at_sweep_point(self, values: dict[str, Any]) -> Scenario:
        """This scenario at one sweep point, validated again (a swept value can be invalid
        there: 300 nodes in a /24)."""
        data = self.model_dump(mode="json", exclude_none=True)
        data.pop("sweep", None)
        topology = data["topology"]
        if "nodes" in values:
            topology["nodes"] = values["nodes"]
            if topology.get("names") and len(topology["names"]) != values["nodes"]:
                topology.pop("names")
        if "ranks_per_node" in values:
            topology["ranks_per_node"] = values["ranks_per_node"]
        if "rate" in values:
            data["link"]["rate"] = f"{float(values['rate'])!r}bit"  # how Scenario writes rates
        if "params" in values and data.get("workload") is not None:
            data["workload"]["params"] = values["params"]
        data["name"] = f"{self.name}[{point_label(values)}]"[:64].rstrip(" ,")
        return Scenario.from_dict(data, self._path)

    def with_command(self, command: list[str], **settings: Any) -> Scenario:
        """This scenario's network running a user's script (`netsim-ddp launch`): its
        workload's warm-up, iterations and backend kept, the built-in loop's settings dropped
        (a script's variants kept); `settings` (steps, after_measured, ...) on top."""
        data = self.model_dump(mode="json", exclude_none=True)
        old = data.get("workload") or {}
        kept = ("warmup", "iterations", "seed", "backend", *SCRIPT_REPLAY_FIELDS,
                *(("variant", "steps", "after_measured", "params") if old.get("command")
                  else ()))
        workload = {key: old[key] for key in kept if key in old}
        workload["warmup"] = max(1, workload.get("warmup", 1))  # a script's first step is
        data["workload"] = {**workload, "command": command, **settings}  # its start-up
        return Scenario.from_dict(data, self._path)

    def link_for(self, node: int | str) -> EffectiveLink:
        """The link of one node (index or name), overrides applied."""
        table = self._link_table()
        return table.overridden.get(_node_index(node, table.indexes, "node"), table.default)

    def _link_table(self) -> _LinkTable:
        """Node indexes and links, built once per topology and link, so that validating and
        planning thousands of nodes stays linear. Keyed by identity: a model_copy that
        replaces the topology or the link builds a new table."""
        table = self.__dict__.get("_cached_link_table")
        if table is None or table.topology is not self.topology or table.link is not self.link:
            indexes = {name: i for i, name in enumerate(self.topology.node_names)}
            overridden = {_node_index(o.node, indexes, "node"):
                          self._effective(o.model_dump(exclude={"node"}, exclude_none=True))
                          for o in self.link.override}
            table = _LinkTable(self.topology, self.link, indexes, self._effective({}), overridden)
            self.__dict__["_cached_link_table"] = table
        return table

    def _effective(self, override: dict[str, Any]) -> EffectiveLink:
        merged = self.link.model_dump(exclude={"override", "queue_limit", "delay_backend",
                                               "schedule"})
        merged["queue_limit"] = self.link.queue_limit
        merged.update(override)
        frame = merged["mtu"] + ETHERNET_HEADER
        return EffectiveLink(
            rate=merged["rate"], delay=merged["delay"], jitter=merged["jitter"],
            loss=merged["loss"], mtu=merged["mtu"],
            jitter_distribution=merged["jitter_distribution"],
            queue_limit_bytes=queue_limit_bytes(merged.pop("queue_limit"), frame),
        )

    @classmethod
    def load(cls, path: str | Path) -> Scenario:
        """Read and validate a TOML scenario file; raise ScenarioError naming what is wrong."""
        path = Path(path)
        try:
            text = path.read_text(encoding="utf-8")
        except FileNotFoundError:
            raise ScenarioError(path, "(file)", "no such file") from None
        except (OSError, UnicodeDecodeError) as exc:
            raise ScenarioError(path, "(file)", f"cannot read: {exc}") from None
        try:
            data = tomllib.loads(text)
        except tomllib.TOMLDecodeError as exc:
            raise ScenarioError(path, "(toml)", f"not valid TOML: {exc}") from None
        except RecursionError:
            raise ScenarioError(path, "(toml)", "nested too deeply to read") from None
        data.setdefault("name", path.stem)
        return cls.from_dict(data, path)

    @classmethod
    def from_dict(cls, data: dict[str, Any], path: str | Path | None = None) -> Scenario:
        try:
            scenario = cls.model_validate(data)
        except ValidationError as exc:
            raise _scenario_error(exc, path) from None
        except RecursionError:
            raise ScenarioError(path, "(scenario)", "nested too deeply to read") from None
        scenario._path = Path(path) if path is not None else None
        return scenario

    @classmethod
    def json_schema(cls) -> str:
        schema = cls.model_json_schema()
        schema["$schema"] = "https://json-schema.org/draft/2020-12/schema"
        schema["title"] = "netsim-ddp scenario"
        return json.dumps(schema, indent=2)


def _check_schedule(scenario: Scenario, name_index: dict[str, int]) -> None:
    """Offsets in order, nodes that exist, and delay/jitter/loss changed only where the link
    has a delay stage to change (netem cannot be added mid-run without a gap)."""
    names = scenario.topology.node_names
    previous = 0.0
    down_until = [0.0] * len(names)  # a flap restores the link it took down: no change inside
    for i, change in enumerate(scenario.link.schedule):
        if change.at < previous:
            raise ValueError(f"link.schedule.{i}.at: {change.at:g}s comes before the previous "
                             f"entry's {previous:g}s; list the changes in order of time")
        previous = change.at
        indexes = (range(len(names)) if change.node is None
                   else [_node_index(change.node, name_index, f"link.schedule.{i}.node")])
        for index in indexes:
            if change.at < down_until[index]:
                raise ValueError(f"link.schedule.{i}.at: node {names[index]!r} is down until "
                                 f"{down_until[index]:g}s; change it after it is back up")
            if change.down is not None:
                down_until[index] = change.at + change.down
        impairs = [name for name in ("delay", "jitter", "loss")
                   if getattr(change, name) is not None]
        for index in indexes if impairs else ():
            if not scenario.link_for(index).impaired:
                raise ValueError(
                    f"link.schedule.{i}.{impairs[0]}: node {names[index]!r} starts with no "
                    "delay, jitter or loss, so its link has no delay stage to change in "
                    "place; give it a small starting delay (e.g. link.delay = '50us')")


def _node_index(node: int | str, names: dict[str, int], where: str) -> int:
    if isinstance(node, int):
        if 0 <= node < len(names):
            return node
        raise ValueError(f"{where}: node index {node} out of range 0..{len(names) - 1}")
    if node in names:
        return names[node]
    shown = ", ".join(list(names)[:10]) + (", ..." if len(names) > 10 else "")
    raise ValueError(f"{where}: no node named {node!r}; nodes are {shown}")


def point_label(values: dict[str, Any]) -> str:
    """A sweep point as people read it: "2 nodes, 100mbit"."""
    parts = []
    for axis, value in values.items():
        if axis == "rate":
            parts.append(f"{value / 1e6:g}mbit")
        elif axis == "params":
            parts.append(f"{value / 1e6:g}M")
        else:
            parts.append(f"{value} {axis.replace('_', ' ')}")
    return ", ".join(parts)


_LOCATED = re.compile(r"^(?P<field>[a-z_]+(?:\.[\w]+)+): (?P<reason>.*)$", re.DOTALL)


def _scenario_error(exc: ValidationError, path: str | Path | None) -> ScenarioError:
    """The first validation error as a ScenarioError; the rest are appended one per line."""
    lines = []
    for error in exc.errors(include_url=False):
        field = ".".join(str(part) for part in error["loc"])
        reason = error["msg"].removeprefix("Value error, ")
        # Cross-field checks name their own field at the start of the message.
        located = _LOCATED.match(reason)
        if located:
            field = ".".join(filter(None, [field, located["field"]]))
            reason = located["reason"]
        if error["type"] == "extra_forbidden":
            reason = "unknown key (check its spelling against `netsim-ddp schema`)"
        elif error["type"] == "missing":
            reason = "required but missing"
        lines.append((field or "(scenario)", reason))
    field, reason = lines[0]
    more = "".join(f"\n{path}: {f}: {r}" for f, r in lines[1:])
    return ScenarioError(path, field, reason + more)
