"""`[link.tcp]`: the target's TCP settings, and the kernel's TCP clocks a scale model dilates.

Every field is in the target's units. The fabric writes them, dilated by k, into each node's
network namespace (fabric.tcp_clocks) before any rank starts. Unset fields keep the kernel's
defaults, which a scale model still dilates (a 200 ms minimum RTO runs at 200 ms x k).

What is a time in the kernel's TCP and can be set per namespace is listed in TCP_CLOCKS;
what cannot be dilated is in docs/scale-model.md ("TCP on the target's clock").
"""

from __future__ import annotations

import math
from dataclasses import dataclass
from typing import Literal

from pydantic import BaseModel, ConfigDict, Field

from netsim_ddp.scenario import units

# The kernel's compiled-in defaults (include/net/tcp.h, net/ipv4/tcp_ipv4.c).
KERNEL_RTO_MIN_S = 0.2  # TCP_RTO_MIN
# tcp_rto_max_ms: every RTO, backoff included, is capped by it; the kernel accepts at most
# 120 s (its default), so it cannot be dilated, and a minimum RTO x k must stay below it.
KERNEL_RTO_MAX_S = 120.0
MIN_RTO_MIN_S = 1e-6  # tcp_rto_min_us >= 1

CongestionControl = Literal["cubic", "reno", "bbr", "dctcp"]
# What a scale model runs when [link.tcp] names none: Linux's default, not the host's. A host
# that defaults to BBR would lend it to the nodes, and BBR sizes its window from the minimum RTT,
# which on the host is its own undilated path (microseconds, not the target's x k): at k = 40
# on a 1 Gbit/s target it left the 25 Mbit/s links idle 14% of the time (86% of the link where
# cubic, which fills the queue, reached 98%; docs/scale-model.md).
DILATED_DEFAULT_CC: CongestionControl = "cubic"


class TcpConfig(BaseModel):
    """The target's TCP settings (Linux's names), in the target's units: a scale model runs
    them k times slower. Unset: the kernel's default (dilated all the same)."""

    model_config = ConfigDict(extra="forbid", frozen=True, strict=True, allow_inf_nan=False)

    rto_min: units.Duration | None = Field(
        None, gt=0, le=KERNEL_RTO_MAX_S, description="Minimum retransmission timeout "
        "(net.ipv4.tcp_rto_min_us; `ip route ... rto_min`): Linux's default is 200ms; GPU "
        "cluster images often lower it (e.g. '5ms').")
    slow_start_after_idle: bool | None = Field(
        None, description="net.ipv4.tcp_slow_start_after_idle: restart slow start after an "
        "idle of one RTO (Linux's default: true).")
    quickack: bool | None = Field(
        None, description="ACK every segment at once instead of delaying ACKs (`ip route ... "
        "quickack 1` on each node's routes; Linux's default: false).")
    congestion_control: CongestionControl | None = Field(
        None, description="net.ipv4.tcp_congestion_control in each node (default: what the "
        "host's own namespace uses; under dilation: cubic, Linux's default, since BBR's window "
        "follows the host's undilated RTT); refused where the kernel lacks it.")


@dataclass(frozen=True)
class TcpClock:
    """One per-namespace sysctl that is a time: its kernel default, in its own unit."""

    sysctl: str  # under /proc/sys/net/ipv4
    default: int
    maximum: int  # what the kernel accepts (a dilated value is capped there; see `capped`)
    capped: str  # what capping it does to the scale model
    log2: bool = False  # the value is log2 of a time: dilating adds log2(k)


# Times the kernel reads per namespace, dilated by k in every node (rto_min: see TcpConfig).
TCP_CLOCKS = (
    TcpClock("tcp_min_rtt_wlen", 300, 86_400,
             "the min-RTT filter's window (s) stays a day, longer than any run"),
    TcpClock("tcp_comp_sack_delay_ns", 1_000_000, 2**31 - 1,
             "compressed SACKs wait at most ~2.1 s"),
    TcpClock("tcp_comp_sack_slack_ns", 100_000, 2**31 - 1, "as tcp_comp_sack_delay_ns"),
    # TSO autosizing adds gso_max_size >> (min_rtt >> tcp_tso_rtt_log): min_rtt grows by k,
    # so the shift must grow by log2(k) for the same burst.
    TcpClock("tcp_tso_rtt_log", 9, 255, "never reached", log2=True),
)


def dilated_clock(clock: TcpClock, k: float) -> int:
    if clock.log2:
        return min(clock.default + round(math.log2(k)), clock.maximum)
    return min(round(clock.default * k), clock.maximum)


def congestion_control(tcp: TcpConfig, k: float) -> str | None:
    """What the nodes run (None: the host's default, inherited)."""
    return tcp.congestion_control or (DILATED_DEFAULT_CC if k != 1 else None)


def rto_min_s(tcp: TcpConfig | None) -> float:
    """The target's minimum RTO."""
    return tcp.rto_min if tcp is not None and tcp.rto_min is not None else KERNEL_RTO_MIN_S


def max_dilation(tcp: TcpConfig | None) -> float:
    """The largest k whose dilated minimum RTO the kernel's RTO cap (tcp_rto_max) still holds."""
    return KERNEL_RTO_MAX_S / rto_min_s(tcp)


def rto_bound_problem(tcp: TcpConfig | None, k: float) -> str | None:
    """Why dilation k cannot dilate the target's minimum RTO (None: it can)."""
    rto = rto_min_s(tcp) * k
    if rto <= KERNEL_RTO_MAX_S:
        return None
    return (f"the dilated minimum RTO {units.format_duration(rto)} (rto_min "
            f"{units.format_duration(rto_min_s(tcp))} x {k:g}) exceeds the kernel's RTO cap "
            f"net.ipv4.tcp_rto_max_ms = {KERNEL_RTO_MAX_S:g} s, which cannot be raised: use "
            f"k <= {max_dilation(tcp):g} or a smaller link.tcp.rto_min")
