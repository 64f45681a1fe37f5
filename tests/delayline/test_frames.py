"""The forwarder's option parsing and frame handling under AddressSanitizer and UBSan.

frame_driver.c links forwarder.c and feeds it crafted frames (no sockets, no root): a frame
whose header lengths lie must be handled without reading or writing outside its buffers, and
options out of range must be refused before anything runs.
"""

from __future__ import annotations

import hashlib
import json
import os
import struct
import subprocess
from dataclasses import dataclass
from pathlib import Path

import pytest

from netsim_ddp.fabric.delayline import build

DRIVER_SOURCE = Path(__file__).with_name("frame_driver.c")
SANITIZE = ("-fsanitize=address,undefined", "-fno-sanitize-recover=all", "-g", "-O1")
VNET = struct.Struct("<BBHHHH")  # flags, gso_type, hdr_len, gso_size, csum_start, csum_offset
GSO_TCPV4, GSO_TCPV6 = 1, 4
ETH_IPV4, ETH_IPV6 = 0x0800, 0x86DD
BASE_OPTIONS = ("--in", "x", "--out", "y")


@pytest.fixture(scope="session")
def driver(tmp_path_factory) -> Path:
    """The driver, compiled once per version of its sources (cached like the forwarder)."""
    try:
        compiler = build._compiler()
    except build.DelayLineBuildError as exc:
        pytest.skip(str(exc))
    argv = [compiler, *build.CFLAGS, *SANITIZE, "-I", str(build.SOURCE.parent)]
    digest = hashlib.sha256(build.SOURCE.read_bytes() + DRIVER_SOURCE.read_bytes()
                            + " ".join(argv).encode()).hexdigest()[:16]
    cache = build._cache_dirs()[0]
    target = cache / f"frame-driver-{digest}"
    if target.exists() and build.unsafe_reason(target, is_dir=False) is None:
        return target
    if not cache.is_dir() or build.unsafe_reason(cache, is_dir=True):
        target = tmp_path_factory.mktemp("frame-driver") / "frame_driver"
    partial = target.with_name(target.name + f".{os.getpid()}")
    result = subprocess.run([*argv, "-o", str(partial), str(DRIVER_SOURCE), *build.LIBS],
                            capture_output=True, text=True, check=False)
    if result.returncode != 0 and "sanitize" in result.stderr:
        pytest.skip(f"this compiler cannot build with sanitizers: {result.stderr[-300:]}")
    assert result.returncode == 0, result.stderr
    partial.replace(target)  # whole or absent, for parallel sessions
    return target


@dataclass
class Outcome:
    returncode: int
    packets: list[tuple[int, bytes]]  # (due ns, vnet header + frame), in release order
    stats: dict[str, float]
    stderr: str


def run_driver(driver: Path, frames: list[bytes], *options: str,
               arrival_ns: int = 1_000_000_000, arrivals_ns: list[int] | None = None) -> Outcome:
    """Feed `frames` to the forwarder's handle_frame; all arrive at `arrival_ns`, or frame i at
    arrivals_ns[i] (the arrival times the forwarder would have mapped from kernel stamps)."""
    stdin = b"".join(struct.pack("<I", len(frame)) + frame for frame in frames)
    env = {**os.environ, "NSD_ARRIVAL_NS": str(arrival_ns),
           "NSD_ARRIVALS_NS": ",".join(map(str, arrivals_ns or [])),
           "ASAN_OPTIONS": "detect_leaks=0:abort_on_error=0:exitcode=99",
           "UBSAN_OPTIONS": "halt_on_error=1:exitcode=98:print_stacktrace=1"}
    result = subprocess.run([str(driver), *BASE_OPTIONS, *options], input=stdin, env=env,
                            capture_output=True, check=False, timeout=30)
    packets, stats = [], {}
    for line in result.stdout.decode().splitlines():
        if line.startswith("{"):
            stats = json.loads(line)
        elif line:
            due, _, data = line.split(" ")
            packets.append((int(due), bytes.fromhex(data)))
    return Outcome(result.returncode, packets, stats, result.stderr.decode(errors="replace"))


def checked(outcome: Outcome) -> Outcome:
    assert outcome.returncode == 0, outcome.stderr[-3000:]
    return outcome


# -- frames ----------------------------------------------------------------------------------

