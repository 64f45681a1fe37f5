"""A real NIC shaped and restored exactly: root trees, ingress, refusals, a killed agent."""

from __future__ import annotations

import dataclasses
import json
import os
import shutil
import signal
import subprocess
import sys
import tempfile
from pathlib import Path

import pytest
from pyroute2 import IPRoute
from pyroute2.netlink.exceptions import NetlinkError
from simhosts import NIC, netsim_ddp, transfer

from netsim_ddp import Scenario
from netsim_ddp.fabric.counters.own_link import counted_qdisc
from netsim_ddp.fabric.counters.qdisc_stats import basic_counts
from netsim_ddp.fabric.nic import shaping as nic_module
from netsim_ddp.fabric.nic import tc_tree
from netsim_ddp.fabric.nic.checks import NicError
from netsim_ddp.fabric.nic.shaping import NicRestoreError, ShapedNic, state_path

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
        # A production NIC's: mq, with a queue discipline of its own on every queue (handles
        # chosen by the kernel), which the kernel's mq makes classes for by itself.
        "mq-per-queue": [["tc", "qdisc", "replace", "dev", NIC, "root", "handle", "1:", "mq"],
                         *(["tc", "qdisc", "replace", "dev", NIC, "parent", f"1:{queue}",
                            "pfifo", "limit", str(100 + queue)] for queue in range(1, 5))],
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
from netsim_ddp.fabric.nic.shaping import ShapedNic
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


def test_mq_root_with_its_own_queue_disciplines_comes_back_exactly(mq_host):
    """mq makes its per-queue classes itself: re-creating them was EEXIST, and the run ended
    with a traceback, the NIC changed and its record left behind."""
    install(mq_host, "mq-per-queue")
    before = mq_host.tc_dump()
    assert before.count("pfifo") == 4 and "limit 104p" in before
    with mq_host.entered():
        with ShapedNic(NIC, LINK, job="test") as shaped:
            assert "tbf" in mq_host.tc_dump()
        assert shaped.restored and not state_path(NIC).exists()
    # The same tree; the kernel lists the hashed queue disciplines in an order of its own.
    assert sorted(mq_host.tc_dump().splitlines()) == sorted(before.splitlines())


def test_a_restore_that_fails_is_an_error_never_ok_and_clean_says_so(one_host, monkeypatch):
    install(one_host, "pfifo")
    before = one_host.tc_dump()
    with one_host.entered():
        with pytest.raises(NicRestoreError, match="File exists") as raised:
            with ShapedNic(NIC, LINK, job="test") as shaped:
                def refuse(self, msgs, *args, **kwargs):
                    raise NetlinkError(17, "File exists")
                monkeypatch.setattr(IPRoute, "nlm_request_batch", refuse)  # the restore's
        monkeypatch.undo()
        assert shaped.left_changed and not shaped.restored
        assert str(state_path(NIC)) in str(raised.value)  # where the record is kept
        path = state_path(NIC)
        assert path.exists() and "tbf" in one_host.tc_dump()
        # A record that cannot be applied: `clean` fails, says so, and exits 1...
        record = json.loads(path.read_text())
        record["before"]["root"][0]["options"] = "00"
        path.write_text(json.dumps(record))
        with pytest.raises(NicError, match="still shaped by an agent that was killed"):
            ShapedNic(NIC, LINK, job="next").__enter__()  # the NIC is refused meanwhile
    cleaned = subprocess.run(netsim_ddp("clean"), capture_output=True, text=True)
    assert cleaned.returncode == 1, cleaned.stdout
    assert f"could not restore {NIC}" in cleaned.stderr and "--forget-nic" in cleaned.stderr
    assert path.exists()
    # ...until a person puts the NIC right and tells `clean` to forget the record.
    one_host.run(["tc", "qdisc", "replace", "dev", NIC, "root", "handle", "7:", "pfifo",
                  "limit", "321"], check=True)
    assert one_host.tc_dump() == before
    forgot = subprocess.run(netsim_ddp("clean", "--forget-nic", NIC), capture_output=True,
                            text=True)
    assert forgot.returncode == 0 and f"forgot the record of {NIC}" in forgot.stdout
    assert not path.exists() and one_host.tc_dump() == before


