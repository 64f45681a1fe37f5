"""`netsim-ddp host`: one agent per real host, started by the cluster's own scheduler.

The agents form the job over c10d's TCPStore at --master-addr:--master-port: node 0's agent
hosts it, every agent connects to it, and each phase's torchrun joins its c10d rendezvous
through the same store (`--rdzv-backend c10d`, `is_host=false`), so the job needs one port.
Over the store the agents

1. say hello (node rank, hostname, NIC address, a digest of the scenario they were given):
   a node that never arrives within --join-timeout ends every agent's run, named;
2. shape their own NIC to their node's link for the traffic to and from the other hosts only
   (fabric/nic.py, nic_plan.py: recorded first, restored exactly; the rest of the NIC's
   traffic passes unshaped and uncounted);
3. measure their clock's offset to node 0's (netsim_ddp.common.clock), so every timestamp of the
   job (measured windows, background byte series, each rank's steps) is on one clock;
4. run phases: node 0 runs the very code `netsim-ddp run` runs (runner.probe_and_train and
   runner.finish_report) with a launcher that publishes each launch as a phase; every agent
   then starts its torchrun for it. Results land on whichever host the rendezvous made rank 0;
   its agent uploads them to the store, so node 0 always has them. Background flows are
   phases too: each agent starts the sinks of the flows to its node, publishes their ports,
   starts the senders of the flows from its node to the other hosts' addresses, and at the
   end sends node 0 its ends' byte series, which node 0 assembles into the account `run`
   makes (runner.finish_report: the same subtraction and background checks);
5. end: node 0 publishes the verdict, every agent restores its NIC and reports that it did.

Failures: an agent that fails posts `abort` (the first one wins) with the reason and its
node's name; every agent watches for it, and for heartbeats that stop (an agent that was
killed, a host that went away), and ends its own torchrun and restores its NIC. A killed agent's
torchrun gets SIGTERM from the kernel (PR_SET_PDEATHSIG); whatever it left, `netsim-ddp clean`
kills by the job marker in its environment.
"""

from __future__ import annotations

import contextlib
import hashlib
import json
import os
import signal
import socket
import subprocess
import sys
import threading
import time
from collections.abc import Callable, Iterator, Mapping, Sequence
from dataclasses import dataclass
from datetime import timedelta
from pathlib import Path
from typing import Any

from netsim_ddp.common.clock import CLOCK_OFFSET_ENV, estimate_offset
from netsim_ddp.common.options import HEARTBEAT_TIMEOUT_S, JOIN_TIMEOUT_S
from netsim_ddp.common.signals import SIGNAL_DIR_ENV
from netsim_ddp.fabric import naming
from netsim_ddp.fabric.background import (
    BackgroundBytes,
    BackgroundError,
    BackgroundTraffic,
    EndReport,
    assemble,
)
from netsim_ddp.fabric.core import signals_raise
from netsim_ddp.fabric.netns import libc
from netsim_ddp.fabric.nic import (
    JOB_ENV,
    NicRestoreError,
    ShapedNic,
    check_may_shape,
    check_nic,
    inspect_nic,
)
from netsim_ddp.fabric.own_link import NIC_ENV
from netsim_ddp.run.runner import finish_report, probe_and_train
from netsim_ddp.scenario.spec import Scenario
from netsim_ddp.scenario.units import format_rate
from netsim_ddp.verdicts.scenario_report import ScenarioReport
from netsim_ddp.workload import ModeResult, RankSpec, WorkloadError
from netsim_ddp.workload.gpus import GpuInventory
from netsim_ddp.workload.launch import (
    RANK_MODULE,
    agent_module,
    failure_report,
    kill_all,
    looks_like_echo,
    rank_env,
    rank_errors,
    read_results,
)
from netsim_ddp.workload.nccl import rank_log_lines
from netsim_ddp.workload.placement import Placement, place
from netsim_ddp.workload.window import NODE_RANK_ENV

PREFIX = "netsim-ddp/"
POLL_S = 0.2
HEARTBEAT_S = 1.0
END_WAIT_S = 60.0  # node 0 waits this long for every host to say its NIC is restored
PR_SET_PDEATHSIG = 1
OUT_MARK = "{out}"  # stands for each agent's own --out in a phase's environment
CLOCK_ROUNDS = 8
Progress = Callable[[str], None]


class HostError(WorkloadError):
    """The multi-host job cannot go on; the message names the host that failed or is missing."""


class HostConfigError(HostError):
    """Refused before anything changed: the scenario and the options disagree."""


