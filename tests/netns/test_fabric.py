"""The emulated network for real: namespaces, shaped links, teardown, sweeping, rootless."""

import json
import os
import signal
import socket
import subprocess
import sys
import textwrap
import time

import pytest
from pyroute2 import IPRoute

from netsim_ddp import Scenario
from netsim_ddp.fabric import Fabric
from netsim_ddp.fabric.fidelity import check_fidelity, expected_goodput, measure_goodput
from netsim_ddp.fabric.namespaces import netns, privilege

pytestmark = [pytest.mark.netns, pytest.mark.usefixtures("needs_fabric")]


def scenario(nodes=2, rate="1gbit", **link):
    return Scenario.from_dict({"name": "t", "topology": {"nodes": nodes},
                               "link": {"rate": rate, **link}})


def ours():
    return [name for name in netns.list_names() if name.startswith("nsd")]


def host_state():
    """Everything of the host's own namespace the project must never change (read only)."""
    with IPRoute() as ipr:
        links = sorted((link.get_attr("IFLA_IFNAME"), link.get_attr("IFLA_MTU"), link["flags"])
                       for link in ipr.get_links())
        addrs = sorted((a.get_attr("IFA_ADDRESS"), a["prefixlen"]) for a in ipr.get_addr())
        routes = sorted((r.get_attr("RTA_DST") or "", r["dst_len"], r.get_attr("RTA_OIF") or 0)
                        for r in ipr.get_routes())
        qdiscs = sorted((q["index"], q.get_attr("TCA_KIND"), q["handle"])
                        for q in ipr.get_qdiscs())
    return links, addrs, routes, qdiscs


def exchange(sender, receiver, payload: bytes) -> bytes:
    """Send payload over TCP from one node to another, both sockets in their namespaces."""
    with receiver.socket() as listener:
        listener.bind((receiver.address, 0))
        listener.listen(1)
        with sender.socket() as client:
            client.connect(listener.getsockname())
            conn, _ = listener.accept()
            client.sendall(payload)
            client.shutdown(socket.SHUT_WR)
            chunks = []
            with conn:
                while chunk := conn.recv(65536):
                    chunks.append(chunk)
            # Wait for the receiver's FIN before closing, so the teardown is orderly (no RST)
            # and the last packet is the sender's ACK of it.
            assert client.recv(1) == b""
    return b"".join(chunks)


def settled_counters(fabric, timeout_s=2.0):
    """The links' counters once no packet is in flight: two reads 20 ms apart agree (the last
    ACK of a connection can still be between one node's counter and the other's)."""
    deadline = time.monotonic() + timeout_s
    previous = fabric.counters()
    while time.monotonic() < deadline:
        time.sleep(0.02)
        current = fabric.counters()
        if current == previous:
            return current
        previous = current
    return previous


def test_build_use_and_teardown_leave_host_unchanged():
    before, names_before = host_state(), ours()
    with Fabric(scenario(nodes=3)) as fabric:
        assert len(ours()) == len(names_before) + 4  # switch + 3 nodes
        a, b, c = fabric.nodes
        assert [n.name for n in fabric.nodes] == ["n0", "n1", "n2"]
        assert len({a.address, b.address, c.address}) == 3
        payload = os.urandom(200_000)
        # What the links carried while they came up (a multicast report sent before a node's
        # qdisc was in place is counted by the switch only) is not this exchange's.
        start = settled_counters(fabric)
        assert exchange(a, c, payload) == payload
        end = settled_counters(fabric)
        sent = end["n0"].sent_bytes - start["n0"].sent_bytes
        # Wire bytes: every 1448-byte segment pays 66 bytes of headers (Ethernet, IP, TCP with
        # timestamps), GSO or not; plus a handshake and a FIN.
        on_wire = len(payload) * 1514 / 1448
        assert on_wire - 1514 <= sent <= on_wire * 1.01 + 1000
        # n1 takes no part, but the kernel repeats a fresh interface's IGMPv3 report (54 bytes)
        # for up to a second after it came up, and the bridge floods it to n2 (CI saw one land
        # in this window twice): n2 receives what n0 sent, plus at most a few such reports.
        idle = end["n1"].sent_bytes - start["n1"].sent_bytes
        received = end["n2"].received_bytes - start["n2"].received_bytes
        assert idle <= 3 * 54
        assert sent + idle <= received <= sent + 3 * 54
        (qdisc,) = fabric.qdiscs("n0")
        assert qdisc["kind"] == "tbf" and qdisc["bytes"] >= len(payload)
        assert host_state() == before  # built without touching the host's namespace
    assert ours() == names_before
    assert host_state() == before


