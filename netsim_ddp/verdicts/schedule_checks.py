"""Reading a run against its `[[link.schedule]]`: which link state each iteration ran under,
whether each slower state slowed the collectives by what its rates predict, and whether any
change let traffic through above the cap (it must not: changes are made in place)."""

from __future__ import annotations

import statistics

from netsim_ddp.common.metrics import ring_allreduce_lower_bound
from netsim_ddp.fabric.fidelity import expected_goodput
from netsim_ddp.fabric.plan import tbf_burst
from netsim_ddp.fabric.schedule import (
    FLAP_RATE_BPS,
    LinkScheduler,
    ModeWindow,
    counters_continuous,
    iteration_states,
    max_rate_near,
    plan_schedule,
    state_label,
    state_links,
)
from netsim_ddp.measure.mode_report import ModeReport
from netsim_ddp.scenario.spec import Scenario
from netsim_ddp.verdicts.gate import Verdict, host_verdict

SLOWDOWN_TOLERANCE = 0.25  # measured / predicted collective time, per link state
MIN_ITERATIONS = 3  # in a state, for its median to mean anything
CAP_SLACK = 1.05  # counter sampling is not instantaneous


def _window(scheduler: LinkScheduler, mode: str) -> ModeWindow | None:
    return next((w for w in scheduler.windows if w.mode == mode), None)


def _states(mode: ModeReport, window: ModeWindow) -> list[tuple[int, int]] | None:
    started = mode.result.started_monotonic
    if started is None:
        return None
    return iteration_states(started, mode.result.iteration_s, window.changes)


def attach_link_states(modes: dict[str, ModeReport], scheduler: LinkScheduler) -> None:
    """Each iteration's link state, as a label: "initial", "1: n1 rate 250Mbit/s", or
    "0 -> 1" when a change happened while it ran."""
    for mode in modes.values():
        window = _window(scheduler, mode.result.mode)
        states = _states(mode, window) if window else None
        if window is None or states is None:
            continue
        mode.link_states = [state_label(a, window.changes) if a == b else f"{a} -> {b}"
                            for a, b in states]


def schedule_checks(scenario: Scenario, modes: dict[str, ModeReport],
                    scheduler: LinkScheduler, host: Scenario | None = None) -> list[Verdict]:
    """`host`: a dilated run's host scenario (scenario.dilation): its rates are what the
    counters saw; the slowdowns, in target time, are judged against the target's rates."""
    steps = plan_schedule(scenario)
    links = state_links(scenario, steps)
    host_links = state_links(host, plan_schedule(host)) if host is not None else links
    checks = []
    for name, mode in modes.items():
        window = _window(scheduler, name)
        if window is None:
            checks.append(host_verdict(f"schedule:{name}", False,
                                       f"{name}: the link schedule never saw its measured window"))
            continue
        if len(window.changes) < len(steps):
            checks.append(host_verdict(
                f"schedule:{name}", False,
                f"{name}: only {len(window.changes)} of {len(steps)} link changes happened "
                "inside the measured window; move them earlier or measure more iterations"))
        checks.extend(_slowdown_checks(name, mode, window, links))
        checks.append(_shaping_check(name, window, steps, host_links))
    return checks


def _bottleneck(links) -> float:
    return min(expected_goodput(link.rate, link.mtu) for link in links)


def _slowdown_checks(name: str, mode: ModeReport, window: ModeWindow,
                     links: list[list]) -> list[Verdict]:
    """Each later state's median collective time against the first state's, plus the extra
    serialisation time the rates predict for the gradients' ring all-reduce."""
    states = _states(mode, window)
    r = mode.result
    series = r.collective_s or r.iteration_s
    if states is None:
        return []
    by_state: dict[int, list[float]] = {}
    for (a, b), value in zip(states, series, strict=True):
        if a == b:
            by_state.setdefault(a, []).append(value)
    reference = by_state.get(0, [])
    if len(reference) < MIN_ITERATIONS:
        return [host_verdict(f"schedule:slowdown:{name}", False,
                             f"{name}: {len(reference)} iterations ran before the first link "
                             f"change (needs >= {MIN_ITERATIONS}); move the change later")]
    before = statistics.median(reference)
    bound = ring_allreduce_lower_bound(r.sent_bytes_per_iteration, r.world_size,
                                       _bottleneck(links[0]))
    checks = []
    for state, values in sorted(by_state.items()):
        if state == 0 or any(link.rate <= FLAP_RATE_BPS for link in links[state]):
            continue  # a flap: nothing moves, there is no rate to predict from
        if len(values) < MIN_ITERATIONS:
            checks.append(host_verdict(
                f"schedule:slowdown:{name}:{state}", False,
                f"{name}: only {len(values)} iterations ran wholly under "
                f"'{state_label(state, window.changes)}' (needs >= {MIN_ITERATIONS}); measure "
                "more iterations or change the link earlier"))
            continue
        predicted = before + ring_allreduce_lower_bound(
            r.sent_bytes_per_iteration, r.world_size, _bottleneck(links[state])) - bound
        measured = statistics.median(values)
        ratio = measured / predicted
        ok = abs(ratio - 1) <= SLOWDOWN_TOLERANCE
        label = state_label(state, window.changes)
        checks.append(host_verdict(
            f"schedule:slowdown:{name}:{state}", ok,
            f"{name} under '{label}': median collective {measured * 1e3:.1f} ms over "
            f"{len(values)} iterations vs {before * 1e3:.1f} ms before ({measured / before:.2f}x);"
            f" the rates predict {predicted * 1e3:.1f} ms ({predicted / before:.2f}x); "
            f"measured/predicted {ratio:.2f}, needs within +-{SLOWDOWN_TOLERANCE:.0%}"))
    return checks


def _shaping_check(name: str, window: ModeWindow, steps, links: list[list]) -> Verdict:
    """Around each change, no 50 ms of traffic above the higher of the two caps (plus one
    bucket of burst), and the qdiscs' counters never restarted (no delete + add)."""
    problems, worst = [], 0.0
    for index, change in enumerate(window.changes):
        node = steps[index].node
        caps = [links[index][node], links[index + 1][node]]
        cap = max(link.rate for link in caps)
        burst_bits = max(tbf_burst(link.rate, link.mtu) for link in caps) * 8
        node_name = change.label.split(" ", 1)[0]
        for side, samples in window.counters.items():
            if not side.startswith(node_name + " "):
                continue
            seen = max_rate_near(samples, change.monotonic_s)
            allowed = CAP_SLACK * cap + burst_bits / 0.05
            worst = max(worst, seen / cap)
            if seen > allowed:
                problems.append(f"{side} reached {seen / 1e6:.0f} Mbit/s around "
                                f"'{change.label}' (cap {cap / 1e6:.0f} Mbit/s)")
    for side, samples in window.counters.items():
        if not counters_continuous(samples):
            problems.append(f"{side}: its qdisc counters restarted (the qdisc was replaced)")
    detail = (f"{name}: {len(window.changes)} link changes applied in place; the busiest 50 ms "
              f"next to a change carried {worst:.2f} x the cap")
    return host_verdict(f"schedule:shaping:{name}", not problems,
                        detail + ("; " + "; ".join(problems) if problems else ""))