@dataclass(frozen=True)
class HostOptions:
    scenario: Scenario
    node_rank: int
    nnodes: int
    master_addr: str
    master_port: int
    nic: str
    out_dir: Path
    iterations: int | None = None
    timeout_s: float | None = None
    join_timeout_s: float = JOIN_TIMEOUT_S
    heartbeat_timeout_s: float = HEARTBEAT_TIMEOUT_S
    allow_untrusted: bool = False
    ingress: bool = True

    @property
    def reply_timeout_s(self) -> float:
        """How long node 0 waits for every host's word on a phase: a few heartbeat timeouts."""
        return 4 * self.heartbeat_timeout_s

    @property
    def node_name(self) -> str:
        return self.scenario.topology.node_names[self.node_rank]

    def digest(self) -> str:
        """What every host must agree on: the scenario and the options that change the run."""
        text = json.dumps([self.scenario.model_dump(mode="json"), self.nnodes, self.iterations,
                           self.allow_untrusted], sort_keys=True)
        return hashlib.sha256(text.encode()).hexdigest()[:16]


def validate(options: HostOptions) -> None:
    """Everything that can be refused before anything on the host changes."""
    scenario, where = options.scenario, options.scenario.path or options.scenario.name
    if scenario.topology.nodes != options.nnodes:
        raise HostConfigError(
            f"{where}: topology.nodes is {scenario.topology.nodes} but --nnodes is "
            f"{options.nnodes}: one host per node; start {scenario.topology.nodes} agents, or "
            "change topology.nodes")
    if not 0 <= options.node_rank < options.nnodes:
        raise HostConfigError(f"--node-rank {options.node_rank} is outside 0..{options.nnodes - 1}")
    if scenario.workload is None:
        raise HostConfigError(f"{where}: workload: required to run training; add a [workload] "
                        "section (see README)")
    if scenario.sweep is not None:
        raise HostConfigError(f"{where}: sweep: sweeps run on one host only (`netsim-ddp run`)")
    if scenario.emulation.dilation != 1:
        raise HostConfigError(f"{where}: emulation.dilation: a time-dilated scale model runs on "
                              "one host (`netsim-ddp run`); real hosts' NICs run in real time: "
                              "remove it (compute replay alone works here)")
    if scenario.link.schedule:
        raise HostConfigError(f"{where}: link.schedule: links that change mid-run need the "
                              "harness's own switch; run the scenario with `netsim-ddp run`")
    if scenario.link.tcp.model_fields_set:  # fabric.tcp_clocks sets emulated nodes only
        raise HostConfigError(f"{where}: link.tcp: sets the emulated nodes' TCP; a real host's "
                              "TCP is its own (net.ipv4 sysctls): remove it, or run the "
                              "scenario with `netsim-ddp run`")


