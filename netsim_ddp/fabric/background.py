"""Background traffic: seeded on/off bulk TCP flows between nodes, sharing their links.

The jitter this project is about comes from contention. A flow is a sender process in its
source node and a sink in its destination; the sender follows an on/off schedule drawn from
the flow's seed, so every mode of a run meets the same schedule, measured from its own start.

Both ends sample their TCP counters (TCP_INFO) as they run and report the series when stopped,
so the bytes background traffic put on the wire in any window can be told apart from the
training's. Senders also report the windows they followed (when they saw each start and end
file), so a sender that never saw a mode's window (a stale signal folder, a starved process)
is an error, not a silent zero.

    python -m netsim_ddp.fabric.background sink ADDR REPORT
    python -m netsim_ddp.fabric.background send ADDR PORT FLOW_JSON REPORT [--signals DIR]
"""

from __future__ import annotations

import argparse
import bisect
import contextlib
import json
import random
import shutil
import signal
import socket
import struct
import subprocess
import sys
import tempfile
import time
from collections.abc import Callable, Iterator
from dataclasses import dataclass
from pathlib import Path

from netsim_ddp.common.clock import job_clock
from netsim_ddp.common.files import write_whole
from netsim_ddp.common.signal_files import new_window, window_ended
from netsim_ddp.fabric.errors import FabricError
from netsim_ddp.scenario.spec import BackgroundFlow
from netsim_ddp.scenario.units import ETHERNET_HEADER, TCP_IP_HEADERS

WIRE_HEADERS = ETHERNET_HEADER + TCP_IP_HEADERS  # what tc counts per segment besides payload
SAMPLE_EVERY_S = 0.02
SIGNAL_POLL_S = 0.001
_TCPI_SEGS_OUT = 136  # offsets in struct tcp_info (linux/tcp.h)
_TCPI_BYTES_SENT = 200
_CHUNK = 1 << 18


def on_periods(flow: BackgroundFlow) -> Iterator[tuple[float, float]]:
    """The flow's (start, end) on-periods, in seconds from its start, without end."""
    draw = random.Random(flow.seed)

    def length(mean: float) -> float:
        return draw.expovariate(1 / mean) if flow.distribution == "exponential" else mean

    now = flow.start
    while True:
        on = length(flow.on)
        yield now, now + on
        now += on + length(flow.off)


def scheduled_on_s(flow: BackgroundFlow, window_s: float) -> float:
    """Seconds the flow's schedule is on within its first `window_s` seconds."""
    total, periods = 0.0, on_periods(flow)
    while (period := next(periods))[0] < window_s:
        total += min(period[1], window_s) - period[0]
    return total


@dataclass(frozen=True)
class BackgroundBytes:
    """Wire bytes the flows' ends had sent over time: one series of (job clock s, bytes) per
    end (netsim_ddp.common.clock), sampled from TCP_INFO as they ran, so any window of the run can
    be accounted for."""

    series: tuple[tuple[tuple[float, int], ...], ...] = ()
    # Per sender: (its role, the windows it followed as (mode, seen start, seen end or None)).
    windows: tuple[tuple[str, tuple[tuple[str, float, float | None], ...]], ...] = ()

    @property
    def total(self) -> int:
        return sum(points[-1][1] for points in self.series if points)

    @property
    def senders(self) -> tuple[tuple[tuple[float, int], ...], ...]:
        """Each flow's sender series, in flow order (each sender precedes its sink)."""
        return self.series[0::2]

    def between(self, start_s: float, end_s: float) -> float:
        """Bytes sent within [start_s, end_s] (the job clock), interpolated.

        TCP counts a segment when it enters the link's queue and tc when it leaves, so this
        differs from the links' counters over the same window by at most a queue's worth."""
        return sum(_at(points, end_s) - _at(points, start_s) for points in self.series)

    def missed_window(self, mode: str, start_s: float, end_s: float) -> list[str]:
        """Why senders did not follow `mode`'s measured window [start_s, end_s] (job clock):
        each must have seen its start inside it. Seen before it: a start file older than the
        window (replayed); after it: the flow never ran while the mode was measured."""
        problems = []
        for role, followed in self.windows:
            seen = [start for name, start, _ in followed if name == mode]
            if not seen:
                problems.append(f"the {role} never saw the window start")
            elif not any(start_s <= start <= end_s for start in seen):
                problems.append(
                    f"the {role} saw the window start {min(seen) - start_s:+.3f} s from its "
                    f"start, outside the {end_s - start_s:.3f} s window")
        return problems


