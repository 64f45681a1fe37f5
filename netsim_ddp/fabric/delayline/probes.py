"""Traffic probes for the delay line's tests and benchmark, between two namespaces: A sends,
B receives or echoes. They run on the delay line's own `Testbed` or between two nodes of a
built fabric (`ProbePath.between`).

Each probe makes its sockets in the namespaces and runs the far end in a thread; sockets are
closed whatever happens.
"""

from __future__ import annotations

import contextlib
import socket
import struct
import threading
import time
from collections.abc import Iterator
from dataclasses import dataclass
from typing import Protocol

from netsim_ddp.fabric.namespaces import netns


class Bed(Protocol):
    """Two namespaces and B's address: what a probe needs (a Testbed is one)."""

    ns_a: str
    ns_b: str

    @property
    def address_b(self) -> str: ...

    def socket(self, ns: str, kind: int = socket.SOCK_DGRAM) -> socket.socket: ...


@dataclass(frozen=True)
class ProbePath:
    """From one fabric node to another."""

    ns_a: str
    ns_b: str
    address_b: str

    @classmethod
    def between(cls, source, destination) -> ProbePath:
        return cls(source.netns, destination.netns, destination.address)

    def socket(self, ns: str, kind: int = socket.SOCK_DGRAM) -> socket.socket:
        with netns.entered(ns):
            return socket.socket(socket.AF_INET, kind)


SO_TIMESTAMPNS = getattr(socket, "SO_TIMESTAMPNS", 35)
SO_SNDBUFFORCE, SO_RCVBUFFORCE = 32, 33  # Linux; not exported by the socket module
_STAMP = struct.Struct("=qq")  # struct timespec on 64-bit Linux
_ECHO_HEAD = struct.Struct("!Iq")  # sequence, B's kernel receive stamp (ns, CLOCK_REALTIME)
_SEQ = struct.Struct("!I")
UDP_IP_HEADERS = 28


def _receive(sock: socket.socket, start_ns: int, timeout_s: float) -> bytes:
    while True:
        try:
            return sock.recv(2048)
        except BlockingIOError:
            if time.perf_counter_ns() - start_ns > timeout_s * 1e9:
                raise TimeoutError("no echo reply") from None


@dataclass(frozen=True)
class EchoSample:
    rtt_ns: int  # A's perf_counter around sendto .. recvfrom
    one_way_ns: int  # B's kernel receive stamp - A's clock just before sendto


def _kernel_stamp_ns(ancdata: list[tuple[int, int, bytes]]) -> int | None:
    for level, kind, data in ancdata:
        if level == socket.SOL_SOCKET and kind == SO_TIMESTAMPNS:
            sec, nsec = _STAMP.unpack(data[:_STAMP.size])
            return sec * 1_000_000_000 + nsec
    return None


STOP_SEQ = 0xFFFFFFFF


@contextlib.contextmanager
def _echo_server(bed: Bed) -> Iterator[int]:
    """UDP echo in B that appends B's kernel receive stamp; yields its port.

    It blocks in recvmsg (no timeout: a poll+recv per datagram would add wakeups to every
    round trip) and ends when a datagram with sequence STOP_SEQ arrives.
    """
    server = bed.socket(bed.ns_b)
    server.setsockopt(socket.SOL_SOCKET, SO_TIMESTAMPNS, 1)
    server.bind((bed.address_b, 0))

    def serve() -> None:
        while True:
            data, ancdata, _, peer = server.recvmsg(2048, 256)
            if _SEQ.unpack(data[:_SEQ.size])[0] == STOP_SEQ:
                return
            stamp = _kernel_stamp_ns(ancdata) or time.time_ns()
            server.sendto(data[:4] + struct.pack("!q", stamp), peer)

    thread = threading.Thread(target=serve, name="nsd-echo", daemon=True)
    thread.start()
    port = server.getsockname()[1]
    try:
        yield port
    finally:
        with contextlib.closing(bed.socket(bed.ns_a)) as stopper:
            while thread.is_alive():  # the stop datagram crosses the delay line too
                stopper.sendto(_SEQ.pack(STOP_SEQ), (bed.address_b, port))
                thread.join(timeout=0.5)
        server.close()


