"""Is each forwarder alive, and did it do what the scenario asked?

A forwarder that dies takes its node's link down; the ranks would only notice minutes later,
as a gloo timeout that never names it. `ForwarderMonitor` reads a running forwarder's output in
threads (its counter lines and its stderr, so neither pipe fills up) and `check_alive` says at
once that it died, how, and what it wrote to stderr.

Its counters are judged per window (each mode's measured iterations) and for the whole run:
- drops the scenario did not ask for (queue full, socket overflow, truncated frames) at most
  MAX_DROP_FRACTION of the frames received, and no transmit error;
- lateness: the forwarder counts frames released more than `late_bound_s(delay)` after their
  due time; at most LATE_FRACTION of them may be, i.e. the 98th percentile stays within it;
- a link that carried training but shows no frame means the line is not in the path;
- order: without jitter no frame may leave after one that arrived after it (`reordered`):
  netem keeps order then, and TCP reads reordering as loss. With jitter, reordering is what
  the scenario asked for (netem's too): counted in the detail, not judged.
Configured loss (`dropped_loss`) is what the scenario asked for and is not judged here.
"""

from __future__ import annotations

import contextlib
import json
import os
import signal
import subprocess
import threading
import time
from collections.abc import Mapping, Sequence
from dataclasses import dataclass

from netsim_ddp.fabric.delayline import DelayLineError

# Bounds (README "Delay line health"). Lateness: 500 us or a quarter of the delay, whichever is
# larger: a 500 us link whose frames leave a further 500 us late no longer is a 500 us link.
LATE_FLOOR_S = 500e-6
LATE_SHARE_OF_DELAY = 0.25
# At most 2% beyond the bound: the p98 stays within it. Not 1%: on 2 vCPUs (AMD EPYC kind) a
# mode's window of delayed.toml reached 1.0-1.4% in about 1 window in 10 while the run's p99
# stayed near 100 us (README, "Delay line health").
LATE_FRACTION = 0.02
MAX_DROP_FRACTION = 1e-4  # unrequested drops per frame received
SNAPSHOT_EVERY_S = 0.5  # how often a running forwarder is asked for its counters
DROP_COUNTERS = ("dropped_queue_full", "dropped_socket", "dropped_truncated")
_STDERR_KEEP = 4000  # characters of a forwarder's stderr kept for messages


def late_bound_s(delay_s: float) -> float:
    """How late a frame may leave (after its due time) before it counts as late."""
    return max(LATE_FLOOR_S, LATE_SHARE_OF_DELAY * delay_s)


def describe_exit(returncode: int) -> str:
    if returncode < 0:
        try:
            return f"killed by {signal.Signals(-returncode).name}"
        except ValueError:
            return f"killed by signal {-returncode}"
    return f"exit code {returncode}"


class ForwarderMonitor:
    """Owns a running forwarder's output from its "ready" line on (see `wait_ready`).

    `snapshots` holds every counters line it printed (on SIGUSR1, and the last one at exit),
    after a zero line stamped 0: the counters at its start."""

    def __init__(self, node: str, process: subprocess.Popen) -> None:
        if process.stdout is None or process.stderr is None:
            raise DelayLineError("monitor a forwarder started with stdout and stderr piped")
        self.node = node
        self.process = process
        self.snapshots: list[dict[str, float]] = [{"monotonic_ns": 0}]
        self._stderr: list[str] = []
        self._lock = threading.Condition()
        self._stopping = False
        self._readers = [
            threading.Thread(target=self._read_stdout, name=f"nsd-dl-out-{node}", daemon=True),
            threading.Thread(target=self._read_stderr, name=f"nsd-dl-err-{node}", daemon=True),
        ]
        for reader in self._readers:
            reader.start()

    def _read_stdout(self) -> None:
        assert self.process.stdout is not None
        for line in self.process.stdout:
            with contextlib.suppress(json.JSONDecodeError):
                event = json.loads(line)
                if isinstance(event, dict) and event.pop("event", None) == "stats":
                    with self._lock:
                        self.snapshots.append(event)
                        self._lock.notify_all()

    def _read_stderr(self) -> None:
        assert self.process.stderr is not None
        for line in self.process.stderr:
            with self._lock:
                self._stderr.append(line)

    @property
    def stderr(self) -> str:
        with self._lock:
            return "".join(self._stderr).strip()[-_STDERR_KEEP:]

    def _death(self, returncode: int, what: str) -> DelayLineError:
        for reader in self._readers:  # its last words are in the pipes
            reader.join(timeout=1.0)
        return DelayLineError(
            f"the delay line of node {self.node} (pid {self.process.pid}) {what}: "
            f"{describe_exit(returncode)}; its stderr: {self.stderr or '(empty)'}")

    def check_alive(self) -> None:
        """Raise DelayLineError (exit status and stderr) if the forwarder has exited."""
        code = self.process.poll()
        if code is not None and not self._stopping:
            raise self._death(code, "died while the run needed it")

    def request_snapshot(self) -> None:
        """Ask for a counters line (SIGUSR1); it arrives in `snapshots` shortly."""
        if self.process.poll() is None and not self._stopping:
            with contextlib.suppress(ProcessLookupError):
                os.kill(self.process.pid, signal.SIGUSR1)

    def snapshot_now(self, timeout_s: float = 5.0) -> dict[str, float]:
        """Request a counters line and wait for it."""
        with self._lock:
            seen = len(self.snapshots)
        self.request_snapshot()
        deadline = time.monotonic() + timeout_s
        with self._lock:
            while len(self.snapshots) == seen:
                left = deadline - time.monotonic()
                if left <= 0 or self.process.poll() is not None:
                    break
                self._lock.wait(timeout=min(left, 0.1))
            if len(self.snapshots) > seen:
                return self.snapshots[-1]
        self.check_alive()
        raise DelayLineError(f"the delay line of node {self.node} did not report its counters "
                             f"within {timeout_s:g} s")

    def stop(self, grace_s: float) -> dict[str, float]:
        """SIGTERM it; its final counters. Raises DelayLineError if it had died, exits
        non-zero or prints no counters (the monitor keeps its snapshots either way)."""
        self._stopping = True
        died = self.process.poll()
        if died is None:
            self.process.send_signal(signal.SIGTERM)
        try:
            self.process.wait(timeout=grace_s)
        except subprocess.TimeoutExpired:
            self.process.kill()
            self.process.wait()
            raise self._death(self.process.returncode,
                              f"ignored SIGTERM for {grace_s:g} s and was killed") from None
        for reader in self._readers:
            reader.join(timeout=grace_s)
        if died is not None:
            raise self._death(died, "had died before the run ended")
        if self.process.returncode != 0:
            raise self._death(self.process.returncode, "failed when stopped")
        with self._lock:
            if len(self.snapshots) < 2:
                raise DelayLineError(f"the delay line of node {self.node} exited without "
                                     "reporting its counters")
            return dict(self.snapshots[-1])