class Control:
    """The job's control channel: c10d's TCPStore, hosted by node 0's agent."""

    def __init__(self, options: HostOptions, names: list[str]):
        from torch.distributed import TCPStore

        self.options = options
        self.names = names
        self.endpoint = f"{options.master_addr}:{options.master_port}"
        try:
            self.store = TCPStore(options.master_addr, options.master_port,
                                  is_master=options.node_rank == 0,
                                  timeout=timedelta(seconds=options.join_timeout_s),
                                  wait_for_workers=False)
        except (RuntimeError, ValueError) as exc:  # DistStoreError and kin
            if options.node_rank == 0:
                raise HostError(f"node 0 cannot listen on {self.endpoint}: {exc}") from None
            raise HostError(f"node 0 ({names[0]}) never arrived: no netsim-ddp host agent "
                            f"answered at {self.endpoint} within {options.join_timeout_s:g} s"
                            ) from None
        self.hellos: dict[int, dict[str, Any]] = {}
        self._beats: dict[int, tuple[int, float]] = {}
        self._stop = threading.Event()
        self._beater: threading.Thread | None = None

    # -- the store, with errors that say what went wrong -------------------------------------

    def _call(self, what: str, fn, *args):
        try:
            return fn(*args)
        except (RuntimeError, ValueError) as exc:
            raise HostError(f"lost contact with node 0 ({self.names[0]}) at {self.endpoint} "
                            f"while {what}: its agent exited or the network failed ({exc})"
                            ) from None

    def set(self, key: str, value: str | bytes) -> None:
        self._call(f"writing {key}", self.store.set, PREFIX + key, value)

    def get(self, key: str) -> bytes:
        return self._call(f"reading {key}", self.store.get, PREFIX + key)

    def has(self, key: str) -> bool:
        return bool(self._call(f"reading {key}", self.store.check, [PREFIX + key]))

    def get_json(self, key: str) -> Any:
        return json.loads(self.get(key))

    def describe(self, rank: int) -> str:
        hello = self.hellos.get(rank)
        host = f" (host {hello['hostname']}, {hello['address']})" if hello else ""
        return f"node {self.names[rank]}{host}"

    # -- failure ------------------------------------------------------------------------------

    def abort(self, reason: str) -> None:
        """Tell every agent to stop; the first reason posted is the one they all report."""
        entry = json.dumps({"node_rank": self.options.node_rank, "reason": reason})
        with contextlib.suppress(HostError, RuntimeError, ValueError):
            self.store.compare_set(PREFIX + "abort", "", entry)

    def raise_if_aborted(self) -> None:
        if self.has("abort"):
            entry = self.get_json("abort")
            if entry["node_rank"] != self.options.node_rank:
                raise HostError(f"{self.describe(entry['node_rank'])} failed: {entry['reason']}")
            raise HostError(entry["reason"])

    def start_heartbeat(self) -> None:
        def beat() -> None:
            from torch.distributed import TCPStore

            with contextlib.suppress(RuntimeError, ValueError):
                store = TCPStore(self.options.master_addr, self.options.master_port,
                                 is_master=False, timeout=timedelta(seconds=30))
                while not self._stop.wait(HEARTBEAT_S):
                    store.add(f"{PREFIX}beat/{self.options.node_rank}", 1)

        self._beater = threading.Thread(target=beat, name="netsim-ddp-heartbeat", daemon=True)
        self._beater.start()

    def silent(self) -> list[int]:
        """Nodes whose heartbeat has not moved for --heartbeat-timeout: gone."""
        now, gone = time.monotonic(), []
        for rank in self.hellos:
            if rank == self.options.node_rank:
                continue
            count = int(self._call("reading heartbeats", self.store.add,
                                   f"{PREFIX}beat/{rank}", 0))
            last = self._beats.get(rank)
            if last is None or count != last[0]:
                self._beats[rank] = (count, now)
            elif now - last[1] > self.options.heartbeat_timeout_s:
                gone.append(rank)
        return gone

    def check_heartbeats(self) -> None:
        """A host whose heartbeat stopped is gone: abort naming it."""
        gone = self.silent()
        if gone:
            reason = (f"{self.describe(gone[0])} stopped answering for "
                      f"{self.options.heartbeat_timeout_s:g} s: its agent died or its host went "
                      "away")
            self.abort(reason)
            raise HostError(reason)

    def wait_for(self, keys: list[str], timeout_s: float | None, what: Callable[[list[str]], str],
                 watch: bool = True) -> None:
        """Until every key exists; watching for an abort and for silent hosts meanwhile."""
        deadline = None if timeout_s is None else time.monotonic() + timeout_s
        while True:
            missing = [key for key in keys if not self.has(key)]
            if not missing:
                return
            if watch:
                self.raise_if_aborted()
                self.check_heartbeats()
            if deadline is not None and time.monotonic() > deadline:
                raise HostError(what(missing))
            time.sleep(POLL_S)

    # -- one clock for the job ---------------------------------------------------------------

    def serve_clock(self) -> None:
        """Node 0: answer every other node's clock requests (store.wait wakes at once)."""
        for rank in range(1, self.options.nnodes):
            for round_ in range(CLOCK_ROUNDS):
                key = f"clock/{rank}/{round_}"
                self._call(f"waiting for {self.describe(rank)}'s clock request",
                           self.store.wait, [f"{PREFIX}{key}/ask"],
                           timedelta(seconds=self.options.join_timeout_s))
                self.set(f"{key}/answer", repr(time.monotonic()))

    def offset_to_node0(self) -> tuple[float, float]:
        """Other nodes: (seconds to add to this host's CLOCK_MONOTONIC to get node 0's, the
        error bound)."""
        rounds = iter(range(CLOCK_ROUNDS))

        def exchange() -> float:
            key = f"clock/{self.options.node_rank}/{next(rounds)}"
            self.set(f"{key}/ask", "")
            self._call("waiting for node 0's clock", self.store.wait,
                       [f"{PREFIX}{key}/answer"], timedelta(seconds=self.options.join_timeout_s))
            return float(self.get(f"{key}/answer"))

        return estimate_offset(exchange, CLOCK_ROUNDS)

    def close(self) -> None:
        self._stop.set()
        if self._beater is not None:
            self._beater.join(timeout=5)


@dataclass
class Phase:
    index: int
    path: str  # under each agent's --out
    spec: str  # RankSpec JSON
    timeout_s: float
    profile: bool
    env: dict[str, str]


