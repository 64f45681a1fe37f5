"""The emulated site: a run's nodes in the fabric's namespaces on this host (run/site.py is
the interface; run/hosts/host_site.py the real hosts'), and the watchdog its launches call."""

from __future__ import annotations

import contextlib
import time
from collections.abc import Callable, Iterator, Mapping
from pathlib import Path

from netsim_ddp.fabric import Fabric
from netsim_ddp.fabric.background import BackgroundTraffic
from netsim_ddp.fabric.counters.connection_sampler import ConnectionSampler
from netsim_ddp.fabric.counters.sampling_thread import SamplingThread
from netsim_ddp.fabric.counters.uplink_sampler import UplinkSampler
from netsim_ddp.fabric.delayline import health as delay_line_health
from netsim_ddp.fabric.schedule import LinkScheduler, plan_schedule
from netsim_ddp.hostfacts.placement import Placement
from netsim_ddp.measure.attribution import CounterSeries
from netsim_ddp.run.site import RunOptions, Site
from netsim_ddp.scenario.spec import Scenario
from netsim_ddp.verdicts.scenario_report import ScenarioReport
from netsim_ddp.workload import ModeResult, RankSpec, launch
from netsim_ddp.workload.launcher.script_launch import launch_script


class EmulatedSite(Site):
    """The nodes live in the fabric's namespaces on this host: torchrun in each, background
    flows between them, [[link.schedule]] on their links, the probe gated in the training
    launch."""

    gated_probe = True

    def __init__(self, fabric: Fabric, scenario: Scenario, placement: Placement,
                 options: RunOptions):
        super().__init__(options)
        self.fabric, self.scenario = fabric, scenario
        self.node_env = placement.node_env(fabric.run_id, [node.name for node in fabric.nodes])

    def launch(self, spec: RankSpec, out_dir: Path, timeout_s: float, *, profile: bool = False,
               env: Mapping[str, str] | None = None,
               watchdog: Callable[[], None] | None = None) -> dict[str, ModeResult]:
        scenario, fabric = self.scenario, self.fabric
        if spec.workload.is_script and spec.selected_modes():
            return launch_script(
                fabric.nodes, spec.workload, out_dir, timeout_s,
                ranks_per_node=scenario.topology.ranks_per_node,
                base_dir=scenario.path.parent if scenario.path else None, env=env,
                watchdog=watchdog, node_env=self.node_env, runs=spec.selected_modes(),
                dilation=spec.dilation)
        return launch(fabric.nodes, spec, out_dir, timeout_s,
                      ranks_per_node=scenario.topology.ranks_per_node, profile=profile,
                      env=env, watchdog=watchdog, node_env=self.node_env)

    def traffic(self, signals: Path) -> BackgroundTraffic:
        return BackgroundTraffic(self.fabric, self.scenario.background, signals=signals)

    def watch(self, traffic: BackgroundTraffic | None) -> Callable[[], None] | None:
        return watchdog(self.fabric, traffic)

    def scheduler(self, signals: Path) -> LinkScheduler | None:
        steps = plan_schedule(self.scenario)
        plan = self.fabric.plan
        assert plan is not None  # the fabric is built while the site is used
        return LinkScheduler(plan.nodes, plan.switch_netns, steps, signals) if steps else None

    @contextlib.contextmanager
    def sampled_counters(self, report: ScenarioReport) -> Iterator[None]:
        """The fabric's counters sampled while the ranks train, into `report` once they stop (read
        while the switch exists): the racks' uplink drops, and per connection where a neighbour's
        flows share the nodes' counters with the job."""
        fabric, scenario, progress = self.fabric, self.scenario, self.options.progress
        assert fabric.plan is not None  # built
        uplinks = UplinkSampler(fabric.plan)  # racks only: a flat switch has no uplinks
        connections = [ConnectionSampler(fabric.plan)] if scenario.background else []
        samplers: list[SamplingThread] = [uplinks, *connections]
        try:
            with contextlib.ExitStack() as sampling:
                for sampler in samplers:
                    sampling.enter_context(sampler)
                yield
        finally:
            report.uplinks = fabric.uplink_counters()
            report.counters = [CounterSeries(f"uplink {name} drops", None, points)
                               for name, points in uplinks.samples.items() if points]
            for sampler in connections:
                report.counters += [CounterSeries(name, None, points)
                                    for name, points in sorted(sampler.grown().items())]
            for sampler in samplers:
                if sampler.error:
                    progress(f"{scenario.name}: {sampler.thread_name} sampled until: "
                             f"{sampler.error}")


def watchdog(fabric: Fabric, traffic: BackgroundTraffic | None = None) -> Callable[[], None]:
    """What launch calls while the ranks run: a forwarder or background flow that died ends
    the run at once with its reason (not a gloo timeout minutes later), and the forwarders
    report their counters every SNAPSHOT_EVERY_S, for the per-mode checks."""
    last_snapshot = [time.monotonic()]

    def check() -> None:
        fabric.check_delay_lines()
        if traffic is not None:
            traffic.check()
        if time.monotonic() - last_snapshot[0] >= delay_line_health.SNAPSHOT_EVERY_S:
            last_snapshot[0] = time.monotonic()
            for monitor in fabric.delay_lines.values():
                monitor.request_snapshot()

    return check
