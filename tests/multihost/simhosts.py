"""Simulated hosts for multi-host tests: one network namespace per host, each with its own NIC
(a veth) into a bridge in another namespace. Nothing here is shaped: that is the agent's job.

Names: namespaces `nsd<run id>-h<i>` and `nsd<run id>-sw`, held by the run's lock so a
concurrent `netsim-ddp clean` leaves them alone; links `nsdnic` (each host's NIC), `nsdp<i>`
and `nsdbr` (the bridge's side). All are removed afterwards, also on failure.

Options that make the hosts look like production ones: `queues` (each NIC a multiqueue veth,
so an `mq` root applies), `last_octets` (addresses that need not sort in node order), and
`outsiders` (further hosts on the same switch that are not part of the job: their traffic must
stay unshaped).
"""

from __future__ import annotations

import contextlib
import os
import subprocess
import sys
from dataclasses import dataclass
from pathlib import Path

from pyroute2 import IPRoute

from netsim_ddp.fabric import naming
from netsim_ddp.fabric.namespaces import netns

NIC = "nsdnic"
SUBNET = "10.77.0"


@dataclass
class SimHost:
    index: int
    netns: str
    address: str
    nic: str = NIC
    in_job: bool = True  # False: an outsider on the same switch (another job, storage)

    @property
    def hostname(self) -> str:
        return f"nsdhost{self.index}"

    def entered(self):
        return netns.entered(self.netns)

    def popen(self, argv, **kwargs) -> subprocess.Popen:
        """Start argv on this host as a scheduler would: in its network namespace, under its
        own hostname (a UTS namespace of its own)."""
        wrapped = ["unshare", "--uts", "sh", "-c", 'hostname "$0" && exec "$@"',
                   self.hostname, *map(str, argv)]
        with self.entered():
            return subprocess.Popen(wrapped, **kwargs)

    def run(self, argv, **kwargs) -> subprocess.CompletedProcess:
        with self.entered():
            return subprocess.run(list(map(str, argv)), **kwargs)

    def tc_dump(self) -> str:
        """Every qdisc, class and filter on the NIC, as iproute2's tc prints them (detailed,
        no counters): an independent witness of what netsim-ddp changed and restored."""
        commands = [["tc", "-d", "qdisc", "show", "dev", self.nic],
                    ["tc", "-d", "class", "show", "dev", self.nic],
                    ["tc", "-d", "filter", "show", "dev", self.nic],
                    ["tc", "-d", "filter", "show", "dev", self.nic, "ingress"],
                    ["ip", "-d", "link", "show", "type", "ifb"]]
        return "\n".join(self.run(c, capture_output=True, text=True, check=True).stdout
                         for c in commands)


def _disable_ipv6() -> None:
    with contextlib.suppress(FileNotFoundError):
        Path("/proc/sys/net/ipv6/conf/default/disable_ipv6").write_text("1")


@contextlib.contextmanager
def simulated_hosts(count: int, *, queues: int = 1, last_octets: list[int] | None = None,
                    outsiders: int = 0, mtu: int = 1500):
    """`count` job hosts (then `outsiders` more), host i at SUBNET.<last_octets[i]> (i + 1
    by default), each NIC with `queues` transmit queues and `mtu` (jumbo for an overlay)."""
    run_id = naming.new_run_id()
    lock = naming.RunLock(run_id)
    lock.acquire()
    switch = naming.netns_name(run_id, "sw")
    octets = last_octets or list(range(1, count + outsiders + 1))
    assert len(octets) == count + outsiders
    hosts = [SimHost(i, naming.netns_name(run_id, f"h{i}"), f"{SUBNET}.{octets[i]}",
                     in_job=i < count) for i in range(count + outsiders)]
    made: list[str] = []
    try:
        for name in [switch, *(h.netns for h in hosts)]:
            netns.create(name)
            made.append(name)
            with netns.entered(name):
                _disable_ipv6()  # no router solicitations in the counters
        with netns.entered(switch), IPRoute() as ipr:
            ipr.link("add", ifname="nsdbr", kind="bridge")
            (bridge,) = ipr.link_lookup(ifname="nsdbr")
            ipr.link("set", index=bridge, state="up")
            for host in hosts:
                fd = os.open(netns.path_of(host.netns), os.O_RDONLY)
                try:
                    ipr.link("add", ifname=f"nsdp{host.index}", kind="veth", mtu=mtu,
                             peer={"ifname": NIC, "net_ns_fd": fd, "mtu": mtu,
                                   "num_tx_queues": queues, "num_rx_queues": queues})
                finally:
                    os.close(fd)
                (port,) = ipr.link_lookup(ifname=f"nsdp{host.index}")
                ipr.link("set", index=port, master=bridge, state="up")
        for host in hosts:
            with host.entered(), IPRoute() as ipr:
                (nic,) = ipr.link_lookup(ifname=NIC)
                ipr.addr("add", index=nic, address=host.address, prefixlen=24)
                ipr.link("set", index=nic, state="up")
                ipr.link("set", index=ipr.link_lookup(ifname="lo")[0], state="up")
        yield hosts
    finally:
        netns.kill_processes_in(made)
        for name in made:
            netns.remove(name)
        lock.release()


def netsim_ddp(*args) -> list[str]:
    return [sys.executable, "-m", "netsim_ddp.cli", *map(str, args)]


SINK = """
import socket, sys
server = socket.create_server((sys.argv[1], 0))
print(server.getsockname()[1], flush=True)
connection, _ = server.accept()
while connection.recv(1 << 16):
    pass
connection.close()
"""
SEND = """
import socket, sys, time
started = time.monotonic()
with socket.create_connection((sys.argv[1], int(sys.argv[2]))) as sock:
    sock.sendall(bytes(int(sys.argv[3])))
    sock.shutdown(socket.SHUT_WR)
    sock.recv(1)  # the sink closes once it has read everything
print(time.monotonic() - started)
"""


def transfer(source, destination, size: int) -> float:
    """Seconds for `size` bytes from one simulated host to another over TCP, delivered."""
    sink = destination.popen([sys.executable, "-c", SINK, destination.address],
                             stdout=subprocess.PIPE, text=True)
    try:
        port = sink.stdout.readline().strip()
        sent = source.run([sys.executable, "-c", SEND, destination.address, port, size],
                          capture_output=True, text=True, check=True, timeout=60)
        sink.wait(timeout=30)
        return float(sent.stdout)
    finally:
        sink.kill()
        sink.wait()