def test_nodes_run_processes_in_their_namespace():
    with Fabric(scenario()) as fabric:
        node = fabric.nodes[1]
        code = "import socket; s = socket.socket(); s.bind((%r, 0)); print(s.getsockname()[0])"
        process = node.popen([sys.executable, "-c", code % node.address],
                             stdout=subprocess.PIPE, text=True)
        out, _ = process.communicate(timeout=30)
        # Binding the node's address only works inside the node's namespace.
        assert process.returncode == 0 and out.strip() == node.address


def test_exception_inside_the_block_tears_down():
    names_before = ours()
    with pytest.raises(RuntimeError, match="boom"):
        with Fabric(scenario(nodes=2)):
            assert len(ours()) == len(names_before) + 3
            raise RuntimeError("boom")
    assert ours() == names_before


@pytest.mark.parametrize("rate", ["500mbit", "1gbit"])
def test_shaped_goodput_within_a_few_percent_of_the_cap(rate, measure_until):
    expected = expected_goodput(Scenario.from_dict(
        {"name": "x", "topology": {"nodes": 2}, "link": {"rate": rate}}).link.rate, 1500)
    with Fabric(scenario(rate=rate)) as fabric:
        goodput = measure_until(
            lambda: measure_goodput(fabric.nodes[0], fabric.nodes[1], seconds=1.5),
            lambda bps: bps >= 0.95 * expected)
    assert 0.95 * expected <= goodput <= 1.03 * expected


def test_slow_node_override_caps_its_link_only(measure_until):
    slow = Scenario.from_dict({
        "name": "slow", "topology": {"nodes": 3},
        "link": {"rate": "1gbit", "override": [{"node": "n2", "rate": "200mbit"}]}})
    with Fabric(slow) as fabric:
        report = measure_until(lambda: check_fidelity(fabric, seconds=1.0),
                               lambda r: all(s.fraction >= 0.93 for s in r.samples))
    by_pair = {(s.source, s.destination): s for s in report.samples}
    # The probe is a ring, all flows at once: n2's slow link caps the flows into and out of it.
    assert set(by_pair) == {("n0", "n1"), ("n1", "n2"), ("n2", "n0")}
    assert by_pair[("n0", "n1")].cap_bps == 1e9
    assert by_pair[("n1", "n2")].cap_bps == by_pair[("n2", "n0")].cap_bps == 200e6
    for sample in report.samples:
        assert 0.93 <= sample.fraction <= 1.03, sample
    assert report.trusted


def test_netem_applies_delay_where_the_kernel_has_it(capabilities):
    if not capabilities.netem:
        pytest.skip("this kernel has no netem (sch_netem); the delay line stands in "
                    "(tests/netns/test_delay.py)")
    with Fabric(scenario(delay="5ms", loss="0%")) as fabric:
        kinds = [q["kind"] for q in fabric.qdiscs(0)]
    assert kinds[0] == "netem" and "tbf" in kinds


HOLDER = textwrap.dedent("""
    import json, signal, sys
    # Ctrl-C must reach it as KeyboardInterrupt even where the tests run as a background job
    # (SIGINT then starts ignored, and Python keeps it so)
    signal.signal(signal.SIGINT, signal.default_int_handler)
    from netsim_ddp import Scenario
    from netsim_ddp.fabric import Fabric
    scenario = Scenario.from_dict({"name": "h", "topology": {"nodes": 2},
                                  "link": {"rate": "100mbit"}})
    with Fabric(scenario) as fabric:
        child = fabric.nodes[0].popen([sys.executable, "-c", "import time; time.sleep(600)"])
        print(json.dumps({"namespaces": fabric.plan.namespaces, "child": child.pid}), flush=True)
        sys.stdin.read()  # hold the fabric until told (or killed)
""")


def start_holder():
    process = subprocess.Popen([sys.executable, "-c", HOLDER], stdin=subprocess.PIPE,
                               stdout=subprocess.PIPE, text=True)
    info = json.loads(process.stdout.readline())
    assert set(info["namespaces"]) <= set(ours())
    return process, info


def alive(pid):
    try:
        with open(f"/proc/{pid}/stat") as stat:
            return stat.read().split(") ")[1][0] != "Z"
    except FileNotFoundError:
        return False


@pytest.mark.parametrize("signum", [signal.SIGTERM, signal.SIGINT])
def test_signals_tear_down(signum):
    process, info = start_holder()
    process.send_signal(signum)
    process.wait(timeout=30)
    assert process.returncode != 0
    assert not set(info["namespaces"]) & set(ours())
    assert not alive(info["child"])


def run_clean(*args):
    return subprocess.run([sys.executable, "-m", "netsim_ddp.cli", "clean", *args],
                          capture_output=True, text=True, timeout=60)


