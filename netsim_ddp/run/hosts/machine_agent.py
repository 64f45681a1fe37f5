"""`netsim-ddp machine`: one scale model spread over several machines, one agent per machine,
started by the cluster's own scheduler (srun, a Kubernetes Indexed Job).

Machine m holds a contiguous share of the emulated nodes (scenario.machines.machine_share):
its own namespaces, switch and shaping, built as `run` builds them on one host
(fabric.emulated_network, only those nodes, with the addresses they have in the whole job's
subnet), its switch joined to the other machines' over its NIC by a VXLAN port (fabric.overlay).
Every machine runs the job's one dilation k: its links at rate / k, its nodes' TCP clocks
dilated, its replayed compute k times longer.

The agents meet over c10d's TCPStore at --master-addr:--master-port (run/hosts/host_control: hellos,
heartbeats, the first abort); machine 0 draws the job's id and subnet, checks that every
machine was given the same scenario, and then runs the very code `run` runs
(training.probe_and_train, judge.judge_run) with a site whose every launch is a phase: each
machine starts one torchrun per node it holds, all meeting at node 0's emulated address
(static rendezvous), so bootstrap and training ride the emulated links. Node 0 is machine
0's, so rank 0 writes the results there. The all-reduce probe spans every machine: a job
whose underlay cannot carry the dilated links is refused like any other.

Failures: as for `host` (the first abort wins, silent heartbeats end the job); each machine
takes its fabric down on the way out and says so; SIGKILL leaves empty namespaces (with the
VXLAN port in the switch's) that `netsim-ddp clean` sweeps.
"""

from __future__ import annotations

import contextlib
import ipaddress
import json
import os
import socket
import time
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from netsim_ddp.common.clock import CLOCK_OFFSET_ENV
from netsim_ddp.common.signal_files import SIGNAL_DIR_ENV
from netsim_ddp.fabric import naming
from netsim_ddp.fabric.emulated_network import Fabric, choose_subnet
from netsim_ddp.fabric.errors import FabricError
from netsim_ddp.fabric.nic.checks import NicInfo, check_nic, inspect_nic
from netsim_ddp.fabric.overlay import check_underlay, overlay
from netsim_ddp.fabric.teardown_signals import signals_raise
from netsim_ddp.hostfacts.placement import Placement, place
from netsim_ddp.measure.target_time import to_target_time
from netsim_ddp.run.hosts.host_agent import stop_reason
from netsim_ddp.run.hosts.host_control import POLL_S, Control, rank_of_key
from netsim_ddp.run.hosts.host_options import AgentOptions, HostConfigError, HostError
from netsim_ddp.run.hosts.host_site import OUT_MARK, Phase, PhasesSite, follow_phases, lead_phases
from netsim_ddp.run.site import RunOptions
from netsim_ddp.run.training import probe_and_train
from netsim_ddp.scenario.dilation import dilated
from netsim_ddp.scenario.limits import check_host
from netsim_ddp.scenario.machines import MachineConfigError, check_machines, machine_share
from netsim_ddp.scenario.spec import Scenario, ScenarioError
from netsim_ddp.verdicts.judge import judge_run
from netsim_ddp.verdicts.scenario_report import ScenarioReport
from netsim_ddp.workload import RankSpec, WorkloadError
from netsim_ddp.workload.launcher.launch import (
    rank_env,
    run_nodes,
    torchrun_argv,
    torchrun_module,
)

__all__ = ["MachineAgent", "MachineOptions", "run_machine"]

END_WAIT_S = 60.0  # machine 0 waits this long for every machine to say its fabric is gone
PHASE_PORT = 29600  # + the phase's index: node 0's port for that phase's rendezvous
Progress = Callable[[str], None]