class HostAgent:
    def __init__(self, options: HostOptions, progress: Progress):
        self.options = options
        self.progress = progress
        self.names = options.scenario.topology.node_names
        self.hostname = socket.gethostname()
        self.control: Control | None = None
        self.nic: ShapedNic | None = None
        self.job = ""
        self.address = ""
        self.clock_offset = 0.0  # to node 0's CLOCK_MONOTONIC (netsim_ddp.common.clock)
        self.traffic: BackgroundTraffic | None = None  # this host's ends of the flows
        self.placement: Placement | None = None  # this host's backend and GPUs

    # -- the whole life of one agent ----------------------------------------------------------

    def run(self) -> ScenarioReport | str:
        """Node 0: the report. Other nodes: the job's status as node 0 published it."""
        validate(self.options)
        check_may_shape(self.options.nic)  # before any agent waits on us
        self.placement = host_placement(self.options)  # refused before anything changes
        info = inspect_nic(self.options.nic)
        check_nic(info)  # refuse before any agent waits on us
        self.address = info.addresses[0]
        self.progress(f"{self.options.node_name}: joining at {self.options.master_addr}:"
                      f"{self.options.master_port}")
        self.control = control = Control(self.options, self.names)
        try:
            try:
                self._join(control)
                return self._shaped_run(control)
            except BaseException as exc:
                control.abort(_reason(exc))
                raise
        finally:
            control.close()

    def _join(self, control: Control) -> None:
        options = self.options
        assert self.placement is not None
        hello = {"hostname": self.hostname, "address": self.address, "nic": options.nic,
                 "backend": self.placement.backend,
                 "digest": options.digest(), "pid": os.getpid()}
        key = f"{PREFIX}hello/{options.node_rank}"
        mine = json.dumps(hello)
        claimed = control._call("saying hello", control.store.compare_set, key, "", mine)
        if claimed.decode() != mine:
            other = json.loads(claimed)
            raise HostError(f"node rank {options.node_rank} is already taken by host "
                            f"{other['hostname']} ({other['address']}): give each agent its "
                            "own --node-rank")
        control.start_heartbeat()
        control.wait_for(
            [f"hello/{rank}" for rank in range(options.nnodes)], options.join_timeout_s,
            lambda missing: "never arrived within "
            f"{options.join_timeout_s:g} s: " + ", ".join(
                f"node {self.names[int(key.rsplit('/', 1)[1])]} (node rank "
                f"{key.rsplit('/', 1)[1]})" for key in missing), watch=False)
        control.hellos = {rank: control.get_json(f"hello/{rank}")
                          for rank in range(options.nnodes)}
        if options.node_rank == 0:
            for rank, other in control.hellos.items():
                if other["digest"] != hello["digest"]:
                    raise HostError(f"{control.describe(rank)} was given a different scenario "
                                    "or options than node 0: every host runs the same file "
                                    "with the same --nnodes and --iterations")
                if other["backend"] != hello["backend"]:
                    raise HostError(
                        f"{control.describe(rank)} would run its ranks on "
                        f"{other['backend']} and node 0 on {hello['backend']}: every host "
                        "must resolve workload.backend alike (give every host GPUs and NCCL, "
                        "or set workload.backend)")
            self.job = naming.new_run_id()
            control.set("job", self.job)
            control.serve_clock()
            error = 0.0
        else:
            control.wait_for(["job"], options.join_timeout_s,
                             lambda _: "node 0 did not start the job")
            self.job = control.get("job").decode()
            self.clock_offset, error = control.offset_to_node0()
        control.set(f"clock/{options.node_rank}",
                    json.dumps({"offset_s": self.clock_offset, "error_s": error}))

    def _shaped_run(self, control: Control) -> ScenarioReport | str:
        options = self.options
        link = options.scenario.link_for(options.node_rank)
        outcome: ScenarioReport | str | None = None
        # Only the job's traffic: to and from the other hosts' addresses (their hellos).
        peers = [hello["address"] for rank, hello in sorted(control.hellos.items())
                 if rank != options.node_rank]
        nic = ShapedNic(options.nic, link, job=self.job, ingress=options.ingress, peers=peers)
        try:
            with nic:
                self.nic = nic
                try:
                    outcome = self._run_shaped(control, nic)
                finally:
                    self._stop_traffic()
        except NicRestoreError as exc:
            # Never "ok": the NIC is left changed, its record kept for `netsim-ddp clean`.
            self._post_restored(control, {"ok": False, "error": str(exc)})
            if not isinstance(outcome, ScenarioReport):
                raise
            outcome.error = f"{options.node_name}: {exc}"
        except BaseException:
            # Shaped and put back, or never shaped (refused before any change): as it was.
            self._post_restored(control, {"ok": not nic.left_changed,
                                          "error": nic.restore_error})
            raise
        else:
            self._post_restored(control, {"ok": True, "error": None})
        if isinstance(outcome, ScenarioReport):
            outcome.hosts = self._hosts_summary(control)
            left = [f"{name}: " + (str(restored.get("error")) if isinstance(restored, dict)
                                   else "no word")
                    for name, host in outcome.hosts.items()
                    for restored in [host.get("restored")]
                    if not isinstance(restored, dict) or not restored.get("ok")]
            if left and not outcome.error:
                outcome.error = ("not every host's NIC came back as it was: " + "; ".join(left)
                                 + " (`netsim-ddp clean` on those hosts)")
        assert outcome is not None
        return outcome

    def _post_restored(self, control: Control, restored: dict[str, Any]) -> None:
        with contextlib.suppress(HostError):
            control.set(f"restored/{self.options.node_rank}", json.dumps(restored))

    def _run_shaped(self, control: Control, nic: ShapedNic) -> ScenarioReport | str:
        options = self.options
        shaping = nic.shaping()
        for note in nic.notes:
            self.progress(f"{options.node_name}: note: {note}")
        control.set(f"shaped/{options.node_rank}", json.dumps(shaping))
        control.wait_for([f"shaped/{rank}" for rank in range(options.nnodes)],
                         options.join_timeout_s,
                         lambda missing: ", ".join(control.describe(_rank_of(key))
                                                   for key in missing)
                         + f" did not shape its NIC within {options.join_timeout_s:g} s")
        self.progress(f"{options.node_name}: {options.nic} shaped "
                      f"({_rate(shaping['egress_bps'])} out, "
                      f"{_rate(shaping['ingress_bps'])} in); all hosts ready")
        return self._lead(control) if options.node_rank == 0 else self._follow(control)

    # -- node 0 -------------------------------------------------------------------------------

    def _lead(self, control: Control) -> ScenarioReport:
        options = self.options
        workload = options.scenario.workload
        assert workload is not None  # validated
        if options.iterations is not None:
            workload = workload.model_copy(update={"iterations": options.iterations})
        assert self.placement is not None
        workload = workload.model_copy(update={"backend": self.placement.backend})
        report = ScenarioReport(options.scenario, run_id=self.job, placement=self.placement)
        phases = iter(range(1_000_000))

        def launcher(spec: RankSpec, out_dir: Path, timeout_s: float, *, profile: bool = False,
                     env: Mapping[str, str] | None = None,
                     watchdog: Callable[[], None] | None = None) -> dict[str, ModeResult]:
            # No watchdog to call: each agent watches its own background ends (_run_phase).
            # Paths travel relative to each agent's --out (rank 0 may be on any host).
            portable = {key: value.replace(str(options.out_dir), OUT_MARK)
                        for key, value in (env or {}).items()}
            phase = Phase(next(phases), str(Path(out_dir).relative_to(options.out_dir)),
                          spec.model_dump_json(), timeout_s, profile, portable)
            control.set(f"phase/{phase.index}", json.dumps(phase.__dict__))
            self._run_phase(control, phase)
            return read_results(Path(out_dir).resolve(), spec, Path(out_dir) / "logs")

        def traffic(signals: Path) -> _HostsTraffic:
            return _HostsTraffic(self, control, phases, signals)

        try:
            trained = probe_and_train(options.scenario, workload, report, options.out_dir,
                                      launcher, profile=False,
                                      allow_untrusted=options.allow_untrusted,
                                      timeout_s=options.timeout_s, progress=self.progress,
                                      traffic=traffic, transport_ifname=",".join(sorted(
                                          {hello["nic"] for hello in control.hellos.values()})))
            if trained is not None:
                finish_report(report, *trained)
        except WorkloadError as exc:
            report.error = str(exc)
            control.abort(report.error)
        control.set(f"phase/{next(phases)}", json.dumps({"done": report.status}))
        return report

    def _hosts_summary(self, control: Control) -> dict[str, dict[str, object]]:
        """Per node: its host, NIC, the shaping read back from its kernel, and whether its
        NIC came back as recorded (node 0 waits a while for the others to say so)."""
        deadline = time.monotonic() + END_WAIT_S
        with contextlib.suppress(HostError):
            while time.monotonic() < deadline:
                gone = set(control.silent())  # a dead agent never answers
                if all(control.has(f"restored/{rank}") for rank in range(self.options.nnodes)
                       if rank not in gone):
                    break
                time.sleep(POLL_S)
        summary: dict[str, dict[str, object]] = {}
        for rank, hello in sorted(control.hellos.items()):
            entry: dict[str, object] = {"node_rank": rank, "hostname": hello["hostname"],
                                        "address": hello["address"], "nic": hello["nic"]}
            for key, field in ((f"shaped/{rank}", "shaping"), (f"restored/{rank}", "restored"),
                               (f"clock/{rank}", "clock")):
                with contextlib.suppress(HostError):
                    entry[field] = control.get_json(key) if control.has(key) else None
            summary[self.names[rank]] = entry
        return summary

    # -- other nodes --------------------------------------------------------------------------

    def _follow(self, control: Control) -> str:
        for index in range(1_000_000):
            control.wait_for([f"phase/{index}"], None, lambda _: "")
            message = control.get_json(f"phase/{index}")
            if "done" in message:
                return str(message["done"])
            if "background" in message:
                self._background_phase(control, index, message)
            else:
                self._run_phase(control, Phase(**message))
        raise AssertionError("unreachable")

    # -- background flows: this host's ends ----------------------------------------------------

    def _background_phase(self, control: Control, index: int, message: dict[str, Any]) -> None:
        if message["background"] == "start":
            signals = message["signals"].replace(OUT_MARK, str(self.options.out_dir))
            self._start_traffic(control, index, Path(signals))
        elif message["background"] == "stop-senders":
            if self.traffic is not None:
                self.traffic.stop_senders()
            control.set(f"background/{index}/senders-stopped/{self.options.node_rank}", "")
        else:
            self._report_traffic(control, index)

    def _start_traffic(self, control: Control, index: int, signals: Path) -> None:
        """Sinks of the flows to this node first (their ports go to the store), then senders
        of the flows from it to the other hosts' sinks; returns once every host's are up."""
        options, flows = self.options, self.options.scenario.background
        me, node = options.node_rank, self._node()
        signals.mkdir(parents=True, exist_ok=True)
        self.traffic = traffic = BackgroundTraffic(None, flows, signals)
        for flow_index, flow in enumerate(flows):
            if self._node_rank(flow.destination) == me:
                port = traffic.start_sink(flow_index, node)
                control.set(f"background/{index}/port/{flow_index}", str(port))
        for flow_index, flow in enumerate(flows):
            if self._node_rank(flow.source) != me:
                continue
            destination = self._node_rank(flow.destination)
            key = f"background/{index}/port/{flow_index}"
            late = (f"{control.describe(destination)} did not start the sink of background "
                    f"flow {flow_index} within {options.join_timeout_s:g} s")
            control.wait_for([key], options.join_timeout_s, _says(late))
            traffic.start_sender(flow_index, node, control.hellos[destination]["address"],
                                 int(control.get(key)))
        control.set(f"background/{index}/ready/{me}", "")
        control.wait_for([f"background/{index}/ready/{rank}" for rank in range(options.nnodes)],
                         options.join_timeout_s, lambda missing: ", ".join(
                             control.describe(_rank_of(key)) for key in missing)
                         + " did not start its background flows")

    def _report_traffic(self, control: Control, index: int) -> None:
        """Stop this host's ends; their byte series (or why there are none) go to node 0."""
        traffic, self.traffic = self.traffic, None
        ends: list[dict[str, object]] = []
        error = None
        try:
            ends = [end.as_dict() for end in traffic.stop_ends()] if traffic else []
        except BackgroundError as exc:
            error = str(exc)
        control.set(f"background/{index}/ends/{self.options.node_rank}",
                    json.dumps({"ends": ends, "error": error}))

    def _stop_traffic(self) -> None:
        """On the way out: no flow of this host outlives its agent."""
        traffic, self.traffic = self.traffic, None
        if traffic is not None:
            with contextlib.suppress(BackgroundError):
                traffic.stop_ends()

    def _node_rank(self, node: str | int) -> int:
        return node if isinstance(node, int) else self.names.index(node)

    def _node(self) -> _LocalNode:
        return _LocalNode(self.options.node_name, self.address, self.clock_offset)

    # -- one phase: this host's torchrun ------------------------------------------------------

    def _run_phase(self, control: Control, phase: Phase) -> None:
        options = self.options
        out = (options.out_dir / phase.path).resolve()
        logs = out / "logs"
        logs.mkdir(parents=True, exist_ok=True)
        spec_path = out / "spec.json"
        spec_path.write_text(phase.spec)
        argv = [sys.executable, "-P", "-m", agent_module(RankSpec.model_validate_json(phase.spec)),
                "--nnodes", str(options.nnodes),
                "--nproc-per-node", str(options.scenario.topology.ranks_per_node),
                "--rdzv-backend", "c10d",
                "--rdzv-endpoint", f"{options.master_addr}:{options.master_port}",
                "--rdzv-id", f"{self.job}-{phase.index}",
                "--rdzv-conf", f"is_host=false,join_timeout={int(options.join_timeout_s)}",
                "--local-addr", self.address,  # rank 0's becomes MASTER_ADDR: the shaped NIC
                "--max-restarts", "0",
                "--log-dir", str(logs / options.node_name),
                "--tee", "3",
                "-m", RANK_MODULE, "--spec", str(spec_path), "--out", str(out)]  # fmt: skip
        if phase.profile:
            argv += ["--profile", str(out)]
        local = {key: value.replace(OUT_MARK, str(options.out_dir))
                 for key, value in phase.env.items()}
        if SIGNAL_DIR_ENV in local:
            Path(local[SIGNAL_DIR_ENV]).mkdir(parents=True, exist_ok=True)
        env = self.phase_env(local)
        node = self._node()
        deadline = time.monotonic() + phase.timeout_s
        with open(logs / f"{node.name}.torchrun.log", "wb") as output:
            process = node.popen(argv, env=env, stdin=subprocess.DEVNULL, stdout=output,
                                 stderr=subprocess.STDOUT, start_new_session=True)
            try:
                while (code := process.poll()) is None:
                    control.raise_if_aborted()
                    control.check_heartbeats()
                    if self.traffic is not None:
                        self.traffic.check()  # a dead flow here ends the run, named
                    if time.monotonic() > deadline:
                        raise HostError(f"{control.describe(options.node_rank)}: its ranks "
                                        f"timed out after {phase.timeout_s:g} s\n"
                                        + failure_report([node], logs, []))
                    time.sleep(POLL_S)
            finally:
                kill_all([process])
        if code != 0:
            self._raise_after_grace(control, failure_report([node], logs, [0]), logs)
        files = sorted(p.name for p in out.glob("*.json")
                       if p.name.startswith("result-") or p.name == "allreduce.json")
        for name in files:
            control.set(f"files/{phase.index}/{name}", (out / name).read_bytes())
        if self._node_env().get("NCCL_NET"):  # NCCL's word on its transport, for node 0
            control.set(f"nccl/{phase.index}/{options.node_rank}", "\n".join(
                line for line in rank_log_lines(logs / options.node_name)
                if "NCCL INFO" in line))
        control.set(f"status/{phase.index}/{options.node_rank}", json.dumps({"files": files}))
        control.wait_for([f"status/{phase.index}/{rank}" for rank in range(options.nnodes)],
                         options.reply_timeout_s,
                         lambda missing: f"phase {phase.index}: no word from "
                         + ", ".join(control.describe(_rank_of(key)) for key in missing))
        for rank in range(options.nnodes):  # results land where the rendezvous put rank 0
            for name in control.get_json(f"status/{phase.index}/{rank}")["files"]:
                if not (out / name).exists():
                    (out / name).write_bytes(control.get(f"files/{phase.index}/{name}"))
            if rank != options.node_rank and control.has(f"nccl/{phase.index}/{rank}"):
                # Where the transport check reads each node's ranks' lines (rank_log_lines).
                folder = logs / self.names[rank]
                folder.mkdir(parents=True, exist_ok=True)
                (folder / "stdout-nccl.log").write_bytes(
                    control.get(f"nccl/{phase.index}/{rank}"))

    def phase_env(self, local: Mapping[str, str]) -> dict[str, str]:
        """What this host's torchrun and ranks get for a phase: the phase's settings, the NIC
        for gloo and for NCCL, the job marker, this host's GPUs."""
        return rank_env(self.options.nic, {**local, NIC_ENV: self.options.nic,
                                           JOB_ENV: self.job, **self._node_env(),
                                           NODE_RANK_ENV: str(self.options.node_rank)})

    def _node_env(self) -> dict[str, str]:
        """This host's ranks' GPUs and NCCL settings: NCCL pinned to --nic, sockets only."""
        assert self.placement is not None
        return self.placement.node_env(self.job, [self.options.node_name],
                                       ifname=self.options.nic)[0]

    def _raise_after_grace(self, control: Control, failure: str, logs: Path) -> None:
        """A rank here failed. When a peer's failure caused it, the peer's agent says so
        within moments, or its heartbeat stops (killed): wait for that, then abort with the
        earliest failure any agent reported (the root cause; the others are echoes)."""
        options = self.options
        stamps = [stamp for stamp, *_ in rank_errors(logs, self._node())]
        control.set(f"failed/{options.node_rank}",
                    json.dumps({"time": min(stamps, default=int(time.time())),
                                "echo": looks_like_echo(failure), "report": failure}))
        keys = [f"failed/{rank}" for rank in range(options.nnodes)]
        with contextlib.suppress(HostError):  # the grace ran out: decide with what we have
            control.wait_for(keys, options.heartbeat_timeout_s + 2 * HEARTBEAT_S, lambda _: "")
        failures = sorted(
            (entry["echo"], entry["time"], rank, entry["report"])
             for rank in range(options.nnodes) if control.has(f"failed/{rank}")
             for entry in [control.get_json(f"failed/{rank}")])
        _, _, rank, report = failures[0]
        reason = f"{control.describe(rank)}: its ranks failed first:\n{report}"
        control.abort(reason)
        control.raise_if_aborted()