def test_clean_sweeps_a_killed_run_and_spares_a_live_one():
    live_process, live = start_holder()
    killed_process, killed = start_holder()
    try:
        killed_process.kill()
        killed_process.wait(timeout=10)
        assert set(killed["namespaces"]) <= set(ours())  # SIGKILL leaves them behind
        dry = run_clean("--dry-run")
        assert dry.returncode == 0 and set(killed["namespaces"]) <= set(ours())
        result = run_clean()
        assert result.returncode == 0, result.stderr
        for name in killed["namespaces"]:
            assert f"removed namespace {name}" in result.stdout
        assert not set(killed["namespaces"]) & set(ours())
        assert not alive(killed["child"])  # the killed run's rank-like child is gone too
        assert set(live["namespaces"]) <= set(ours())  # the live run is left alone
        assert alive(live["child"])
    finally:
        live_process.stdin.close()
        live_process.wait(timeout=30)
    assert not set(live["namespaces"]) & set(ours())


ROOTLESS = textwrap.dedent("""
    import json, os, sys
    from netsim_ddp.fabric.namespaces import privilege
    from netsim_ddp.fabric.capabilities import probe_capabilities
    from netsim_ddp.fabric.emulated_network import Fabric
    from netsim_ddp.fabric.namespaces import netns
    from netsim_ddp import Scenario
    sys.path.insert(0, os.environ["TESTS_DIR"])
    from test_fabric import exchange
    scenario = Scenario.from_dict({"name": "r", "topology": {"nodes": 2},
                                  "link": {"rate": "200mbit"}})
    os.setgroups([]); os.setgid(65534); os.setuid(65534)
    mode = privilege.ensure_network_privilege()
    with Fabric(scenario) as fabric:
        ok = exchange(fabric.nodes[0], fabric.nodes[1], b"x" * 100000) == b"x" * 100000
        kinds = [q["kind"] for q in fabric.qdiscs(0)]
        inside = netns.list_names()
    print(json.dumps({"mode": mode, "ok": ok, "kinds": kinds, "inside": inside,
                      "after": netns.list_names(), "dir": str(netns.netns_dir()),
                      "can_build": probe_capabilities().can_build}))
""")


def test_rootless_through_a_user_namespace(tmp_path):
    if not privilege.host_root():
        pytest.skip("needs root to drop to an unprivileged user for the test")
    result = subprocess.run([sys.executable, "-c", ROOTLESS], capture_output=True, text=True,
                            timeout=60, cwd=tmp_path,
                            env={**os.environ, "TESTS_DIR": os.path.dirname(__file__)})
    if "refuses unprivileged user namespaces" in result.stderr:
        pytest.skip("this host forbids unprivileged user namespaces")
    assert result.returncode == 0, result.stderr
    info = json.loads(result.stdout)
    assert info["mode"] == "rootless" and info["ok"] and info["kinds"] == ["tbf"]
    assert len(info["inside"]) == 3 and info["after"] == []
    assert not info["dir"].startswith("/run/")  # private names, invisible to the host
    assert info["can_build"]


def test_background_flow_bytes_are_accounted_exactly():
    from netsim_ddp.fabric.background import BackgroundTraffic

    contended = Scenario.from_dict({
        "name": "bg", "topology": {"nodes": 3}, "link": {"rate": "500mbit"},
        "background": [{"source": "n2", "destination": "n1", "on": "100ms", "off": "50ms"}]})
    with Fabric(contended) as fabric:
        before = fabric.counters()
        with BackgroundTraffic(fabric, contended.background) as traffic:
            # Wait for real traffic, not for time: until a megabyte has crossed n2's link.
            deadline = time.monotonic() + 30
            while fabric.counters()["n2"].sent_bytes - before["n2"].sent_bytes < 1_000_000:
                assert time.monotonic() < deadline, "the background flow sent nothing"
            middle, mid_time = fabric.counters(), time.monotonic()
            while fabric.counters()["n2"].sent_bytes - middle["n2"].sent_bytes < 10_000_000:
                assert time.monotonic() < deadline, "the background flow stopped"
            background = traffic.stop()
        assert fabric.wait_drained()
        after = fabric.counters()
    on_links = sum(after[n].sent_bytes - before[n].sent_bytes for n in ("n1", "n2"))
    assert background.total > 2_000_000
    assert abs(background.total - on_links) <= 0.01 * on_links
    # A window of the run, as a rank would account it: TCP counts a segment when it enters
    # the queue, tc when it leaves, so the two differ by at most what the queue holds.
    since_middle = sum(after[n].sent_bytes - middle[n].sent_bytes for n in ("n1", "n2"))
    queue = contended.link_for(0).queue_limit_bytes
    assert abs(background.between(mid_time, time.monotonic()) - since_middle) \
        <= 0.01 * since_middle + queue
    assert after["n0"].sent_bytes == before["n0"].sent_bytes  # n0 is not part of the flow