@dataclass(frozen=True, kw_only=True)
class MachineOptions(AgentOptions):
    machine_rank: int
    machines: int

    # The control channel's words (host_control.Member): a machine is one of its members.
    @property
    def node_rank(self) -> int:
        return self.machine_rank

    @property
    def nnodes(self) -> int:
        return self.machines

    @property
    def members(self) -> int:
        return self.machines

    @property
    def share(self) -> range:
        """The emulated nodes this machine holds."""
        return machine_share(self.scenario.topology.nodes, self.machines, self.machine_rank)


def validate(options: MachineOptions) -> Placement:
    """Everything refused before anything on the machine changes; this machine's placement."""
    try:
        check_machines(options.scenario, options.machines)
        machine_share(options.scenario.topology.nodes, options.machines, options.machine_rank)
    except MachineConfigError as exc:
        raise HostConfigError(str(exc)) from None
    scenario, share = options.scenario, options.share
    workload = scenario.workload
    assert workload is not None  # check_machines
    topology = scenario.topology.model_copy(update={"nodes": len(share), "names": None})
    try:  # what `run` checks of a whole scenario, for this machine's share of it
        check_host(scenario.model_copy(update={"topology": topology}))
    except ScenarioError as exc:
        raise HostConfigError(f"{exc} (this machine's share: nodes {share.start}.."
                              f"{share.stop - 1} of {scenario.topology.nodes}; more machines "
                              "hold fewer each: `netsim-ddp plan --machine` sizes them)"
                              ) from None
    placement = place(workload.model_copy(update={"backend": "gloo"}), topology)
    if placement.refused:
        raise HostConfigError(f"{options.scenario.path or options.scenario.name}: "
                              f"{placement.describe()}")
    return placement


