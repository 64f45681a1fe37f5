"""A userspace delay line: netem's delay, jitter and loss for kernels without sch_netem.

A C forwarder (compiled at first use) runs inside a namespace of its own between two
interfaces: frames arriving on IN are held for delay +- jitter, dropped with probability
loss, else sent on OUT. OUT -> IN is redirected in the kernel with no delay.

    spec = DelayLineSpec(delay_s=0.001, jitter_s=0.0, distribution="uniform", loss_pct=0.0,
                         seed=1, queue_bytes=queue_bytes_for(1e9, 0.001, 0.0))
    prepare_delay_namespace(ipr_in_delay_ns, "in", "out")
    with netns.entered(delay_ns):
        proc = subprocess.Popen(command(spec, "in", "out"), stdout=subprocess.PIPE, text=True)
    wait_ready(proc)
    ...
    proc.terminate(); stats = parse_stats(proc.communicate()[0])
"""

from __future__ import annotations

import json
import select
import subprocess
import time
from dataclasses import dataclass

from netsim_ddp.fabric.delayline.build import DelayLineBuildError, build_binary
from netsim_ddp.fabric.delayline.kernel import prepare_delay_namespace, redirect_reverse_path
from netsim_ddp.fabric.errors import FabricError

__all__ = [
    "DISTRIBUTIONS", "MAX_DELAY_S", "MAX_QUEUE_BYTES", "DelayLineBuildError", "DelayLineError",
    "DelayLineSpec", "build_binary", "command", "parse_stats", "prepare_delay_namespace",
    "queue_bytes_for", "redirect_reverse_path", "wait_ready",
]

DISTRIBUTIONS = ("uniform", "normal", "pareto", "paretonormal")
MIN_QUEUE_BYTES = 4 << 20  # a few 64 KB GSO frames even on a slow, short link
# The forwarder's own limits (forwarder.c: MAX_QUEUE_BYTES, MAX_DELAY_NS); it refuses beyond.
MAX_QUEUE_BYTES = 1 << 30
MAX_DELAY_S = 3600.0


class DelayLineError(FabricError):
    """The forwarder failed to start, died, or did not report (a run records it as an error)."""


@dataclass(frozen=True)
class DelayLineSpec:
    """One direction of one link: what the forwarder does to each frame.

    jitter is +- around delay (the per-frame delay is clamped at >= 0), drawn from
    `distribution` as netem does; loss_pct is per wire packet; queue_bytes bounds what is held
    (frames beyond it are dropped and counted).
    """

    delay_s: float
    jitter_s: float = 0.0
    distribution: str = "uniform"
    loss_pct: float = 0.0
    seed: int = 0
    queue_bytes: int = 64 << 20

    def __post_init__(self) -> None:
        # `not a <= x <= b` also refuses NaN, which every comparison lets through.
        for name, value in (("delay_s", self.delay_s), ("jitter_s", self.jitter_s)):
            if not 0.0 <= value <= MAX_DELAY_S:
                raise ValueError(f"{name} must be within [0, {MAX_DELAY_S:g}] s (the "
                                 f"forwarder's range; >= 0), got {value}")
        if self.distribution not in DISTRIBUTIONS:
            raise ValueError(f"distribution must be one of {DISTRIBUTIONS}, "
                             f"got {self.distribution!r}")
        if not 0.0 <= self.loss_pct <= 100.0:
            raise ValueError(f"loss_pct must be within [0, 100], got {self.loss_pct}")
        if not 0 < self.queue_bytes <= MAX_QUEUE_BYTES:
            raise ValueError(f"queue_bytes must be within [1, {MAX_QUEUE_BYTES}], "
                             f"got {self.queue_bytes}")


def queue_bytes_for(rate_bps: float, delay_s: float, jitter_s: float) -> int:
    """A queue that holds rate x (delay + jitter) x 2, within [MIN_QUEUE_BYTES,
    MAX_QUEUE_BYTES] (a link that needs more drops frames, which the health check reports)."""
    wanted = rate_bps / 8 * (delay_s + jitter_s) * 2
    if not wanted < MAX_QUEUE_BYTES:  # also inf and NaN
        return MAX_QUEUE_BYTES
    return max(MIN_QUEUE_BYTES, int(wanted))