def _at(points: tuple[tuple[float, int], ...], when: float) -> float:
    if not points or when <= points[0][0]:
        return 0.0 if not points or when < points[0][0] else float(points[0][1])
    index = bisect.bisect_right(points, (when, float("inf")))
    if index >= len(points):
        return float(points[-1][1])
    (t0, b0), (t1, b1) = points[index - 1], points[index]
    return b0 + (b1 - b0) * (when - t0) / (t1 - t0) if t1 > t0 else float(b1)


class _WireMeter:
    """Samples a socket's wire bytes (payload + headers of every segment, ACKs included)."""

    def __init__(self, sock: socket.socket, every_s: float = SAMPLE_EVERY_S):
        self.sock = sock
        self.every_s = every_s
        self.points: list[tuple[float, int]] = []
        self.sample(force=True)

    def sample(self, force: bool = False) -> None:
        now = job_clock()
        if force or now - self.points[-1][0] >= self.every_s:
            info = self.sock.getsockopt(socket.IPPROTO_TCP, socket.TCP_INFO, 256)
            (segs_out,) = struct.unpack_from("I", info, _TCPI_SEGS_OUT)
            (bytes_sent,) = struct.unpack_from("Q", info, _TCPI_BYTES_SENT)
            self.points.append((now, bytes_sent + WIRE_HEADERS * segs_out))

    def report_and_reset(self, report: Path, windows: list[list] | None = None) -> None:
        """Write the series, then reset the connection: a graceful close would still send
        what sits in the send buffer (megabytes) after the last sample."""
        self.sample(force=True)
        self.sock.setsockopt(socket.SOL_SOCKET, socket.SO_LINGER, struct.pack("ii", 1, 0))
        self.sock.close()
        _write_report(report, self.points, windows)


def _write_report(report: Path, points: list[tuple[float, int]],
                  windows: list[list] | None = None) -> None:
    """{"points": [[job clock s, bytes]...], "windows": [[mode, start, end]...] (senders
    following signals) or null}."""
    write_whole(report, json.dumps({"points": points, "windows": windows}))


class BackgroundError(FabricError):
    """A flow's sender or sink died or reported nothing: its bytes cannot be accounted for."""


@dataclass(frozen=True)
class EndReport:
    """What one end of a flow reported when stopped: its byte series and, for a sender that
    followed signals, the windows it followed. Plain data, so a host can send it to node 0."""

    flow: int  # index in the scenario's [[background]]
    kind: str  # "sender" or "sink"
    role: str  # e.g. "sender in n0", for messages
    points: tuple[tuple[float, int], ...]
    windows: tuple[tuple[str, float, float | None], ...] | None

    def as_dict(self) -> dict[str, object]:
        return {"flow": self.flow, "kind": self.kind, "role": self.role,
                "points": self.points, "windows": self.windows}

    @classmethod
    def from_dict(cls, data: dict) -> EndReport:
        windows = data["windows"]
        return cls(int(data["flow"]), str(data["kind"]), str(data["role"]),
                   tuple((float(t), int(b)) for t, b in data["points"]),
                   None if windows is None else
                   tuple((str(mode), float(start), end) for mode, start, end in windows))