class MachineAgent:
    def __init__(self, options: MachineOptions, progress: Progress):
        self.options = options
        self.progress = progress
        self.names = [str(m) for m in range(options.machines)]
        self.hostname = socket.gethostname()
        self.job = ""
        self.subnet: ipaddress.IPv4Network | None = None
        self.clock_offset = 0.0  # to machine 0's CLOCK_MONOTONIC (netsim_ddp.common.clock)
        self.fabric: Fabric | None = None
        self.placement: Placement | None = None

    @property
    def name(self) -> str:
        return f"machine {self.options.machine_rank}"

    # -- the whole life of one agent ----------------------------------------------------------

    def run(self) -> ScenarioReport | str:
        """Machine 0: the report. The others: the job's status as machine 0 published it."""
        options = self.options
        self.placement = validate(options)
        try:  # refused before any machine waits on us
            nic = inspect_nic(options.nic)
            check_nic(nic, peers_only=True)  # up, not loopback, addressed
            check_underlay(nic, options.scenario.link.mtu)
        except FabricError as exc:
            raise HostConfigError(str(exc)) from None
        self.progress(f"{self.name}: nodes {options.share.start}..{options.share.stop - 1}; "
                      f"joining at {options.master_addr}:{options.master_port}")
        control = Control(options, self.names, role="machine")
        try:
            try:
                self._join(control, nic)
                return self._built_run(control, nic)
            except BaseException as exc:
                control.abort(stop_reason(exc))
                raise
        finally:
            control.close()

    def _join(self, control: Control, nic: NicInfo) -> None:
        options = self.options
        hello = {"hostname": self.hostname, "address": nic.addresses[0], "nic": nic.ifname,
                 "nodes": [options.share.start, options.share.stop],
                 "digest": options.digest(), "pid": os.getpid()}
        control.join(hello, ("--machine-rank", "--machines"), lambda m: f"machine {m}")
        if options.machine_rank == 0:
            self.job = naming.new_run_id()
            self.subnet = choose_subnet(options.scenario, self.job)
            control.set("job", json.dumps({"job": self.job, "subnet": str(self.subnet)}))
            control.serve_clock()
            error = 0.0
        else:
            control.wait_for(["job"], options.join_timeout_s,
                             lambda _: "machine 0 did not start the job")
            job = control.get_json("job")
            self.job, self.subnet = job["job"], ipaddress.IPv4Network(job["subnet"])
            self.clock_offset, error = control.offset_to_node0()
        control.set(f"clock/{options.machine_rank}",
                    json.dumps({"offset_s": self.clock_offset, "error_s": error}))

    def _built_run(self, control: Control, nic: NicInfo) -> ScenarioReport | str:
        """This machine's share of the fabric, joined to the others', for the whole job."""
        options, scenario = self.options, self.options.scenario
        k = float(scenario.emulation.dilation)  # a number: check_machines refuses 'auto'
        host = dilated(scenario, k) if k != 1 else scenario
        remotes = [hello["address"] for m, hello in sorted(control.hellos.items())
                   if m != options.machine_rank]
        outcome: ScenarioReport | str | None = None
        restored: dict[str, Any] = {"ok": False, "error": "never built"}
        try:
            with Fabric(host, dilation=k, only_nodes=options.share, subnet=self.subnet) as fabric:
                assert fabric.plan is not None
                restored["error"] = "left while running"
                with overlay(fabric.plan, nic, remotes, self.job):
                    self.fabric = fabric
                    control.set(f"built/{options.machine_rank}", json.dumps({
                        "run_id": fabric.run_id, "tcp_settings": fabric.tcp_settings,
                        "delay_backends": fabric.delay_backends,
                        "nodes": [node.name for node in fabric.nodes]}))
                    control.wait_for([f"built/{m}" for m in range(options.machines)],
                                     options.join_timeout_s, lambda missing: ", ".join(
                        control.describe(rank_of_key(key)) for key in missing)
                        + f" did not build its nodes within {options.join_timeout_s:g} s")
                    self.progress(f"{self.name}: {len(fabric.nodes)} nodes built "
                                  f"(run {fabric.run_id}, job {self.job}); all machines ready")
                    outcome = (self._lead(control, host, k) if options.machine_rank == 0
                               else self._follow(control))
            restored = {"ok": True, "error": None}
        except BaseException as exc:
            # The fabric's ExitStack ran whatever ended the run; only its own failure (a
            # FabricError from the teardown) can leave something behind.
            restored = {"ok": not isinstance(exc, FabricError), "error": stop_reason(exc)}
            raise
        finally:
            self.fabric = None
            with contextlib.suppress(HostError):
                control.set(f"restored/{options.machine_rank}", json.dumps(restored))
        if isinstance(outcome, ScenarioReport):
            outcome.hosts = self._machines_summary(control)
        assert outcome is not None
        return outcome

    # -- machine 0 ----------------------------------------------------------------------------

    def _lead(self, control: Control, host: Scenario, k: float) -> ScenarioReport:
        options, scenario = self.options, self.options.scenario
        assert self.placement is not None  # validated
        workload = options.workload(self.placement.backend)
        report = ScenarioReport(scenario, run_id=self.job, out_dir=options.out_dir,
                                placement=self.placement,
                                host_scenario=host if k != 1 else None, dilation=k,
                                machines=options.machines)
        built = [control.get_json(f"built/{m}") for m in range(options.machines)]
        report.tcp_settings = {n: s for b in built for n, s in b["tcp_settings"].items()}
        report.delay_backends = {n: s for b in built for n, s in b["delay_backends"].items()}
        phases = iter(range(1_000_000))
        site = _MachinesSite(self, control, phases, RunOptions(
            options.out_dir, allow_untrusted=options.allow_untrusted,
            timeout_s=options.timeout_s, progress=self.progress))

        def train() -> None:
            trained = probe_and_train(host.model_copy(update={"workload": workload}), site,
                                      report)
            if trained is not None:
                results, background = trained
                judge_run(report, {mode: to_target_time(result, k)
                                       for mode, result in results.items()}, background)

        return lead_phases(control, phases, report, train)

    def _machines_summary(self, control: Control) -> dict[str, dict[str, object]]:
        """Per machine: its host, NIC, nodes, what it built, its clock, and whether its fabric
        is gone (machine 0 waits a while for the others to say so)."""
        summary = control.summary(END_WAIT_S, lambda m, hello: {
            "machine_rank": m, "hostname": hello["hostname"], "address": hello["address"],
            "nic": hello["nic"], "nodes": list(range(*hello["nodes"]))},
            {"built": "built", "restored": "restored", "clock": "clock"})
        return {f"machine{m}": entry for m, entry in summary.items()}

    # -- the other machines -------------------------------------------------------------------

    def _follow(self, control: Control) -> str:
        return follow_phases(control, lambda _, message: self.run_phase(control,
                                                                          Phase(**message)))

    # -- one phase: a torchrun per node this machine holds ------------------------------------

    def run_phase(self, control: Control, phase: Phase) -> None:
        """One phase: a torchrun for each node this machine holds, run to its end."""
        options, fabric = self.options, self.fabric
        assert fabric is not None and fabric.plan is not None and self.placement is not None
        out = (options.out_dir / phase.path).resolve()
        logs = out / "logs"
        logs.mkdir(parents=True, exist_ok=True)
        spec_path = out / "spec.json"
        spec_path.write_text(phase.spec)
        spec = RankSpec.model_validate_json(phase.spec)
        node0 = str(next(fabric.plan.subnet.hosts()))  # plan_fabric's address of node 0
        argvs = [torchrun_argv(
            nnodes=options.scenario.topology.nodes,
            nproc_per_node=options.scenario.topology.ranks_per_node, node_rank=node.index,
            master_addr=node0, master_port=phase.port, spec_path=spec_path, out_dir=out,
            log_dir=logs / node.name, profile_dir=out if phase.profile else None,
            agent=torchrun_module(spec)) for node in fabric.nodes]
        local = {key: value.replace(OUT_MARK, str(options.out_dir))
                 for key, value in phase.env.items()}
        if SIGNAL_DIR_ENV in local:  # where the ranks mark their windows' edges
            Path(local[SIGNAL_DIR_ENV]).mkdir(parents=True, exist_ok=True)
        env = rank_env("eth0", {**local, CLOCK_OFFSET_ENV: repr(self.clock_offset)})
        try:
            run_nodes(fabric.nodes, argvs, logs, env, phase.timeout_s,
                      watchdog=_throttled(control.check),
                      node_env=self.placement.node_env(self.job, [n.name for n in fabric.nodes]),
                      node_ranks=[node.index for node in fabric.nodes])
        except HostError:
            raise  # another machine's failure, already posted
        except WorkloadError as exc:
            control.abort(f"{self.name}: {exc}")
            raise
        control.set(f"status/{phase.index}/{options.machine_rank}", "")
        control.wait_for([f"status/{phase.index}/{m}" for m in range(options.machines)],
                         options.reply_timeout_s,
                         lambda missing: f"phase {phase.index}: no word from "
                         + ", ".join(control.describe(rank_of_key(key)) for key in missing))


class _MachinesSite(PhasesSite):
    """The nodes live on several machines, one agent each: every launch is a phase that each
    machine runs for the nodes it holds (MachineAgent.run_phase), meeting at node 0's address
    on a port of the phase's own. Node 0 is machine 0's (machine_share), so rank 0 writes the
    results here."""

    def port_of(self, index: int) -> int:
        return PHASE_PORT + index


def _throttled(check: Callable[[], None], every_s: float = POLL_S) -> Callable[[], None]:
    """`check`, at most every `every_s` (run_nodes calls its watchdog every 0.1 s)."""
    last = [0.0]

    def throttled() -> None:
        if time.monotonic() - last[0] >= every_s:
            last[0] = time.monotonic()
            check()

    return throttled


def run_machine(options: MachineOptions, progress: Progress = lambda message: None
                ) -> ScenarioReport | str:
    # SIGTERM and SIGHUP (a scheduler cancelling the job) end the agent through its
    # `finally`s, so the fabric is taken down.
    with signals_raise():
        return MachineAgent(options, progress).run()