class _HostsTraffic(contextlib.AbstractContextManager):
    """Node 0's handle on the background flows of every host, as runner.probe_and_train
    uses BackgroundTraffic on one host: started before the training phase, stopped after it
    with every end's byte series assembled into one BackgroundBytes."""

    def __init__(self, agent: HostAgent, control: Control, phases: Iterator[int],
                 signals: Path):
        self.agent, self.control, self.phases = agent, control, phases
        self.portable = str(signals).replace(str(agent.options.out_dir), OUT_MARK)

    def _phase(self, message: dict[str, Any]) -> int:
        index = next(self.phases)
        self.control.set(f"phase/{index}", json.dumps(message))
        self.agent._background_phase(self.control, index, message)
        return index

    def __enter__(self) -> _HostsTraffic:
        self._phase({"background": "start", "signals": self.portable})
        return self

    def __exit__(self, *_exc) -> None:
        self.agent._stop_traffic()  # only left running when the run failed: no account

    def check(self) -> None:
        """Nothing to do here: each agent watches its own ends while its ranks run."""

    def stop(self) -> BackgroundBytes:
        control, nnodes = self.control, self.agent.options.nnodes
        index = self._phase({"background": "stop-senders"})  # everywhere, before any sink
        control.wait_for([f"background/{index}/senders-stopped/{rank}" for rank in range(nnodes)],
                         self.agent.options.reply_timeout_s, lambda missing: ", ".join(
            control.describe(_rank_of(key)) for key in missing)
            + " did not stop its background senders")
        index = self._phase({"background": "stop"})
        keys = [f"background/{index}/ends/{rank}" for rank in range(nnodes)]
        control.wait_for(keys, self.agent.options.reply_timeout_s, lambda missing: ", ".join(
            control.describe(_rank_of(key)) for key in missing)
            + " did not report its background flows")
        ends, errors = [], []
        for rank, key in enumerate(keys):
            reported = control.get_json(key)
            if reported["error"]:
                errors.append(f"{control.describe(rank)}: {reported['error']}")
            ends += [EndReport.from_dict(end) for end in reported["ends"]]
        if errors:
            raise BackgroundError("; ".join(errors))
        return assemble(ends)