def assemble(ends: list[EndReport]) -> BackgroundBytes:
    """The ends of every flow, wherever they ran, as one account: flow by flow, each sender
    before its sink (BackgroundBytes.senders relies on that order)."""
    ordered = sorted(ends, key=lambda end: (end.flow, end.kind != "sender"))
    return BackgroundBytes(tuple(end.points for end in ordered),
                           tuple((end.role, end.windows) for end in ordered
                                 if end.windows is not None))


@dataclass
class FlowEnd:
    """One end of a background flow: its sender or receiver process and where it reports."""
    flow: int
    kind: str
    role: str
    process: subprocess.Popen
    report: Path
    stopped: bool = False
    died: bool = False  # it had exited before it was stopped


class BackgroundTraffic:
    """Start every flow of a scenario inside a built fabric; stop them and count their bytes.

    `netsim-ddp host` starts each end on its own host instead (start_sink on the destination's,
    start_sender on the source's, with the sink's port passed between them) and assembles the
    ends' reports on node 0."""

    def __init__(self, fabric, flows: list[BackgroundFlow], signals: Path | None = None):
        """With `signals`, each flow follows its schedule only inside the measured windows
        that ranks signal there (see netsim_ddp.workload.contract.window); else from the start."""
        self.fabric = fabric
        self.flows = flows
        self.signals = signals
        if signals is not None and any(signals.iterdir()):
            raise ValueError(f"background traffic needs a fresh signal folder, and {signals} "
                             "holds an earlier run's signals, which the senders would replay")
        self._reports_folder: Path | None = None  # made by the first end, removed by stop_ends
        self._running: list[FlowEnd] = []

    @property
    def _reports(self) -> Path:
        """The ends' report files' folder, made when the first end starts: one made here
        and never used would outlive the object. Beside the signals (inside the run's folder)
        where there are any, so a run killed before stop_ends leaves it with the run's logs,
        not loose in /tmp."""
        if self._reports_folder is None:
            self._reports_folder = Path(tempfile.mkdtemp(
                prefix="netsim-ddp-background-",
                dir=None if self.signals is None else self.signals.parent))
        return self._reports_folder

    def __enter__(self) -> BackgroundTraffic:
        try:
            for index, flow in enumerate(self.flows):
                source = self.fabric.node(flow.source)
                destination = self.fabric.node(flow.destination)
                port = self.start_sink(index, destination)
                self.start_sender(index, source, destination.address, port)
        except BaseException:
            self.stop()
            raise
        return self

    def __exit__(self, exc_type, *_exc) -> None:
        if exc_type is None:
            self.stop()
        else:  # already failing: stop everything, without masking that error
            with contextlib.suppress(RuntimeError):
                self.stop()

    def start_sink(self, index: int, node) -> int:
        """Flow `index`'s sink in `node` (anything with name, address and popen); its port."""
        report = self._reports / f"{index}-sink.json"
        with open(report.with_suffix(".err"), "wb") as stderr:  # kept: says why it died
            sink = node.popen([*_COMMAND, "sink", node.address, str(report)],
                              stdout=subprocess.PIPE, stderr=stderr, text=True)
        self._running.append(FlowEnd(index, "sink", f"sink in {node.name}", sink, report))
        return int(_read_line(sink, "sink"))

    def start_sender(self, index: int, node, address: str, port: int) -> None:
        """Flow `index`'s sender in `node`, to its sink at address:port; returns connected."""
        signals = ["--signals", str(self.signals)] if self.signals else []
        report = self._reports / f"{index}-sender.json"
        with open(report.with_suffix(".err"), "wb") as stderr:
            sender = node.popen([*_COMMAND, "send", address, str(port),
                                 self.flows[index].model_dump_json(), str(report), *signals],
                                stdout=subprocess.PIPE, stderr=stderr, text=True)
        self._running.append(FlowEnd(index, "sender", f"sender in {node.name}", sender, report))
        _read_line(sender, "sender")  # connected

    def _why(self, end: FlowEnd) -> str:
        try:
            stderr = end.report.with_suffix(".err").read_text(errors="replace").strip()[-2000:]
        except OSError:
            stderr = ""
        code = end.process.returncode
        status = f"killed by signal {-code}" if code is not None and code < 0 else \
            f"exit code {code}"
        return f"{end.role} ({status}; stderr: {stderr or '(empty)'})"

    def check(self) -> None:
        """Raise BackgroundError if an end exited while the run needs it (it would only be
        noticed at stop, after the modes it should have contended with)."""
        dead = [self._why(end) for end in self._running if end.process.poll() is not None]
        if dead:
            raise BackgroundError("background traffic: " + "; ".join(dead) + " died while the "
                                  "ranks trained, so they did not meet the scenario's contention")

    def stop(self) -> BackgroundBytes:
        """Stop every flow; what all their ends put on the wire, over time. Raises
        BackgroundError if an end died, exited non-zero or reported no counters."""
        return assemble(self.stop_ends())

    def stop_senders(self) -> None:
        """Stop the senders started here (their reports wait for stop_ends). With ends on
        several hosts, every host stops its senders before any stops its sinks: a sink stopped
        first resets its connection, and its sender would end on its own, as if it had died."""
        _stop([end for end in self._running if end.kind == "sender"])

    def stop_ends(self) -> list[EndReport]:
        """Stop the ends started here; each one's report (see stop)."""
        running, self._running = self._running, []
        try:
            _stop(sorted(running, key=lambda end: end.kind != "sender"))  # senders first
            reports, missing = [], []
            for end in running:
                try:
                    data = json.loads(end.report.read_text())
                    report = EndReport.from_dict({**data, "flow": end.flow, "kind": end.kind,
                                                  "role": end.role})
                except (OSError, ValueError, KeyError, TypeError):
                    missing.append(self._why(end))
                    continue
                if not report.points:  # a sink that never had a connection
                    missing.append(f"{end.role} (no samples: it never carried the flow)")
                elif end.process.returncode not in (0, -signal.SIGTERM):
                    missing.append(self._why(end))
                reports.append(report)
            problems = [self._why(end) + " had died before the end"
                        for end in running if end.died] + missing
        finally:  # whatever broke above (an interrupt included), the folder goes
            if self._reports_folder is not None:
                shutil.rmtree(self._reports_folder, ignore_errors=True)
                self._reports_folder = None
        if problems:
            raise BackgroundError(f"background traffic: {'; '.join(problems)}: its bytes cannot "
                                  "be told from the training's")
        return reports


