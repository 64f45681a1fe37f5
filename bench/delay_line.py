"""Benchmark: the userspace delay line's precision, throughput and CPU cost.

Namespaces A -> D(forwarder) -> B (see netsim_ddp/fabric/delayline/testbed.py). For each
one-way delay: the round-trip error (median RTT minus the undelayed median RTT minus the
delay) and the one-way error (B's kernel receive stamp minus A's send clock minus the delay),
median and p99; targets: median error <= 50 us + 2%. Then a bulk TCP flow (no tbf, delay 1 ms,
16 MB socket buffers) at MTU 1500 and 9000 (target >= 2.5 Gbit/s at 9000), and with 1% loss
(the forwarder then cuts GSO frames into wire segments), with the forwarder's CPU from
/proc/PID/stat (utime + stime, % of one core) and its lateness (send time - due time).

    python bench/delay_line.py [--samples 300] [--seconds 4] [--rt-priority 0] [--json OUT]
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import time

from rich.console import Console
from rich.table import Table

from netsim_ddp.fabric.delayline import DelayLineSpec, queue_bytes_for
from netsim_ddp.fabric.delayline.probes import echo_samples, tcp_bulk
from netsim_ddp.fabric.delayline.testbed import Testbed, testbed

DELAYS_S = (100e-6, 1e-3, 5e-3)


def _quantile(values: list[float], q: float) -> float:
    ordered = sorted(values)
    return ordered[min(len(ordered) - 1, int(q * len(ordered)))]


def _cpu_s(pid: int) -> float:
    fields = open(f"/proc/{pid}/stat").read().rsplit(")", 1)[1].split()
    return (int(fields[11]) + int(fields[12])) / os.sysconf("SC_CLK_TCK")


def precision(bed: Testbed, samples: int, rt: int) -> list[dict[str, float]]:
    bed.start(DelayLineSpec(delay_s=0.0), rt_priority=rt)
    base_rtt = statistics.median(s.rtt_ns for s in echo_samples(bed, samples))
    bed.stop()
    rows = []
    for delay in DELAYS_S:
        bed.start(DelayLineSpec(delay_s=delay), rt_priority=rt)
        got = echo_samples(bed, samples)
        stats = bed.stop()
        rtt_err = [(s.rtt_ns - base_rtt - delay * 1e9) / 1e3 for s in got]
        ow_err = [(s.one_way_ns - delay * 1e9) / 1e3 for s in got]
        rows.append({
            "delay_us": delay * 1e6, "target_us": 50 + 0.02 * delay * 1e6,
            "rtt_err_p50_us": _quantile(rtt_err, 0.5), "rtt_err_p99_us": _quantile(rtt_err, 0.99),
            "one_way_err_p50_us": _quantile(ow_err, 0.5),
            "one_way_err_p99_us": _quantile(ow_err, 0.99),
            "late_p50_us": stats["late_p50_us"], "late_p99_us": stats["late_p99_us"],
            "base_rtt_us": base_rtt / 1e3,
        })
    return rows


def throughput(mtu: int, loss_pct: float, seconds: float, rt: int) -> dict[str, float]:
    with testbed(mtu=mtu) as bed:
        spec = DelayLineSpec(delay_s=1e-3, loss_pct=loss_pct, seed=1,
                             queue_bytes=queue_bytes_for(10e9, 1e-3, 0))
        process = bed.start(spec, rt_priority=rt)
        cpu0, t0 = _cpu_s(process.pid), time.monotonic()
        result = tcp_bulk(bed, seconds=seconds, warmup_s=0.5)
        cpu1, t1 = _cpu_s(process.pid), time.monotonic()
        stats = bed.stop()
    return {
        "mtu": mtu, "loss_pct": loss_pct, "goodput_gbps": result.goodput_bps / 1e9,
        "cpu_pct": 100 * (cpu1 - cpu0) / (t1 - t0),
        "late_p50_us": stats["late_p50_us"], "late_p99_us": stats["late_p99_us"],
        "dropped_socket": stats["dropped_socket"], "dropped_loss": stats["dropped_loss"],
        "forwarded": stats["forwarded"],
    }


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--samples", type=int, default=300)
    parser.add_argument("--seconds", type=float, default=4.0)
    parser.add_argument("--rt-priority", type=int, default=0,
                        help="run the forwarder SCHED_FIFO at this priority (0: SCHED_OTHER)")
    parser.add_argument("--json", help="also write the results here")
    args = parser.parse_args()
    console = Console()

    with testbed() as bed:
        rows = precision(bed, args.samples, args.rt_priority)
    table = Table(title=f"delay precision ({args.samples} round trips each, "
                        f"base RTT {rows[0]['base_rtt_us']:.0f} us)")
    for column in ("one-way delay", "target", "RTT err p50", "RTT err p99", "1-way err p50",
                   "1-way err p99", "late p50/p99"):
        table.add_column(column, justify="right")
    for row in rows:
        table.add_row(f"{row['delay_us']:.0f} us", f"<= {row['target_us']:.0f} us",
                      f"{row['rtt_err_p50_us']:+.0f} us", f"{row['rtt_err_p99_us']:+.0f} us",
                      f"{row['one_way_err_p50_us']:+.0f} us",
                      f"{row['one_way_err_p99_us']:+.0f} us",
                      f"{row['late_p50_us']:.0f}/{row['late_p99_us']:.0f} us")
    console.print(table)

    flows = [throughput(mtu, loss, args.seconds, args.rt_priority)
             for mtu, loss in ((1500, 0.0), (9000, 0.0), (1500, 1.0))]
    table = Table(title="bulk TCP through the delay line (1 ms, no tbf)")
    for column in ("MTU", "loss", "goodput", "forwarder CPU", "late p50/p99", "socket drops"):
        table.add_column(column, justify="right")
    for flow in flows:
        table.add_row(str(flow["mtu"]), f"{flow['loss_pct']:.0f}%",
                      f"{flow['goodput_gbps']:.2f} Gbit/s", f"{flow['cpu_pct']:.0f}%",
                      f"{flow['late_p50_us']:.0f}/{flow['late_p99_us']:.0f} us",
                      str(flow["dropped_socket"]))
    console.print(table)
    if args.json:
        with open(args.json, "w") as out:
            json.dump({"precision": rows, "throughput": flows}, out, indent=2)


if __name__ == "__main__":
    main()
