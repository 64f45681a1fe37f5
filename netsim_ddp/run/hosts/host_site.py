"""Real hosts as a site (run/site.py): each launch a phase every agent runs as its torchrun,
background flows as phases too."""

from __future__ import annotations

import contextlib
import json
from collections.abc import Callable, Iterator, Mapping
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Protocol

from netsim_ddp.fabric.background import (
    BackgroundBytes,
    BackgroundError,
    EndReport,
    assemble,
)
from netsim_ddp.run.hosts.host_control import Control, rank_of_key
from netsim_ddp.run.hosts.host_options import HostOptions
from netsim_ddp.run.site import RunOptions, Site
from netsim_ddp.verdicts.scenario_report import ScenarioReport
from netsim_ddp.workload import ModeResult, RankSpec, WorkloadError
from netsim_ddp.workload.launcher.launch import read_results

OUT_MARK = "{out}"  # stands for each agent's own --out in a phase's environment


@dataclass
class Phase:
    index: int
    path: str  # under each agent's --out
    spec: str  # RankSpec JSON
    timeout_s: float
    profile: bool
    env: dict[str, str]
    port: int = 0  # `machine`: node 0's port for this phase's static rendezvous


class HostAgent(Protocol):
    """What the hosts' site needs of this host's agent (host_agent.HostAgent): its options, and
    running a phase, or its background ends, on this host."""

    options: HostOptions

    def run_phase(self, control: Control, phase: Phase) -> None: ...

    def background_phase(self, control: Control, index: int,
                          message: dict[str, Any]) -> None: ...

    def stop_traffic(self) -> None: ...


class PhaseRunner(Protocol):
    """An agent that runs a phase on its own share of the nodes (host or machine agent)."""

    def run_phase(self, control: Control, phase: Phase) -> None: ...


class PhasesSite(Site):
    """Nodes that live under several agents: every launch is a phase that member 0 posts on
    the store and every agent runs for the nodes it holds (its run_phase), member 0 too.
    Paths travel relative to each agent's --out; `port_of(index)`: the phase's rendezvous
    port, where the agents do not meet through the store itself (0: they do)."""

    def __init__(self, agent: PhaseRunner, control: Control, phases: Iterator[int],
                 options: RunOptions):
        super().__init__(options)
        self.agent, self.control, self.phases = agent, control, phases

    def port_of(self, index: int) -> int:
        return 0

    def launch(self, spec: RankSpec, out_dir: Path, timeout_s: float, *, profile: bool = False,
               env: Mapping[str, str] | None = None,
               watchdog: Callable[[], None] | None = None) -> dict[str, ModeResult]:
        # No watchdog to call: each agent watches its own end of the job (run_phase).
        out = self.options.out
        portable = {key: value.replace(str(out), OUT_MARK) for key, value in (env or {}).items()}
        index = next(self.phases)
        phase = Phase(index, str(Path(out_dir).relative_to(out)), spec.model_dump_json(),
                      timeout_s, profile, portable, port=self.port_of(index))
        self.control.set(f"phase/{index}", json.dumps(phase.__dict__))
        self.agent.run_phase(self.control, phase)
        return read_results(Path(out_dir).resolve(), spec, Path(out_dir) / "logs")


class HostsSite(PhasesSite):
    """The nodes live on real hosts, one agent each: every launch is a phase that each agent
    runs as its own torchrun (run_phase); background flows are phases too (_HostsTraffic).
    Results land on whichever host the rendezvous made rank 0; its agent shares them."""

    agent: HostAgent

    def traffic(self, signals: Path) -> _HostsTraffic:
        return _HostsTraffic(self.agent, self.control, self.phases, signals)


class _HostsTraffic(contextlib.AbstractContextManager):
    """Node 0's handle on the background flows of every host, as training.probe_and_train
    uses BackgroundTraffic on one host: started before the training phase, stopped after it
    with every end's byte series assembled into one BackgroundBytes."""

    def __init__(self, agent: HostAgent, control: Control, phases: Iterator[int],
                 signals: Path):
        self.agent, self.control, self.phases = agent, control, phases
        self.portable = str(signals).replace(str(agent.options.out_dir), OUT_MARK)

    def _phase(self, message: dict[str, Any]) -> int:
        index = next(self.phases)
        self.control.set(f"phase/{index}", json.dumps(message))
        self.agent.background_phase(self.control, index, message)
        return index

    def __enter__(self) -> _HostsTraffic:
        self._phase({"background": "start", "signals": self.portable})
        return self

    def __exit__(self, *_exc) -> None:
        self.agent.stop_traffic()  # only left running when the run failed: no account

    def check(self) -> None:
        """Nothing to do here: each agent watches its own ends while its ranks run."""

    def stop(self) -> BackgroundBytes:
        control, nnodes = self.control, self.agent.options.nnodes
        index = self._phase({"background": "stop-senders"})  # everywhere, before any sink
        control.wait_for([f"background/{index}/senders-stopped/{rank}" for rank in range(nnodes)],
                         self.agent.options.reply_timeout_s, lambda missing: ", ".join(
            control.describe(rank_of_key(key)) for key in missing)
            + " did not stop its background senders")
        index = self._phase({"background": "stop"})
        keys = [f"background/{index}/ends/{rank}" for rank in range(nnodes)]
        control.wait_for(keys, self.agent.options.reply_timeout_s, lambda missing: ", ".join(
            control.describe(rank_of_key(key)) for key in missing)
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


# -- the phases, from both sides ----------------------------------------------------------------

def lead_phases(control: Control, phases: Iterator[int], report: ScenarioReport,
                train: Callable[[], None]) -> ScenarioReport:
    """Member 0: `train` (the probe and every mode, each launch a phase the site posts); a
    workload failure becomes the report's error and every agent's abort. The last phase tells
    the others the verdict."""
    try:
        train()
    except WorkloadError as exc:
        report.error = str(exc)
        control.abort(report.error)
    control.set(f"phase/{next(phases)}", json.dumps({"done": report.status}))
    return report


def follow_phases(control: Control, handle: Callable[[int, dict[str, Any]], None]) -> str:
    """The other members: `handle(index, message)` each phase member 0 posts, in order, until
    the last one; returns the job's status as member 0 published it."""
    for index in range(1_000_000):
        control.wait_for([f"phase/{index}"], None, lambda _: "")
        message = control.get_json(f"phase/{index}")
        if "done" in message:
            return str(message["done"])
        handle(index, message)
    raise AssertionError("unreachable")
