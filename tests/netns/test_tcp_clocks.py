"""The target's TCP clocks in the nodes' namespaces, as the kernel reports them (TCP_INFO of a
live connection between two emulated nodes), never as the code echoes them."""

import socket
import struct
from pathlib import Path

import pytest

from netsim_ddp import Scenario
from netsim_ddp.fabric import Fabric, tcp_clocks

pytestmark = [pytest.mark.netns, pytest.mark.usefixtures("needs_fabric")]

TCPI_RTO, TCPI_ATO = 8, 12  # byte offsets in struct tcp_info (after eight u8 fields), in us
ROOT_RTO_MIN = Path("/proc/sys/net/ipv4/tcp_rto_min_us")


def scenario(**tcp):
    return Scenario.from_dict({"name": "t", "topology": {"nodes": 2},
                               "link": {"rate": "100mbit", "tcp": tcp}})


def connected(fabric):
    """A live TCP connection from node 0 to node 1 that has carried data: (client, server)."""
    a, b = fabric.nodes
    listener = b.socket()
    listener.bind((b.address, 0))
    listener.listen(1)
    client = a.socket()
    client.connect(listener.getsockname())
    server, _ = listener.accept()
    listener.close()
    client.sendall(b"x" * 100_000)
    received = 0
    while received < 100_000:
        received += len(server.recv(65536))
    server.sendall(b"y")
    assert client.recv(1) == b"y"
    return client, server


def algorithm(sock) -> str:
    return sock.getsockopt(socket.IPPROTO_TCP, socket.TCP_CONGESTION, 16).rstrip(b"\0").decode()


def rto_s(sock) -> float:
    info = sock.getsockopt(socket.IPPROTO_TCP, socket.TCP_INFO, 104)
    return struct.unpack_from("I", info, TCPI_RTO)[0] / 1e6


def test_k40_dilates_the_minimum_rto_of_a_live_connection():
    root_before = ROOT_RTO_MIN.read_text()
    with Fabric(scenario(), dilation=40) as fabric:
        client, server = connected(fabric)
        with client, server:
            assert rto_s(client) >= 0.2 * 40
            assert rto_s(server) >= 0.2 * 40
            # Linux's default, not the host's own: BBR's window would follow the host's RTT
            assert algorithm(client) == algorithm(server) == "cubic"
        settings = fabric.tcp_settings[fabric.nodes[0].name]
        assert settings["tcp_rto_min_us"] == str(8_000_000)
        assert settings["tcp_min_rtt_wlen"] == str(300 * 40)
        assert settings["tcp_comp_sack_delay_ns"] == str(40_000_000)
    assert ROOT_RTO_MIN.read_text() == root_before  # the host's own namespace untouched


def test_undilated_default_keeps_the_kernels_rto():
    with Fabric(scenario()) as fabric:
        client, server = connected(fabric)
        with client, server:
            assert 0.2 <= rto_s(client) < 1.0


def test_rto_min_field_lowers_what_the_kernel_reports():
    with Fabric(scenario(rto_min="5ms")) as fabric:
        client, server = connected(fabric)
        with client, server:
            assert rto_s(client) < 0.2


def test_rto_min_on_a_locked_route_where_the_kernel_has_no_sysctl(monkeypatch):
    """Kernels before 6.11: the minimum RTO goes on the node's route, locked by hand."""
    write = tcp_clocks.write_sysctls

    def without_rto_sysctl(settings):
        return write({k: v for k, v in settings.items() if k != tcp_clocks.RTO_MIN_SYSCTL}) \
            + ([tcp_clocks.RTO_MIN_SYSCTL] if tcp_clocks.RTO_MIN_SYSCTL in settings else [])

    monkeypatch.setattr(tcp_clocks, "write_sysctls", without_rto_sysctl)
    with Fabric(scenario(), dilation=40) as fabric:
        settings = fabric.tcp_settings[fabric.nodes[0].name]
        assert settings["tcp_rto_min_us"] == "200000"  # the sysctl left as it was
        assert settings["route:RTAX_RTO_MIN"] == 8000
        client, server = connected(fabric)
        with client, server:
            assert rto_s(client) >= 8.0


@pytest.mark.parametrize("name", ["cubic", "reno"])
def test_congestion_control_field_is_what_sockets_get(name):
    with Fabric(scenario(congestion_control=name)) as fabric:
        client, server = connected(fabric)
        with client, server:
            assert algorithm(client) == algorithm(server) == name


def test_slow_start_after_idle_and_quickack_reach_the_kernel():
    with Fabric(scenario(slow_start_after_idle=False, quickack=True)) as fabric:
        for node in fabric.nodes:
            settings = fabric.tcp_settings[node.name]
            assert settings["tcp_slow_start_after_idle"] == "0"
            assert settings["route:RTAX_QUICKACK"] == 1
    with Fabric(scenario()) as fabric:
        assert fabric.tcp_settings[fabric.nodes[0].name]["tcp_slow_start_after_idle"] == "1"
        assert "route:RTAX_QUICKACK" not in fabric.tcp_settings[fabric.nodes[0].name]


def test_a_congestion_control_the_kernel_lacks_is_refused_naming_the_field():
    available = Path("/proc/sys/net/ipv4/tcp_available_congestion_control").read_text().split()
    if "dctcp" in available:
        pytest.skip("this kernel has dctcp")
    with pytest.raises(Exception, match="link.tcp.congestion_control.*dctcp"):
        with Fabric(scenario(congestion_control="dctcp")):
            pass