_COMMAND = [sys.executable, "-P", "-m", __name__]  # -P: never import from the cwd


def _read_line(process: subprocess.Popen, role: str) -> str:
    assert process.stdout is not None  # started with stdout=PIPE
    line = process.stdout.readline().strip()
    if not line:
        process.kill()
        raise BackgroundError(f"background {role} exited before it was ready "
                              f"(exit code {process.wait()})")
    return line


def _stop(ends: list[FlowEnd]) -> None:
    for end in ends:
        if not end.stopped:
            end.died, end.stopped = end.process.poll() is not None, True
            _terminate(end.process)


def _terminate(process: subprocess.Popen) -> None:
    if process.poll() is None:
        process.send_signal(signal.SIGTERM)
    try:
        process.communicate(timeout=10)
    except subprocess.TimeoutExpired:
        process.kill()
        process.communicate()


# -- the two ends, run inside the nodes ------------------------------------------------------

class _Stop(Exception):
    pass


def _raise_stop(*_args) -> None:
    raise _Stop


def _sink(address: str, report: Path) -> None:
    listener = socket.create_server((address, 0))
    meter = None
    try:
        print(listener.getsockname()[1], flush=True)
        conn, _ = listener.accept()
        meter = _WireMeter(conn)
        buffer = bytearray(_CHUNK)
        with contextlib.suppress(ConnectionError):  # the sender reset it: stopped first
            while conn.recv_into(buffer):
                meter.sample()
        meter.sample(force=True)
        print("ended", flush=True)
        # Wait to be stopped: on another host the sender may be stopped first, and an end
        # that exits on its own is taken for one that died mid-run.
        while True:
            signal.pause()
    except _Stop:
        pass
    if meter is None:
        _write_report(report, [])
    else:
        meter.report_and_reset(report)