def test_a_record_of_a_namespace_or_nic_that_is_gone_does_not_refuse_this_one(one_host):
    """Namespace inodes are reused (a restarted pod): a killed agent's record at the same path
    names another namespace (its cookie) or another NIC (index, MAC), and is litter."""
    install(one_host, "pfifo")
    before = one_host.tc_dump()
    with one_host.entered():
        path = state_path(NIC)
        with IPRoute() as ipr:
            (link,) = ipr.get_links(ipr.link_lookup(ifname=NIC)[0])
            snapshot = nic_module.snapshot(ipr, link["index"])
        mine = {"version": 2, "ifname": NIC, "index": link["index"],
                "netns_inode": nic_module.netns_inode(), "netns_cookie": nic_module.netns_cookie(),
                "mac": link.get_attr("IFLA_ADDRESS"), "job": "old", "pid": 1,
                "before": snapshot.as_dict(), "egress_handles": [nic_module.EGRESS_HANDLE],
                "ifb": None, "added_ingress": False}
        strangers = [mine | {"netns_cookie": mine["netns_cookie"] + 1},  # another namespace
                     mine | {"version": 1, "netns_cookie": None, "mac": None,
                             "index": link["index"] + 100}]  # another NIC, an old record
        for record in strangers:
            path.write_text(json.dumps(record))
            with ShapedNic(NIC, LINK, job="new") as shaped:
                assert any("dropped" in note for note in shaped.notes), shaped.notes
            assert not path.exists()
        path.write_text(json.dumps(strangers[0]))
    cleaned = subprocess.run(netsim_ddp("clean"), capture_output=True, text=True)
    assert cleaned.returncode == 0, cleaned.stderr
    assert "another namespace has its inode now" in cleaned.stdout
    with one_host.entered():
        assert not path.exists()
        path.write_text(json.dumps(mine))  # this NIC's own: refused until `clean`
        with pytest.raises(NicError, match="still shaped by an agent that was killed"):
            ShapedNic(NIC, LINK, job="new").__enter__()
        path.unlink()
    assert one_host.tc_dump() == before


def test_a_tree_that_would_not_come_back_exactly_is_found_by_the_rehearsal(one_host):
    """What the kernel will not take back as recorded shows on a scratch device, before the
    NIC changes; what it takes back leaves no difference."""
    install(one_host, "htb-tree")
    with one_host.entered(), IPRoute() as ipr:
        index = ipr.link_lookup(ifname=NIC)[0]
        tree = nic_module.snapshot(ipr, index)
        assert tc_tree.rehearse(ipr, tree, tx_queues=1, txqlen=1000, mtu=1500) == []
        broken = tc_tree.NicSnapshot(
            (dataclasses.replace(tree.root[0], options="00"), *tree.root[1:]), tree.classes,
            None)
        (problem,) = tc_tree.rehearse(ipr, broken, tx_queues=1, txqlen=1000, mtu=1500)
        assert "refused" in problem
        assert not [link for link in ipr.get_links()
                    if link.get_attr("IFLA_IFNAME").startswith("nsdrh")]  # scratch removed


def counted_bytes(host) -> int:
    with host.entered(), IPRoute() as ipr:
        msg = counted_qdisc(ipr, ipr.link_lookup(ifname=NIC)[0])
        return basic_counts(msg)[0]


def test_only_the_jobs_traffic_is_shaped_and_counted(job_and_outsider, measure_until):
    """Host 0 shaped for its peer (host 1): what it sends to and receives from the peer takes
    the link's time and is counted; what it exchanges with the outsider (host 2) passes at
    the NIC's pace and is not counted."""
    h0, h1, outsider = job_and_outsider
    size, rate = 2_000_000, 50e6
    link_s = size * 8 / rate  # 0.32 s at the link's rate
    slow = Scenario.from_dict({"name": "peers", "topology": {"nodes": 1},
                               "link": {"rate": "50mbit"}}).link_for(0)
    before = h0.tc_dump()
    with h0.entered():
        shaped = ShapedNic(NIC, slow, job="test", peers=[h1.address]).__enter__()
    try:
        assert shaped.shaping()["peers"] == [h1.address]
        counted = counted_bytes(h0)
        assert transfer(h0, h1, size) >= 0.9 * link_s  # egress, shaped
        assert counted_bytes(h0) - counted >= size
        assert transfer(h1, h0, size) >= 0.9 * link_s  # ingress, shaped
        counted = counted_bytes(h0)
        for source, destination in ((h0, outsider), (outsider, h0)):
            took = measure_until(lambda s=source, d=destination: transfer(s, d, size),
                                 lambda seconds: seconds < 0.3 * link_s)
            assert took < 0.3 * link_s, (source.address, destination.address, took)
        assert counted_bytes(h0) - counted < 10_000  # the outsider's bytes are not the job's
    finally:
        with h0.entered():
            shaped.__exit__(None, None, None)
    assert h0.tc_dump() == before


