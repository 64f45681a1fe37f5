"""A real NIC shaped and restored exactly: root trees, ingress, refusals, a killed agent."""

from __future__ import annotations

import subprocess
import sys

import pytest
from pyroute2 import IPRoute
from simhosts import NIC, netsim_ddp

from netsim_ddp import Scenario
from netsim_ddp.fabric.nic import NicError, ShapedNic, state_path

pytestmark = [pytest.mark.netns]

LINK = Scenario.from_dict({"name": "nic", "topology": {"nodes": 1},
                           "link": {"rate": "300mbit"}}).link_for(0)


def install(host, tree: str) -> None:
    """A qdisc tree of someone else's on the NIC, for netsim-ddp to put back."""
    commands = {
        "default": [],
        "pfifo": [["tc", "qdisc", "replace", "dev", NIC, "root", "handle", "7:", "pfifo",
                   "limit", "321"]],
        "htb-tree": [["tc", "qdisc", "add", "dev", NIC, "root", "handle", "1:", "htb",
                      "default", "10", "r2q", "7"],
                     ["tc", "class", "add", "dev", NIC, "parent", "1:", "classid", "1:10", "htb",
                      "rate", "100mbit", "ceil", "200mbit"],
                     ["tc", "qdisc", "add", "dev", NIC, "parent", "1:10", "handle", "10:",
                      "bfifo", "limit", "64000"]],
    }[tree]
    for command in commands:
        host.run(command, check=True, capture_output=True)


@pytest.mark.parametrize("tree", ["default", "pfifo", "htb-tree"])
def test_shapes_both_directions_and_restores_exactly(one_host, tree):
    install(one_host, tree)
    before = one_host.tc_dump()
    with one_host.entered():
        with ShapedNic(NIC, LINK, job="test") as nic:
            shaping = nic.shaping()
            assert state_path(NIC).exists()  # recorded before anything changed
        assert not state_path(NIC).exists()
    assert shaping["egress_bps"] == pytest.approx(300e6)
    assert shaping["ingress_bps"] == pytest.approx(300e6)
    assert one_host.tc_dump() == before


def test_restores_after_an_exception(one_host):
    install(one_host, "pfifo")
    before = one_host.tc_dump()
    with one_host.entered(), pytest.raises(RuntimeError, match="boom"):
        with ShapedNic(NIC, LINK, job="test"):
            raise RuntimeError("boom")
    assert one_host.tc_dump() == before


def test_refuses_loopback_and_down_interfaces_before_changing_anything(one_host):
    before = one_host.tc_dump()
    with one_host.entered():
        with pytest.raises(NicError, match="loopback"):
            ShapedNic("lo", LINK, job="test").__enter__()
        with IPRoute() as ipr:
            ipr.link("set", index=ipr.link_lookup(ifname=NIC)[0], state="down")
        with pytest.raises(NicError, match="down"):
            ShapedNic(NIC, LINK, job="test").__enter__()
        with pytest.raises(NicError, match="no such interface"):
            ShapedNic("nsdnothere", LINK, job="test").__enter__()
        assert not state_path(NIC).exists()
    assert one_host.tc_dump().replace("state DOWN", "") == before.replace("state DOWN", "")


def test_refuses_delay_without_netem(one_host, capabilities):
    if capabilities.netem:
        pytest.skip("this kernel has netem")
    delayed = Scenario.from_dict({"name": "d", "topology": {"nodes": 1},
                                  "link": {"rate": "1gbit", "delay": "1ms"}}).link_for(0)
    before = one_host.tc_dump()
    with one_host.entered(), pytest.raises(NicError, match="netem"):
        ShapedNic(NIC, delayed, job="test").__enter__()
    assert one_host.tc_dump() == before


HOLDER = """
import sys
from netsim_ddp import Scenario
from netsim_ddp.fabric.nic import ShapedNic
link = Scenario.from_dict({"name": "k", "topology": {"nodes": 1},
                           "link": {"rate": "300mbit"}}).link_for(0)
with ShapedNic(sys.argv[1], link, job="killed"):
    print("shaped", flush=True)
    sys.stdin.read()
"""


def test_clean_restores_the_nic_of_a_killed_agent(one_host):
    install(one_host, "htb-tree")
    before = one_host.tc_dump()
    holder = one_host.popen([sys.executable, "-c", HOLDER, NIC], stdin=subprocess.PIPE,
                            stdout=subprocess.PIPE, text=True)
    try:
        assert holder.stdout.readline().strip() == "shaped"
        assert one_host.tc_dump() != before
        holder.kill()
        holder.wait()
        assert "tbf" in one_host.tc_dump()  # SIGKILL: nobody restored it
        cleaned = subprocess.run(netsim_ddp("clean"), capture_output=True, text=True)
        assert cleaned.returncode == 0, cleaned.stderr
        assert f"restored {NIC}" in cleaned.stdout
        assert one_host.tc_dump() == before
    finally:
        holder.kill()