# -- judging counters --------------------------------------------------------------------------

@dataclass(frozen=True)
class Health:
    """One forwarder over one window: passed or not, and the numbers that say so."""

    node: str
    passed: bool
    detail: str


def _at_or_before(snapshots: Sequence[Mapping[str, float]], t_ns: float) -> Mapping[str, float]:
    return max((s for s in snapshots if s["monotonic_ns"] <= t_ns),
               key=lambda s: s["monotonic_ns"], default=snapshots[0])


def _at_or_after(snapshots: Sequence[Mapping[str, float]],
                 t_ns: float) -> Mapping[str, float] | None:
    return min((s for s in snapshots if s["monotonic_ns"] >= t_ns),
               key=lambda s: s["monotonic_ns"], default=None)


def judge(node: str, before: Mapping[str, float], after: Mapping[str, float],
          expect_traffic: bool) -> Health:
    """The counters' growth from `before` to `after` against the bounds."""
    def grew(key: str) -> float:
        return float(after.get(key, 0)) - float(before.get(key, 0))

    received, forwarded = grew("received"), grew("forwarded")
    drops = sum(grew(key) for key in DROP_COUNTERS)
    tx_errors, late = grew("tx_errors"), grew("late_over_bound")
    reordered, jitter_us = grew("reordered"), float(after.get("jitter_us", 0))
    bound_us = float(after.get("late_bound_us", 0))
    problems = []
    if expect_traffic and received == 0:
        problems.append("it received no frame although the ranks trained across it "
                        "(is it in the path?)")
    if received and drops / received > MAX_DROP_FRACTION:
        by_kind = ", ".join(f"{key.removeprefix('dropped_')} {grew(key):.0f}"
                            for key in DROP_COUNTERS if grew(key))
        problems.append(f"it dropped {drops:.0f} of {received:.0f} frames unasked ({by_kind}; "
                        f"at most {MAX_DROP_FRACTION:.2%} may be)")
    if tx_errors:
        problems.append(f"{tx_errors:.0f} frames failed to send (tx_errors)")
    if forwarded and late / forwarded > LATE_FRACTION:
        problems.append(f"{late:.0f} of {forwarded:.0f} frames ({late / forwarded:.1%}) left "
                        f"more than {bound_us:.0f} us after their due time (its p99 must stay "
                        f"within that: at most {LATE_FRACTION:.0%})")
    if reordered and not jitter_us:
        problems.append(f"{reordered:.0f} frames left after a frame that arrived after them, "
                        f"on a link without jitter (reordered; TCP reads it as loss)")
    if problems:
        return Health(node, False, f"{node}: " + "; ".join(problems))
    by_jitter = f", {reordered:.0f} reordered by jitter" if reordered else ""
    return Health(node, True, f"{node}: {received:.0f} frames, {drops:.0f} dropped unasked, "
                              f"{late:.0f} more than {bound_us:.0f} us late{by_jitter}")


def judge_window(monitors: Mapping[str, ForwarderMonitor], start_s: float, end_s: float,
                 expect_traffic: bool) -> list[Health]:
    """Each forwarder over [start_s, end_s] (CLOCK_MONOTONIC), from the counters lines
    around it: from the last one at or before the start to the first at or after the end."""
    found = []
    for node, monitor in monitors.items():
        snapshots = list(monitor.snapshots)
        before = _at_or_before(snapshots, start_s * 1e9)
        after = _at_or_after(snapshots, end_s * 1e9)
        if after is None:
            found.append(Health(node, False, f"{node}: no counters reported after the window "
                                             f"ended (it died or was never asked)"))
        else:
            found.append(judge(node, before, after, expect_traffic))
    return found


def judge_final(stats: Mapping[str, Mapping[str, object]]) -> list[Health]:
    """Each forwarder over its whole life, from the counters it printed at exit (or the error
    that replaced them)."""
    found = []
    for node, final in stats.items():
        if "error" in final:
            found.append(Health(node, False, f"{node}: {final['error']}"))
            continue
        numbers = {key: float(value) for key, value in final.items()  # type: ignore[arg-type]
                   if isinstance(value, (int, float))}
        health = judge(node, {}, numbers, expect_traffic=False)
        p99 = numbers.get("late_p99_us", -1)
        found.append(Health(node, health.passed, f"{health.detail}; late p99 {p99:.0f} us"))
    return found