PROBE_WITHOUT_SYS_ADMIN = """
from netsim_ddp.fabric.nic.checks import privilege_problems, qdisc_available_here
print(qdisc_available_here("tbf", rate="1mbit", burst=4000, limit=30000),
      qdisc_available_here("nsdnosuchqdisc"), privilege_problems())
"""


def test_probes_need_only_net_admin_in_the_nics_namespace(one_host):
    """A NET_ADMIN-only pod (root in its container, no CAP_SYS_ADMIN) cannot create a
    namespace of its own, so a probe there read every qdisc, netem included, as missing."""
    before = one_host.tc_dump()
    probed = one_host.run(["setpriv", "--bounding-set=-sys_admin", "--inh-caps=-sys_admin", "--",
                           sys.executable, "-c", PROBE_WITHOUT_SYS_ADMIN],
                          capture_output=True, text=True)
    assert probed.returncode == 0, probed.stderr
    assert probed.stdout.split() == ["True", "False", "[]"]
    assert one_host.tc_dump() == before  # scratch devices only, removed


def test_a_user_without_the_privileges_is_told_which_and_nothing_changes(one_host, tmp_path):
    """Not root: no traceback on /run/netsim-ddp, but what is missing, before anything."""
    shared = Path(tempfile.mkdtemp(prefix="nsd-i24-"))
    shared.chmod(0o755)
    try:
        scenario = shared / "one.toml"
        scenario.write_text('name = "one"\n[topology]\nnodes = 1\n[link]\nrate = "1gbit"\n'
                            '[workload]\nparams = "1M"\n')
        scenario.chmod(0o644)
        (shared / "o").mkdir(mode=0o777)
        (shared / "o").chmod(0o777)  # the user's own --out
        before = one_host.tc_dump()
        host = ["host", scenario, "--node-rank", 0, "--nnodes", 1, "--master-addr",
                one_host.address, "--master-port", 29533, "--nic", NIC, "--out", shared / "o"]
        for caps, missing in (([], ["CAP_NET_ADMIN", "write access to /run/netsim-ddp"]),
                              (["--inh-caps=+net_admin", "--ambient-caps=+net_admin"],
                               ["write access to /run/netsim-ddp"])):
            result = one_host.run(["setpriv", "--reuid=65534", "--regid=65534",
                                   "--clear-groups", *caps, "--", *netsim_ddp(*host)],
                                  capture_output=True, text=True, cwd=shared)
            assert result.returncode == 1, result.stderr
            assert "Traceback" not in result.stderr, result.stderr[-2000:]
            for what in missing:
                assert what in result.stderr, result.stderr
            assert ("CAP_NET_ADMIN" in result.stderr) == ("CAP_NET_ADMIN" in missing)
        assert one_host.tc_dump() == before
    finally:
        shutil.rmtree(shared)


def test_a_leftover_probe_device_does_not_read_as_no_ifb(one_host):
    """The ifb probe had a fixed name: another agent's probe, or a leftover, made it fail
    (EEXIST) and ingress went unshaped without a word."""
    one_host.run(["ip", "link", "add", "nsdifbprobe", "type", "ifb"], check=True)
    with one_host.entered():
        with ShapedNic(NIC, LINK, job="test") as shaped:
            assert shaped.shaping()["ingress_bps"] == pytest.approx(300e6), shaped.notes


def test_a_second_sigterm_waits_for_the_restore(one_host, monkeypatch):
    """A scheduler's second SIGTERM (or a second Ctrl-C) arriving mid-restore: the restore
    finishes, then the signal ends the agent."""
    install(one_host, "pfifo")
    before = one_host.tc_dump()
    real_restore = nic_module.restore_nic

    def restore_under_fire(ipr, state):
        os.kill(os.getpid(), signal.SIGTERM)  # arrives before the first step
        real_restore(ipr, state)

    def terminate(signum, frame):
        raise SystemExit(128 + signum)

    monkeypatch.setattr(nic_module, "restore_nic", restore_under_fire)
    previous = signal.signal(signal.SIGTERM, terminate)
    try:
        with one_host.entered(), pytest.raises(SystemExit):
            with ShapedNic(NIC, LINK, job="test"):
                pass
    finally:
        signal.signal(signal.SIGTERM, previous)
    assert one_host.tc_dump() == before
    with one_host.entered():
        assert not state_path(NIC).exists()