def _checksum(data: bytes) -> int:
    if len(data) % 2:
        data += b"\0"
    total = sum(struct.unpack(f"!{len(data) // 2}H", data))
    while total >> 16:
        total = (total & 0xFFFF) + (total >> 16)
    return total


def tcp_frame(payload: int = 4000, mss: int = 1448, ihl: int = 5, doff: int = 5,
              gso_type: int = GSO_TCPV4, ipv6: bool = False, length: int | None = None,
              flags: int = 0x18) -> bytes:
    """A GSO TCP super-packet as PACKET_VNET_HDR delivers it; header lengths as given (they
    may lie: ihl and doff in 32-bit words), `length` cuts the frame short."""
    data = bytes(i % 251 for i in range(payload))
    tcp = struct.pack("!HHIIBBHHH", 40000, 29500, 1000, 0, doff << 4, flags, 65535, 0, 0)
    tcp += bytes(max(doff * 4 - 20, 0))
    if ipv6:
        ip = struct.pack("!IHBB16s16s", 6 << 28, len(tcp) + payload, 6, 64,
                         bytes(15) + b"\1", bytes(15) + b"\2")
        eth_type = ETH_IPV6
    else:
        ip = struct.pack("!BBHHHBBH4s4s", 0x40 | ihl, 0, 20 + len(tcp) + payload, 7, 0x4000,
                         64, 6, 0, b"\x0a\0\0\1", b"\x0a\0\0\2")
        ip += bytes(max(ihl * 4 - 20, 0))
        eth_type = ETH_IPV4
    eth = bytes(6) + bytes([2, 0, 0, 0, 0, 1]) + struct.pack("!H", eth_type)
    hdr_len = len(eth) + len(ip) + len(tcp)
    vnet = VNET.pack(1, gso_type, hdr_len, mss, len(eth) + len(ip), 16)
    frame = vnet + eth + ip + tcp + data
    return frame if length is None else frame[:length]


def _segments(outcome: Outcome) -> list[bytes]:
    return [data[VNET.size:] for _, data in outcome.packets]


# -- a well-formed frame: the segmentation the kernel would do -------------------------------

def test_gso_frame_is_cut_into_wire_segments(driver) -> None:
    out = checked(run_driver(driver, [tcp_frame(payload=4000, mss=1448)], "--segment", "1"))
    segments = _segments(out)
    assert [len(s) - 54 for s in segments] == [1448, 1448, 1104]
    assert b"".join(s[54:] for s in segments) == bytes(i % 251 for i in range(4000))
    for i, segment in enumerate(segments):
        assert struct.unpack("!I", segment[38:42])[0] == 1000 + i * 1448  # TCP sequence
        assert struct.unpack("!H", segment[16:18])[0] == 40 + len(segment) - 54  # IP length
        assert _checksum(segment[14:34]) == 0xFFFF  # IPv4 header checksum holds
    assert out.stats["segmented_frames"] == 1 and out.stats["segments_made"] == 3


def test_ipv6_gso_frame_is_cut_too(driver) -> None:
    out = checked(run_driver(driver, [tcp_frame(payload=3000, mss=1000, ipv6=True,
                                                gso_type=GSO_TCPV6)], "--segment", "1"))
    segments = _segments(out)
    assert [struct.unpack("!H", s[18:20])[0] for s in segments] == [1020] * 3  # payload length
    assert b"".join(s[74:] for s in segments) == bytes(i % 251 for i in range(3000))


# -- frames whose headers lie: never cut, never overflow, forwarded as they came -------------

MALFORMED = {
    "ipv4-ihl-0": dict(ihl=0, payload=30, mss=1448),
    "ipv4-ihl-1": dict(ihl=1, payload=1, mss=1448),
    "ipv4-ihl-4": dict(ihl=4, payload=1, mss=1448),
    "tcp-doff-0": dict(doff=0, payload=30, mss=1448),
    "tcp-doff-4": dict(doff=4, payload=1, mss=1448),
    "ihl-0-doff-0": dict(ihl=0, doff=0, payload=1, mss=1448),
    "ipv6-doff-0": dict(doff=0, payload=30, mss=1448, ipv6=True, gso_type=GSO_TCPV6),
    "ihl-beyond-frame": dict(ihl=15, length=VNET.size + 14 + 44),
    "doff-beyond-frame": dict(doff=15, payload=0, length=VNET.size + 14 + 20 + 30),
    "gso-size-1": dict(payload=40, mss=1),
    "gso-size-1-ihl-1": dict(ihl=1, payload=30, mss=1),
    "gso-size-0": dict(payload=40, mss=0),
    "gso-type-v6-on-ipv4": dict(gso_type=GSO_TCPV6),
}


