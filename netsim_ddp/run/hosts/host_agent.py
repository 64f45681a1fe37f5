"""`netsim-ddp host`: one agent per real host, started by the cluster's own scheduler.

The agents form the job over c10d's TCPStore at --master-addr:--master-port: node 0's agent
hosts it, every agent connects to it, and each phase's torchrun joins its c10d rendezvous
through the same store (`--rdzv-backend c10d`, `is_host=false`), so the job needs one port.
Over the store the agents

1. say hello (node rank, hostname, NIC address, a digest of the scenario they were given):
   a node that never arrives within --join-timeout ends every agent's run, named;
2. shape their own NIC to their node's link for the traffic to and from the other hosts only
   (fabric/nic/shaping.py, job_plan.py: recorded first, restored exactly; the rest of the NIC's
   traffic passes unshaped and uncounted);
3. measure their clock's offset to node 0's (netsim_ddp.common.clock), so every timestamp of the
   job (measured windows, background byte series, each rank's steps) is on one clock;
4. run phases: node 0 runs the very code `netsim-ddp run` runs (training.probe_and_train and
   judge.judge_run) with a launcher that publishes each launch as a phase; every agent
   then starts its torchrun for it. Results land on whichever host the rendezvous made rank 0;
   its agent uploads them to the store, so node 0 always has them. Background flows are
   phases too: each agent starts the sinks of the flows to its node, publishes their ports,
   starts the senders of the flows from its node to the other hosts' addresses, and at the
   end sends node 0 its ends' byte series, which node 0 assembles into the account `run`
   makes (judge.judge_run: the same subtraction and background checks);
5. end: node 0 publishes the verdict, every agent restores its NIC and reports that it did.

Failures: an agent that fails posts `abort` (the first one wins) with the reason and its
node's name; every agent watches for it, and for heartbeats that stop (an agent that was
killed, a host that went away), and ends its own torchrun and restores its NIC. A killed agent's
torchrun gets SIGTERM from the kernel (PR_SET_PDEATHSIG); whatever it left, `netsim-ddp clean`
kills by the job marker in its environment.
"""

from __future__ import annotations

import contextlib
import json
import os
import signal
import socket
import subprocess
import time
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from netsim_ddp.common.clock import CLOCK_OFFSET_ENV
from netsim_ddp.common.signal_files import SIGNAL_DIR_ENV
from netsim_ddp.fabric import naming
from netsim_ddp.fabric.background import (
    BackgroundError,
    BackgroundTraffic,
)
from netsim_ddp.fabric.counters.own_link import NIC_ENV
from netsim_ddp.fabric.namespaces.netns import libc
from netsim_ddp.fabric.nic.checks import check_may_shape, check_nic, inspect_nic
from netsim_ddp.fabric.nic.shaping import JOB_ENV, NicRestoreError, ShapedNic
from netsim_ddp.fabric.teardown_signals import signals_raise
from netsim_ddp.hostfacts.nccl import rank_log_lines
from netsim_ddp.hostfacts.placement import Placement
from netsim_ddp.run.hosts.host_control import (
    HEARTBEAT_S,
    POLL_S,
    Control,
    constant_message,
    rank_of_key,
)
from netsim_ddp.run.hosts.host_options import (
    HostError,
    HostOptions,
    host_placement,
    validate,
)
from netsim_ddp.run.hosts.host_site import (
    OUT_MARK,
    HostsSite,
    Phase,
    follow_phases,
    lead_phases,
)
from netsim_ddp.run.site import RunOptions
from netsim_ddp.run.training import probe_and_train
from netsim_ddp.scenario.units import format_rate
from netsim_ddp.verdicts.judge import judge_run
from netsim_ddp.verdicts.scenario_report import ScenarioReport
from netsim_ddp.workload import RankSpec
from netsim_ddp.workload.contract.window import NODE_RANK_ENV
from netsim_ddp.workload.launcher.launch import (
    c10d_rendezvous,
    failure_report,
    kill_all,
    looks_like_echo,
    rank_env,
    rank_errors,
    torchrun_argv,
    torchrun_module,
)

__all__ = ["HostAgent", "run_host"]