def echo_samples(bed: Bed, count: int, warmup: int = 20, timeout_s: float = 2.0,
                 busy_poll: bool = False) -> list[EchoSample]:
    """`count` sequential round trips A -> B -> A of 64-byte datagrams (after `warmup`).

    busy_poll: A spins on a non-blocking socket for the reply instead of sleeping in recv, so
    the wakeup of an idle (halted) vCPU does not land in the measured round trip.
    """
    samples = []
    with _echo_server(bed) as port, contextlib.closing(bed.socket(bed.ns_a)) as client:
        client.settimeout(0.0 if busy_poll else timeout_s)
        for seq in range(warmup + count):
            payload = _SEQ.pack(seq) + bytes(60)
            sent_real = time.time_ns()
            start = time.perf_counter_ns()
            client.sendto(payload, (bed.address_b, port))
            while True:  # a late reply to an earlier probe is skipped, not mistaken
                reply = _receive(client, start, timeout_s) if busy_poll else client.recv(2048)
                got_seq, stamp = _ECHO_HEAD.unpack(reply[:_ECHO_HEAD.size])
                if got_seq == seq:
                    break
            end = time.perf_counter_ns()
            if seq >= warmup:
                samples.append(EchoSample(rtt_ns=end - start, one_way_ns=stamp - sent_real))
    return samples


def udp_blast(bed: Bed, count: int, payload_bytes: int, markers: int = 64,
              burst: int = 32, pause_s: float = 0.0002, timeout_s: float = 10.0) -> list[int]:
    """Send `count` sequence-numbered datagrams A -> B, then `markers` end markers (numbered
    from `count` up: with loss, some get through all the same). B reads until the first marker
    arrives and returns the data sequence numbers in arrival order. Bursts with short pauses
    keep the sender from overrunning B's receive buffer; they synchronise nothing.
    """
    receiver = bed.socket(bed.ns_b)
    receiver.setsockopt(socket.SOL_SOCKET, SO_RCVBUFFORCE, 32 << 20)
    receiver.bind((bed.address_b, 0))
    receiver.settimeout(timeout_s)  # a failure guard: a marker always arrives in time
    port = receiver.getsockname()[1]
    seqs: list[int] = []
    errors: list[BaseException] = []

    def collect() -> None:
        try:
            while (seq := _SEQ.unpack(receiver.recv(65536)[:_SEQ.size])[0]) < count:
                seqs.append(seq)
        except BaseException as exc:  # surfaced below
            errors.append(exc)

    thread = threading.Thread(target=collect, name="nsd-blast-rx", daemon=True)
    thread.start()
    try:
        with contextlib.closing(bed.socket(bed.ns_a)) as sender:
            filler = bytes(payload_bytes - _SEQ.size)
            for seq in range(count + markers):
                sender.sendto(_SEQ.pack(seq) + filler, (bed.address_b, port))
                if seq % burst == burst - 1:
                    time.sleep(pause_s)
        thread.join()
    finally:
        receiver.close()
    if errors:
        raise errors[0]
    return seqs


@dataclass(frozen=True)
class BulkResult:
    goodput_bps: float
    seconds: float
    bytes: int


def tcp_bulk(bed: Bed, seconds: float, warmup_s: float = 0.5,
             sockbuf: int = 16 << 20, chunk: int = 1 << 20) -> BulkResult:
    """One TCP flow A -> B for warmup_s + seconds; goodput over the part after warm-up."""
    listener = bed.socket(bed.ns_b, socket.SOCK_STREAM)
    listener.setsockopt(socket.SOL_SOCKET, SO_RCVBUFFORCE, sockbuf)
    listener.bind((bed.address_b, 0))
    listener.listen(1)
    port = listener.getsockname()[1]
    marks: list[tuple[int, int]] = []  # (perf_counter_ns, bytes so far) at each read
    errors: list[BaseException] = []

    def receive() -> None:
        try:
            conn, _ = listener.accept()
            with conn:
                buf = bytearray(4 << 20)
                total = 0
                while (n := conn.recv_into(buf)) > 0:
                    total += n
                    marks.append((time.perf_counter_ns(), total))
        except BaseException as exc:  # surfaced below
            errors.append(exc)

    thread = threading.Thread(target=receive, name="nsd-bulk-rx", daemon=True)
    thread.start()
    try:
        with contextlib.closing(bed.socket(bed.ns_a, socket.SOCK_STREAM)) as sender:
            sender.setsockopt(socket.SOL_SOCKET, SO_SNDBUFFORCE, sockbuf)
            sender.connect((bed.address_b, port))
            data = memoryview(bytes(chunk))
            end = time.perf_counter() + warmup_s + seconds
            while time.perf_counter() < end:
                sender.sendall(data)
        thread.join(timeout=30)
    finally:
        listener.close()
    if errors:
        raise errors[0]
    return _goodput(marks, warmup_s)


def _goodput(marks: list[tuple[int, int]], warmup_s: float) -> BulkResult:
    if len(marks) < 2:
        raise RuntimeError("the bulk flow moved no data")
    first_ns = marks[0][0] + int(warmup_s * 1e9)
    start = next((m for m in marks if m[0] >= first_ns), marks[0])
    end = marks[-1]
    seconds = (end[0] - start[0]) / 1e9
    moved = end[1] - start[1]
    return BulkResult(goodput_bps=moved * 8 / seconds if seconds > 0 else 0.0,
                      seconds=seconds, bytes=moved)