@pytest.mark.parametrize("fields", MALFORMED.values(), ids=MALFORMED.keys())
def test_malformed_gso_frame_is_forwarded_whole(driver, fields) -> None:
    frame = tcp_frame(**fields)
    out = checked(run_driver(driver, [frame], "--segment", "1"))
    assert [data for _, data in out.packets] == [frame]
    assert out.stats["segmented_frames"] == 0 and out.stats["not_segmented"] == 1


def test_frames_shorter_than_any_header_are_counted_not_read(driver) -> None:
    frames = [b"", tcp_frame(length=VNET.size), tcp_frame(length=VNET.size + 3),
              tcp_frame(length=VNET.size + 14 + 10)]
    out = checked(run_driver(driver, frames, "--segment", "1", "--loss", "0.5"))
    assert out.stats["dropped_truncated"] == 2  # nothing after the vnet header
    assert out.stats["received"] == 4


# -- options: every number checked, every range enforced --------------------------------------

BAD_OPTIONS = {
    "delay-wraps-int64": ("--delay-ns", "9223372036854775000"),
    "delay-over-an-hour": ("--delay-ns", str(3601 * 10**9)),
    "delay-with-unit": ("--delay-ns", "1ms"),
    "delay-empty": ("--delay-ns", ""),
    "delay-negative": ("--delay-ns", "-1"),
    "jitter-huge": ("--jitter-ns", "9000000000000000000"),
    "loss-nan": ("--loss", "nan"),
    "loss-trailing": ("--loss", "0.5x"),
    "loss-above-1": ("--loss", "1.5"),
    "queue-negative": ("--queue-bytes", "-1"),
    "queue-over-cap": ("--queue-bytes", str(1 << 40)),
    "queue-zero": ("--queue-bytes", "0"),
    "rcvbuf-over-int": ("--rcvbuf", "99999999999"),
    "rt-priority-100": ("--rt-priority", "100"),
    "segment-7": ("--segment", "7"),
    "seed-text": ("--seed", "abc"),
    "spin-negative": ("--spin-ns", "-5"),
    "test-offset-error-negative": ("--test-offset-error-ns", "-1"),
}


@pytest.mark.parametrize("option", BAD_OPTIONS.values(), ids=BAD_OPTIONS.keys())
def test_bad_option_is_refused_by_name(driver, option) -> None:
    out = run_driver(driver, [tcp_frame()], *option)
    assert out.returncode == 64, (out.returncode, out.stderr[-2000:])
    assert option[0] in out.stderr and not out.packets


def test_longest_delay_and_jitter_keep_frames_back(driver) -> None:
    """At the largest delay and jitter allowed, due times stay in the future (no wrap)."""
    hour = str(3600 * 10**9)
    arrival = 10**17  # three years of uptime
    out = checked(run_driver(driver, [tcp_frame(), tcp_frame()] * 20, "--delay-ns", hour,
                             "--jitter-ns", hour, "--dist", "pareto", arrival_ns=arrival))
    assert len(out.packets) == 40
    assert all(arrival <= due <= arrival + 5 * 3600 * 10**9 for due, _ in out.packets)


def test_queue_bound_counts_the_memory_each_packet_holds(driver) -> None:
    """Tiny segments cost more than their bytes: the bound covers what they hold in memory."""
    cap = 160_000
    frame = tcp_frame(payload=64_000, mss=48)  # 1334 segments of 112 bytes = 149 408 bytes
    out = checked(run_driver(driver, [frame], "--segment", "1", "--queue-bytes", str(cap)))
    overhead = out.stats["packet_overhead_bytes"]
    assert overhead > 0
    assert sum(len(data) + overhead for _, data in out.packets) <= cap
    assert out.stats["dropped_queue_full"] == 1334 - len(out.packets) > 0


# -- arrival order: kept whatever the clocks do; only jitter reorders -------------------------

MS = 1_000_000