def host_placement(options: HostOptions, inventory: GpuInventory | None = None,
                   environ: Mapping[str, str] | None = None) -> Placement:
    """This host's backend and GPUs for its one node (its ranks_per_node ranks), as `run`
    decides them for a whole fabric; HostConfigError where this host cannot run it as asked
    (no GPUs for 'nccl', users' NCCL_* settings that would take the traffic off --nic)."""
    workload = options.scenario.workload
    assert workload is not None  # validated
    one_node = options.scenario.topology.model_copy(update={"nodes": 1, "names": None})
    placement = place(workload, one_node, inventory, environ)
    if placement.refused:
        raise HostConfigError(f"{options.scenario.path or options.scenario.name}: "
                              f"{placement.describe()}")
    return placement


def _says(message: str) -> Callable[[list[str]], str]:
    return lambda _missing: message


def _rank_of(key: str) -> int:
    return int(key.rsplit("/", 1)[1])


@dataclass(frozen=True)
class _LocalNode:
    """This host as launch's Node: its node name, its NIC's address, processes started here."""

    name: str
    address: str
    clock_offset: float = 0.0

    def popen(self, argv: Sequence[str], **kwargs: Any) -> subprocess.Popen:
        """Started with the job's clock (netsim_ddp.common.clock), dying with the agent."""
        env = {**(kwargs.pop("env", None) or os.environ),
               CLOCK_OFFSET_ENV: repr(self.clock_offset)}
        return subprocess.Popen(list(argv), preexec_fn=_die_with_parent, env=env, **kwargs)


def _die_with_parent() -> None:
    """In the child: SIGTERM when the agent dies, however it dies (torchrun then stops its
    ranks)."""
    libc.prctl(PR_SET_PDEATHSIG, signal.SIGTERM, 0, 0, 0)


def _reason(exc: BaseException) -> str:
    if isinstance(exc, KeyboardInterrupt):
        return "interrupted (Ctrl-C)"
    if isinstance(exc, SystemExit):
        return f"stopped by a signal (exit {exc.code})"
    return str(exc) or type(exc).__name__


def _rate(bps: float | None) -> str:
    return format_rate(bps) if bps else "unshaped"


def run_host(options: HostOptions, progress: Progress = lambda message: None
             ) -> ScenarioReport | str:
    # SIGTERM and SIGHUP (a scheduler cancelling the job) end the agent through its
    # `finally`s, so the NIC is restored.
    with signals_raise():
        return HostAgent(options, progress).run()