def command(spec: DelayLineSpec, in_ifname: str, out_ifname: str, *,
            spin_us: float = 200.0, rt_priority: int = 0,
            rcvbuf_bytes: int = 1 << 20, late_bound_s: float | None = None,
            test_offset_error_ns: int = 0) -> list[str]:
    """argv that runs the forwarder; start it inside the delay namespace.

    spin_us: the most the forwarder busy-polls before a due time (it learns how late its
    wakeups are and spins that long; 0 never spins: less CPU, wakeup latency lands on frames).
    rt_priority > 0 asks for SCHED_FIFO (root only; falls back with a warning): it cut the
    worst lateness here from ms to ~100 us under contention.
    rcvbuf_bytes bounds the kernel queue in front of the delay, used only when the forwarder
    falls behind (overflow is counted as dropped_socket).
    late_bound_s: frames released later than this after their due time are counted
    (late_over_bound); by default the health check's bound for this delay.
    test_offset_error_ns: for tests only: every second receive batch maps its kernel stamps
    with a clock offset this much too large, as an interrupted offset sample would (the cause
    of issue 21); the forwarder must keep arrival order all the same.
    """
    from netsim_ddp.fabric.delayline.health import late_bound_s as default_late_bound_s

    late = default_late_bound_s(spec.delay_s) if late_bound_s is None else late_bound_s
    test_hook = (["--test-offset-error-ns", str(int(test_offset_error_ns))]
                 if test_offset_error_ns else [])
    return [
        str(build_binary()), "--in", in_ifname, "--out", out_ifname,
        "--delay-ns", str(round(spec.delay_s * 1e9)),
        "--jitter-ns", str(round(spec.jitter_s * 1e9)),
        "--dist", spec.distribution,
        "--loss", repr(spec.loss_pct / 100.0),
        "--seed", str(spec.seed),
        "--queue-bytes", str(spec.queue_bytes),
        "--spin-ns", str(round(spin_us * 1e3)),
        "--rt-priority", str(rt_priority),
        "--rcvbuf", str(rcvbuf_bytes),
        "--late-bound-ns", str(round(late * 1e9)),
        *test_hook,
    ]


def _json_lines(stdout: str) -> list[dict[str, object]]:
    lines = []
    for line in stdout.splitlines():
        line = line.strip()
        if line.startswith("{"):
            try:
                lines.append(json.loads(line))
            except json.JSONDecodeError:
                continue
    return lines


def parse_stats(stdout: str) -> dict[str, object]:
    """The counters the forwarder printed at exit (the last `"event": "stats"` line).

    Keys: received, received_bytes, forwarded, forwarded_bytes, dropped_loss,
    dropped_queue_full, dropped_socket, dropped_truncated, tx_errors, segmented_frames,
    segments_made, not_segmented, queued_at_exit, packet_overhead_bytes, queued_bytes_max
    (frame bytes plus per-packet memory), late_p50_us, late_p99_us, late_max_us, spin_us,
    late_bound_us, late_over_bound, jitter_us (as configured), reordered (frames released
    after a frame that arrived later: RFC 4737's reordered packets; only jitter may cause
    any), arrivals_clamped (frames whose arrival time, mapped from the kernel's stamp, came
    out earlier than the previous frame's and was taken as that instead: the clocks' error,
    harmless but counted), monotonic_ns.
    """
    stats = [line for line in _json_lines(stdout) if line.get("event") == "stats"]
    if not stats:
        raise DelayLineError(f"no stats line in the forwarder's output: {stdout[-500:]!r}")
    result = dict(stats[-1])
    result.pop("event")
    return result


def wait_ready(process: subprocess.Popen, timeout_s: float = 10.0) -> dict[str, object]:
    """Block until the forwarder says its sockets are bound (its first stdout line).

    Needs stdout=subprocess.PIPE with text=True. Raises DelayLineError if it exits first.
    """
    if process.stdout is None:
        raise DelayLineError("start the forwarder with stdout=subprocess.PIPE to wait for it")
    deadline = time.monotonic() + timeout_s
    while True:
        left = deadline - time.monotonic()
        if left <= 0:
            raise DelayLineError(f"the forwarder was not ready within {timeout_s} s")
        readable, _, _ = select.select([process.stdout], [], [], left)
        if not readable:
            continue
        line = process.stdout.readline()
        if not line:
            process.wait()
            stderr = process.stderr.read() if process.stderr else ""
            raise DelayLineError(f"the forwarder exited with {process.returncode} before it "
                                 f"was ready: {stderr.strip()}")
        for event in _json_lines(line):
            if event.get("event") == "ready":
                return event