def numbered_frames(count: int) -> list[bytes]:
    """Frames told apart by their length (frame i carries 100 + i bytes of payload), whole:
    not GSO, so never cut."""
    return [tcp_frame(payload=100 + i, gso_type=0) for i in range(count)]


def release_order(outcome: Outcome) -> list[int]:
    return [len(data) - len(tcp_frame(payload=100, gso_type=0)) for _, data in outcome.packets]


def rfc4737_reordered(order: list[int]) -> int:
    """Frames that left after a frame that arrived after them (each counted once)."""
    highest, late = -1, 0
    for seq in order:
        late += seq < highest
        highest = max(highest, seq)
    return late


def test_arrival_time_going_backwards_cannot_reorder_without_jitter(driver) -> None:
    """Issue 21, in the forwarder's own code: frame 2's arrival time came out 16 us before
    frame 1's (its batch's clock offset was sampled across an interruption, as in the trace
    that caught it: 20 us between the two clock reads), so its due time did too, and the heap
    released frames 2 and 3 first. It must leave after frame 1, at the earliest when 1 does."""
    base = 1_000 * MS
    arrivals = [base, base + 4_000, base + 8_000 - 20_000, base + 12_000 - 20_000,
                base + 16_000]  # frames 2 and 3: one batch whose offset is 20 us too large
    out = checked(run_driver(driver, numbered_frames(5), "--delay-ns", str(2 * MS),
                             arrivals_ns=arrivals))
    assert release_order(out) == [0, 1, 2, 3, 4]
    dues = [due for due, _ in out.packets]
    assert dues == sorted(dues)
    assert dues[2] == dues[3] == dues[1] == base + 4_000 + 2 * MS  # held to frame 1's time
    assert out.stats["reordered"] == 0
    assert out.stats["arrivals_clamped"] == 2


def test_a_realtime_step_back_leaves_only_the_distribution_to_reorder(driver) -> None:
    """With jitter, due times cross as the distribution makes them (netem does too), never
    because the clocks moved: 40 frames mapped 1 s into the past (CLOCK_REALTIME stepped back
    between the stamps and the offset sample) arrive, as far as the delay goes, with the 40
    before them. Taken at face value they would all leave 1 s early, before the first 40."""
    base, delay, jitter = 5_000 * MS, 2 * MS, 1 * MS
    arrivals = [base + i * 1_000 for i in range(40)] + [base - 1_000 * MS + i * 1_000
                                                        for i in range(40)]
    out = checked(run_driver(driver, numbered_frames(80), "--delay-ns", str(delay),
                             "--jitter-ns", str(jitter), "--dist", "uniform", "--seed", "3",
                             arrivals_ns=arrivals))
    last_true_arrival = base + 39_000
    assert all(base + delay - jitter <= due <= last_true_arrival + delay + jitter
               for due, _ in out.packets)
    assert out.stats["arrivals_clamped"] == 40
    order = release_order(out)
    assert sorted(order) == list(range(80))
    assert out.stats["reordered"] == rfc4737_reordered(order)


def test_reordered_counts_each_frame_overtaken_once(driver) -> None:
    """The counter against its definition: frames 10 us apart, delay 1 ms +- 200 us: due times
    cross, and `reordered` is the number of frames that leave after a later-arrived one."""
    base = 1_000 * MS
    out = checked(run_driver(driver, numbered_frames(300), "--delay-ns", str(MS),
                             "--jitter-ns", str(200_000), "--dist", "normal", "--seed", "11",
                             arrivals_ns=[base + i * 10_000 for i in range(300)]))
    order = release_order(out)
    assert sorted(order) == list(range(300))
    assert 0 < out.stats["reordered"] == rfc4737_reordered(order) < 300
    assert out.stats["arrivals_clamped"] == 0
    assert out.stats["jitter_us"] == 200.0


def test_without_jitter_a_steady_stream_is_never_counted_reordered(driver) -> None:
    base = 1_000 * MS
    out = checked(run_driver(driver, numbered_frames(100), "--delay-ns", str(MS),
                             arrivals_ns=[base + i * 10_000 for i in range(100)]))
    assert release_order(out) == list(range(100))
    assert out.stats["reordered"] == out.stats["arrivals_clamped"] == 0
    assert out.stats["jitter_us"] == 0
