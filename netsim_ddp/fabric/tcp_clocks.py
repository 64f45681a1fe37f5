"""The target's TCP settings and clocks, dilated by k, in each node's network namespace.

Written before any socket exists there (the kernel copies tcp_rto_min_us into a socket when it
is created), through /proc/sys/net/ipv4 from a thread inside the node's namespace: /proc/sys/net
follows the calling thread's namespace, so the root namespace is never touched.

On kernels without the per-namespace `tcp_rto_min_us` (before 6.11) the minimum RTO goes on the
node's route instead: RTAX_RTO_MIN counts only when locked (RTAX_LOCK bit 1 << RTAX_RTO_MIN),
which `ip route ... rto_min` sets itself and pyroute2 does not, so it is set here by hand.
`quickack` is a route metric on every kernel (RTAX_QUICKACK); so is a congestion control that
a namespace may not make its default (RTAX_CC_ALGO, `ip route ... congctl`).
"""

from __future__ import annotations

from pathlib import Path

from netsim_ddp.fabric.errors import FabricError
from netsim_ddp.scenario.tcp import (
    TCP_CLOCKS,
    TcpConfig,
    congestion_control,
    dilated_clock,
    rto_min_s,
)

SYSCTL_DIR = Path("/proc/sys/net/ipv4")
RTO_MIN_SYSCTL = "tcp_rto_min_us"
RTAX_RTO_MIN = 13  # include/uapi/linux/rtnetlink.h
RTAX_LOCK_RTO_MIN = 1 << RTAX_RTO_MIN
# What every result records from each node (read back from the kernel, not echoed).
RECORDED = (RTO_MIN_SYSCTL, "tcp_rto_max_ms", *(clock.sysctl for clock in TCP_CLOCKS),
            "tcp_slow_start_after_idle", "tcp_congestion_control")


def namespace_sysctls(tcp: TcpConfig, k: float) -> dict[str, str]:
    """The sysctls (under net.ipv4) a node's namespace gets for `tcp` at dilation k; nothing
    for k = 1 and an empty [link.tcp] (the kernel's defaults, as before)."""
    settings: dict[str, str] = {}
    if k != 1 or tcp.rto_min is not None:
        settings[RTO_MIN_SYSCTL] = str(rto_min_us(tcp, k))
    if k != 1:
        settings.update({clock.sysctl: str(dilated_clock(clock, k)) for clock in TCP_CLOCKS})
    if tcp.slow_start_after_idle is not None:
        settings["tcp_slow_start_after_idle"] = str(int(tcp.slow_start_after_idle))
    if (algorithm := congestion_control(tcp, k)) is not None:
        settings["tcp_congestion_control"] = algorithm
    return settings


def rto_min_us(tcp: TcpConfig, k: float) -> int:
    return max(1, round(rto_min_s(tcp) * k * 1e6))


def write_sysctls(settings: dict[str, str]) -> list[str]:
    """Write `settings` in the calling thread's namespace; returns those it must put on the
    node's routes instead (route_metrics): an RTO minimum on a kernel without the sysctl, and
    a congestion control that only the host's own namespace may make the default (a namespace
    may default only to net.ipv4.tcp_allowed_congestion_control's; a route may name any the
    kernel has). Raises FabricError naming the scenario field a value the kernel refuses
    came from."""
    on_route = []
    for name, value in settings.items():
        path = SYSCTL_DIR / name
        if not path.exists():
            if name in (RTO_MIN_SYSCTL, "tcp_comp_sack_slack_ns", "tcp_tso_rtt_log"):
                on_route.append(name)  # newer than this kernel: its effect is listed in docs
                continue
            raise FabricError(f"this kernel has no net.ipv4.{name}, which link.tcp needs")
        try:
            path.write_text(value)
        except OSError as exc:
            if name == "tcp_congestion_control":
                available = (SYSCTL_DIR / "tcp_available_congestion_control").read_text().split()
                if value in available:
                    on_route.append(name)
                    continue
                raise FabricError(
                    f"link.tcp.congestion_control: this kernel has no {value!r} ({exc.strerror});"
                    f" it has {', '.join(available)}") from None
            raise FabricError(f"net.ipv4.{name} = {value} refused by the kernel in a node's "
                              f"namespace: {exc.strerror}") from None
    return on_route


def route_metrics(tcp: TcpConfig, k: float, on_route: list[str]) -> dict[str, int | str]:
    """pyroute2 metrics (its short names) for each node's routes: the settings write_sysctls
    could not make, and quickack. Empty: leave the routes as the kernel made them."""
    metrics: dict[str, int | str] = {}
    if RTO_MIN_SYSCTL in on_route:
        metrics["rto_min"] = max(1, round(rto_min_us(tcp, k) / 1000))  # ms on a route
        metrics["lock"] = RTAX_LOCK_RTO_MIN
    if "tcp_congestion_control" in on_route and (algorithm := congestion_control(tcp, k)):
        metrics["cc_algo"] = algorithm
    if tcp.quickack is not None:
        metrics["quickack"] = int(tcp.quickack)
    return metrics


def set_route_metrics(ipr, index: int, metrics: dict[str, int | str]) -> None:
    """Replace each route out of interface `index` (main table) by itself with `metrics`."""
    if not metrics:
        return
    for route in ipr.get_routes(family=2, table=254, oif=index):
        ipr.route("replace", dst=route.get_attr("RTA_DST"), dst_len=route["dst_len"],
                  oif=index, table=254, scope=route["scope"], proto=route["proto"],
                  prefsrc=route.get_attr("RTA_PREFSRC"), metrics=metrics)


def read_settings(ipr, index: int) -> dict[str, str | int]:
    """What the calling thread's namespace holds: the recorded sysctls and the route metrics
    of interface `index`, read from the kernel."""
    found: dict[str, str | int] = {}
    for name in RECORDED:
        path = SYSCTL_DIR / name
        if path.exists():
            found[name] = path.read_text().strip()
    for route in ipr.get_routes(family=2, table=254, oif=index):
        metrics = route.get_attr("RTA_METRICS")
        for name, value in (metrics["attrs"] if metrics is not None else []):
            if name in ("RTAX_RTO_MIN", "RTAX_QUICKACK", "RTAX_LOCK", "RTAX_CC_ALGO"):
                found[f"route:{name}"] = value
    return found
