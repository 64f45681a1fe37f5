"""A three-namespace bench for the delay line, used by its tests and benchmark.

    A.eth0 <-veth-> D.in  [forwarder: delay, jitter, loss]  D.out <-veth-> B.eth0
                    D.in  <------ tc mirred, no delay ----- D.out

Only A -> B is delayed, so an A->B->A round trip takes the configured one-way delay plus the
base round trip. Every object is named nsd<run id>-dl* and removed on exit, even on error.
Like a Fabric, the bench holds its run's lock while it lives: `netsim-ddp clean`, run by
anyone meanwhile, then leaves it alone instead of killing its forwarder and namespaces as a
dead run's litter.
"""

from __future__ import annotations

import contextlib
import os
import signal
import socket
import subprocess
from collections.abc import Iterator
from dataclasses import dataclass, field

from pyroute2 import IPRoute

from netsim_ddp.fabric import naming
from netsim_ddp.fabric.delayline import (
    DelayLineSpec,
    command,
    parse_stats,
    prepare_delay_namespace,
    wait_ready,
)
from netsim_ddp.fabric.namespaces import netns

IN_IFNAME, OUT_IFNAME, NODE_IFNAME = "in", "out", "eth0"
ADDR_A, ADDR_B, PREFIXLEN = "10.77.0.1", "10.77.0.2", 24
STOP_TIMEOUT_S = 5.0
NUD_PERMANENT = 0x80


@dataclass
class Testbed:
    run_id: str
    mtu: int
    ns_a: str
    ns_b: str
    ns_d: str
    process: subprocess.Popen | None = None
    last_stats: dict[str, object] = field(default_factory=dict)

    @property
    def address_b(self) -> str:
        return ADDR_B

    @property
    def namespaces(self) -> list[str]:
        return [self.ns_a, self.ns_b, self.ns_d]

    def socket(self, ns: str, kind: int = socket.SOCK_DGRAM) -> socket.socket:
        """A socket living in namespace `ns`, usable from any thread."""
        with netns.entered(ns):
            return socket.socket(socket.AF_INET, kind)

    def start(self, spec: DelayLineSpec, **options: object) -> subprocess.Popen:
        """Start the forwarder in D and return once its sockets are bound."""
        if self.process is not None:
            raise RuntimeError("a forwarder is already running on this testbed")
        argv = command(spec, IN_IFNAME, OUT_IFNAME, **options)  # type: ignore[arg-type]
        with netns.entered(self.ns_d):
            self.process = subprocess.Popen(argv, stdout=subprocess.PIPE,
                                            stderr=subprocess.PIPE, text=True)
        try:
            wait_ready(self.process)
        except BaseException:
            self.kill()
            raise
        return self.process

    def stop(self) -> dict[str, object]:
        """SIGTERM the forwarder; its exit status must be 0; returns its counters."""
        process, self.process = self.process, None
        if process is None:
            raise RuntimeError("no forwarder is running")
        process.send_signal(signal.SIGTERM)
        out, err = process.communicate(timeout=STOP_TIMEOUT_S)
        if process.returncode != 0:
            raise RuntimeError(f"forwarder exited with {process.returncode}: {err.strip()}")
        self.last_stats = parse_stats(out)
        return self.last_stats

    def kill(self) -> None:
        process, self.process = self.process, None
        if process is not None and process.poll() is None:
            process.kill()
            process.communicate()


def _disable_ipv6() -> None:
    # No router solicitations or MLD reports wandering through the delay line.
    with contextlib.suppress(FileNotFoundError):
        with open("/proc/sys/net/ipv6/conf/default/disable_ipv6", "w") as knob:
            knob.write("1")


def _open_iproute(stack: contextlib.ExitStack, ns: str) -> IPRoute:
    with netns.entered(ns):
        _disable_ipv6()
        return stack.enter_context(IPRoute())


def _veth_to(ipr_d: IPRoute, name: str, node_ns: str, mtu: int) -> None:
    fd = os.open(netns.path_of(node_ns), os.O_RDONLY)
    try:
        ipr_d.link("add", ifname=name, kind="veth", mtu=mtu,
                   peer={"ifname": NODE_IFNAME, "net_ns_fd": fd, "mtu": mtu})
    finally:
        os.close(fd)


def _mac(ipr: IPRoute) -> str:
    return str(ipr.get_links(ipr.link_lookup(ifname=NODE_IFNAME)[0])[0].get_attr("IFLA_ADDRESS"))


def _setup_node(ipr: IPRoute, address: str, peer: str, peer_mac: str,
                tbf_rate_bit: int | None, mtu: int) -> None:
    index = ipr.link_lookup(ifname=NODE_IFNAME)[0]
    ipr.addr("add", index=index, address=address, prefixlen=PREFIXLEN)
    # A static neighbour: no ARP crosses the delay line, so its counters count test traffic only.
    ipr.neigh("add", dst=peer, lladdr=peer_mac, ifindex=index, state=NUD_PERMANENT)
    if tbf_rate_bit is not None:
        # burst: rate/HZ (250 here) plus a 64 KB GSO frame; limit: ~20 ms of data.
        burst = tbf_rate_bit // 8 // 250 + 65536 + mtu
        ipr.tc("add", "tbf", index=index, handle=0x10000, rate=tbf_rate_bit // 8,
               burst=burst, limit=max(tbf_rate_bit // 8 // 50, 4 * burst))
    ipr.link("set", index=index, state="up")
    ipr.link("set", index=ipr.link_lookup(ifname="lo")[0], state="up")


@contextlib.contextmanager
def testbed(mtu: int = 1500, tbf_rate_bit: int | None = None) -> Iterator[Testbed]:
    """Build A, D, B; tbf_rate_bit caps A.eth0's egress (bits/s) when given."""
    run_id = naming.new_run_id()
    bed = Testbed(run_id=run_id, mtu=mtu, ns_a=naming.netns_name(run_id, "dla"),
                  ns_b=naming.netns_name(run_id, "dlb"), ns_d=naming.netns_name(run_id, "dld"))
    with contextlib.ExitStack() as stack:
        lock = naming.RunLock(run_id)
        lock.acquire()
        stack.callback(lock.release)
        for ns in bed.namespaces:
            netns.create(ns)
            stack.callback(netns.remove, ns)
        stack.callback(netns.kill_processes_in, bed.namespaces)
        stack.callback(bed.kill)
        ipr = {ns: _open_iproute(stack, ns) for ns in bed.namespaces}
        _veth_to(ipr[bed.ns_d], IN_IFNAME, bed.ns_a, mtu)
        _veth_to(ipr[bed.ns_d], OUT_IFNAME, bed.ns_b, mtu)
        prepare_delay_namespace(ipr[bed.ns_d], IN_IFNAME, OUT_IFNAME)
        mac_a, mac_b = _mac(ipr[bed.ns_a]), _mac(ipr[bed.ns_b])
        _setup_node(ipr[bed.ns_a], ADDR_A, ADDR_B, mac_b, tbf_rate_bit, mtu)
        _setup_node(ipr[bed.ns_b], ADDR_B, ADDR_A, mac_a, None, mtu)
        yield bed