END_WAIT_S = 60.0  # node 0 waits this long for every host to say its NIC is restored
PR_SET_PDEATHSIG = 1
Progress = Callable[[str], None]


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
                control.abort(stop_reason(exc))
                raise
        finally:
            control.close()

    def _join(self, control: Control) -> None:
        options = self.options
        assert self.placement is not None
        hello = {"hostname": self.hostname, "address": self.address, "nic": options.nic,
                 "backend": self.placement.backend,
                 "digest": options.digest(), "pid": os.getpid()}
        control.join(hello, ("--node-rank", "--nnodes"),
                     lambda rank: f"node {self.names[rank]} (node rank {rank})")
        if options.node_rank == 0:
            for rank, other in control.hellos.items():
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
                    self.stop_traffic()
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
                         lambda missing: ", ".join(control.describe(rank_of_key(key))
                                                   for key in missing)
                         + f" did not shape its NIC within {options.join_timeout_s:g} s")
        self.progress(f"{options.node_name}: {options.nic} shaped "
                      f"({_rate(shaping['egress_bps'])} out, "
                      f"{_rate(shaping['ingress_bps'])} in); all hosts ready")
        return self._lead(control) if options.node_rank == 0 else self._follow(control)

    # -- node 0 -------------------------------------------------------------------------------

    def _lead(self, control: Control) -> ScenarioReport:
        options = self.options
        assert self.placement is not None
        workload = options.workload(self.placement.backend)
        report = ScenarioReport(options.scenario, run_id=self.job, placement=self.placement)
        phases = iter(range(1_000_000))

        site = HostsSite(self, control, phases, RunOptions(
            options.out_dir, allow_untrusted=options.allow_untrusted,
            timeout_s=options.timeout_s, progress=self.progress))
        site.transport_ifname = ",".join(sorted({hello["nic"]
                                                 for hello in control.hellos.values()}))

        def train() -> None:
            trained = probe_and_train(
                options.scenario.model_copy(update={"workload": workload}), site, report)
            if trained is not None:
                judge_run(report, *trained)

        return lead_phases(control, phases, report, train)

    def _hosts_summary(self, control: Control) -> dict[str, dict[str, object]]:
        """Per node: its host, NIC, the shaping read back from its kernel, and whether its
        NIC came back as recorded (node 0 waits a while for the others to say so)."""
        summary = control.summary(END_WAIT_S, lambda rank, hello: {
            "node_rank": rank, "hostname": hello["hostname"], "address": hello["address"],
            "nic": hello["nic"]}, {"shaped": "shaping", "restored": "restored", "clock": "clock"})
        return {self.names[rank]: entry for rank, entry in summary.items()}

    # -- other nodes --------------------------------------------------------------------------

    def _follow(self, control: Control) -> str:
        def handle(index: int, message: dict[str, Any]) -> None:
            if "background" in message:
                self.background_phase(control, index, message)
            else:
                self.run_phase(control, Phase(**message))

        return follow_phases(control, handle)

    # -- background flows: this host's ends ----------------------------------------------------

    def background_phase(self, control: Control, index: int, message: dict[str, Any]) -> None:
        """Start or stop this host's ends of the background flows, as member 0 says."""
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
            control.wait_for([key], options.join_timeout_s, constant_message(late))
            traffic.start_sender(flow_index, node, control.hellos[destination]["address"],
                                 int(control.get(key)))
        control.set(f"background/{index}/ready/{me}", "")
        control.wait_for([f"background/{index}/ready/{rank}" for rank in range(options.nnodes)],
                         options.join_timeout_s, lambda missing: ", ".join(
                             control.describe(rank_of_key(key)) for key in missing)
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

    def stop_traffic(self) -> None:
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

    def run_phase(self, control: Control, phase: Phase) -> None:
        """One phase: this host's torchrun, run to its end; what it wrote reported to member 0."""
        options = self.options
        out = (options.out_dir / phase.path).resolve()
        logs = out / "logs"
        logs.mkdir(parents=True, exist_ok=True)
        spec_path = out / "spec.json"
        spec_path.write_text(phase.spec)
        argv = torchrun_argv(
            nnodes=options.nnodes, nproc_per_node=options.scenario.topology.ranks_per_node,
            rendezvous=c10d_rendezvous(f"{options.master_addr}:{options.master_port}",
                                       f"{self.job}-{phase.index}", options.join_timeout_s,
                                       self.address),
            spec_path=spec_path, out_dir=out, log_dir=logs / options.node_name,
            profile_dir=out if phase.profile else None,
            agent=torchrun_module(RankSpec.model_validate_json(phase.spec)))
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
                    control.check()
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
                         + ", ".join(control.describe(rank_of_key(key)) for key in missing))
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


def stop_reason(exc: BaseException) -> str:
    """What stopped an agent, in words for the other members: Ctrl-C, a signal, or the error."""
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
