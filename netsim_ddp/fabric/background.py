"""Background traffic: seeded on/off bulk TCP flows between nodes, sharing their links.

The jitter this project is about comes from contention. A flow is a sender process in its
source node and a sink in its destination; the sender follows an on/off schedule drawn from
the flow's seed, so every mode of a run meets the same schedule, measured from its own start.

Both ends report their TCP counters (TCP_INFO) when stopped, so the bytes background traffic put
on the wire can be told apart from the training's.

    python -m netsim_ddp.fabric.background sink
    python -m netsim_ddp.fabric.background send ADDR PORT FLOW_JSON
"""

from __future__ import annotations

import argparse
import json
import random
import signal
import socket
import struct
import subprocess
import sys
import time
from collections.abc import Iterator
from dataclasses import dataclass

from ..scenario import ETHERNET_HEADER, BackgroundFlow

TCP_IP_HEADERS = 52  # IPv4 20 + TCP 20 + timestamps 12
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


@dataclass(frozen=True)
class FlowCounters:
    sent_payload: int
    sent_segments: int  # data and ACK segments the sender put on the wire
    sink_segments: int  # ACKs the sink sent back

    @property
    def wire_bytes(self) -> int:
        """Bytes as tc counts them on the links, headers included, both directions."""
        header = TCP_IP_HEADERS + ETHERNET_HEADER
        return self.sent_payload + header * (self.sent_segments + self.sink_segments)


def _tcp_info(sock: socket.socket) -> tuple[int, int]:
    """(segments out, payload bytes sent) of a TCP socket."""
    info = sock.getsockopt(socket.IPPROTO_TCP, socket.TCP_INFO, 256)
    (segs_out,) = struct.unpack_from("I", info, _TCPI_SEGS_OUT)
    (bytes_sent,) = struct.unpack_from("Q", info, _TCPI_BYTES_SENT)
    return segs_out, bytes_sent


class BackgroundTraffic:
    """Start every flow of a scenario inside a built fabric; stop them and count their bytes."""

    def __init__(self, fabric, flows: list[BackgroundFlow]):
        self.fabric = fabric
        self.flows = flows
        self._running: list[tuple[subprocess.Popen, subprocess.Popen]] = []

    def __enter__(self) -> BackgroundTraffic:
        try:
            for flow in self.flows:
                self._start(flow)
        except BaseException:
            self.stop()
            raise
        return self

    def __exit__(self, *exc_info) -> None:
        self.stop()

    def _start(self, flow: BackgroundFlow) -> None:
        source, destination = self.fabric.node(flow.source), self.fabric.node(flow.destination)
        command = [sys.executable, "-m", __name__]
        sink = destination.popen([*command, "sink", destination.address],
                                 stdout=subprocess.PIPE, text=True)
        port = _read_line(sink, "sink")
        sender = source.popen([*command, "send", destination.address, port,
                               flow.model_dump_json()],
                              stdout=subprocess.PIPE, text=True)
        self._running.append((sender, sink))
        _read_line(sender, "sender")  # connected: the schedule's clock has started

    def stop(self) -> FlowCounters:
        """Stop every flow; the counters of all of them together."""
        payload = segments = acks = 0
        for sender, sink in self._running:
            sent = _stop(sender)
            received = _stop(sink)
            payload += sent.get("bytes_sent", 0)
            segments += sent.get("segs_out", 0)
            acks += received.get("segs_out", 0)
        self._running.clear()
        return FlowCounters(payload, segments, acks)


def _read_line(process: subprocess.Popen, role: str) -> str:
    line = process.stdout.readline().strip()
    if not line:
        process.kill()
        raise RuntimeError(f"background {role} exited before it was ready "
                           f"(exit code {process.wait()})")
    return line


def _stop(process: subprocess.Popen) -> dict[str, int]:
    if process.poll() is None:
        process.send_signal(signal.SIGTERM)
    try:
        out, _ = process.communicate(timeout=10)
    except subprocess.TimeoutExpired:
        process.kill()
        out, _ = process.communicate()
    lines = [line for line in (out or "").splitlines() if line.startswith("{")]
    return json.loads(lines[-1]) if lines else {}


# -- the two ends, run inside the nodes ------------------------------------------------------

class _Stop(Exception):
    pass


def _raise_stop(*_args) -> None:
    raise _Stop


def _report(sock: socket.socket | None) -> None:
    """Print the socket's counters, then reset it: a graceful close would still send what
    sits in the send buffer (megabytes), after the counters were read."""
    segs_out, bytes_sent = _tcp_info(sock) if sock else (0, 0)
    if sock:
        sock.setsockopt(socket.SOL_SOCKET, socket.SO_LINGER, struct.pack("ii", 1, 0))
        sock.close()
    print(json.dumps({"segs_out": segs_out, "bytes_sent": bytes_sent}), flush=True)


def _sink(address: str) -> None:
    listener = socket.create_server((address, 0))
    print(listener.getsockname()[1], flush=True)
    conn = None
    try:
        conn, _ = listener.accept()
        buffer = bytearray(_CHUNK)
        while conn.recv_into(buffer):
            pass
    except (_Stop, ConnectionError):  # stopped, or the sender reset the connection first
        pass
    _report(conn)


def _send(address: str, port: int, flow: BackgroundFlow) -> None:
    sock = socket.create_connection((address, port), timeout=30)
    sock.settimeout(None)
    print("ready", flush=True)
    start = time.monotonic()
    rate = flow.rate
    # Paced flows send small blocks so the pacing is smooth; bulk ones large blocks.
    payload = memoryview(bytearray(65536 if rate else _CHUNK))
    try:
        for begin, end in on_periods(flow):
            _sleep_until(start + begin)
            sent, on_start = 0, time.monotonic()
            while (now := time.monotonic()) < start + end:
                if rate and sent * 8 > rate * (now - on_start):
                    time.sleep(min(0.001, start + end - now))  # pacing to the flow's rate
                    continue
                sock.sendall(payload)
                sent += len(payload)
    except (_Stop, ConnectionError):
        pass
    _report(sock)


def _sleep_until(deadline: float) -> None:
    while (left := deadline - time.monotonic()) > 0:
        time.sleep(left)


def _main(argv: list[str] | None = None) -> None:
    parser = argparse.ArgumentParser(prog="python -m netsim_ddp.fabric.background")
    sub = parser.add_subparsers(dest="role", required=True)
    sink = sub.add_parser("sink")
    sink.add_argument("address")
    send = sub.add_parser("send")
    send.add_argument("address")
    send.add_argument("port", type=int)
    send.add_argument("flow", help="the BackgroundFlow as JSON")
    args = parser.parse_args(argv)
    signal.signal(signal.SIGTERM, _raise_stop)
    if args.role == "sink":
        _sink(args.address)
    else:
        _send(args.address, args.port, BackgroundFlow.model_validate_json(args.flow))


if __name__ == "__main__":
    _main()