def _send(address: str, port: int, flow: BackgroundFlow, report: Path,
          signals: Path | None) -> None:
    sock = socket.create_connection((address, port), timeout=30)
    sock.settimeout(None)
    meter = _WireMeter(sock)
    windows: list[list] = []  # [mode, when its start was seen, when its end was seen]
    try:
        print("ready", flush=True)  # inside: a stop right after it must still report
        if signals is None:
            _follow_schedule(sock, meter, flow, stopped=lambda: False)
        else:
            # One schedule per measured window: from each start-MODE file to its end-MODE.
            seen: set[str] = set()
            while True:
                mode = _wait_for_window(signals, seen)
                windows.append([mode, job_clock(), None])
                _follow_schedule(sock, meter, flow,
                                 stopped=lambda: window_ended(signals, mode))  # noqa: B023
                windows[-1][2] = job_clock()
    except (_Stop, ConnectionError):
        pass
    meter.report_and_reset(report, windows if signals is not None else None)


def _wait_for_window(signals: Path, seen: set[str]) -> str:
    """Block until a window not seen before starts; return its mode."""
    while (mode := new_window(signals, seen)) is None:
        time.sleep(SIGNAL_POLL_S)
    return mode


def _follow_schedule(sock: socket.socket, meter: _WireMeter, flow: BackgroundFlow,
                     stopped: Callable[[], bool]) -> None:
    """Send during the flow's on-periods, from now until `stopped()`."""
    start = time.monotonic()
    rate = flow.rate
    # Paced flows send small blocks so the pacing is smooth; bulk ones large blocks.
    payload = memoryview(bytearray(65536 if rate or flow.burst else _CHUNK))
    for begin, end in on_periods(flow):
        while time.monotonic() < start + begin:  # the off-period
            if stopped():
                return
            time.sleep(min(SIGNAL_POLL_S, max(start + begin - time.monotonic(), 0)))
        meter.sample(force=True)  # the off-period ends here, not at the next sample
        sent, on_start = 0, time.monotonic()
        while (now := time.monotonic()) < start + end:
            if stopped():
                meter.sample(force=True)
                return
            if flow.burst is not None and sent >= flow.burst:  # a neighbour's step is done
                time.sleep(min(SIGNAL_POLL_S, start + end - now))
                continue
            if rate and sent * 8 > rate * (now - on_start):
                time.sleep(min(0.001, start + end - now))  # pacing to the flow's rate
                continue
            block = payload if flow.burst is None else payload[:flow.burst - sent]
            sock.sendall(block)
            sent += len(block)
            meter.sample()
        meter.sample(force=True)


def _main(argv: list[str] | None = None) -> None:
    parser = argparse.ArgumentParser(prog="python -m netsim_ddp.fabric.background")
    sub = parser.add_subparsers(dest="role", required=True)
    sink = sub.add_parser("sink")
    sink.add_argument("address")
    sink.add_argument("report", type=Path, help="where to write the counters when stopped")
    send = sub.add_parser("send")
    send.add_argument("address")
    send.add_argument("port", type=int)
    send.add_argument("flow", help="the BackgroundFlow as JSON")
    send.add_argument("report", type=Path, help="where to write the counters when stopped")
    send.add_argument("--signals", type=Path, default=None,
                      help="follow the schedule only inside measured windows signalled here")
    args = parser.parse_args(argv)
    signal.signal(signal.SIGTERM, _raise_stop)
    if args.role == "sink":
        _sink(args.address, args.report)
    else:
        _send(args.address, args.port, BackgroundFlow.model_validate_json(args.flow),
              args.report, args.signals)


if __name__ == "__main__":
    _main()
