"""`netsim-ddp host` across simulated hosts: one network namespace per host, one agent per
namespace started as a scheduler would, training through torchrun's c10d rendezvous."""

from __future__ import annotations

import json
import signal
import subprocess
import time
import tomllib
from pathlib import Path

import pytest
from pyroute2 import IPRoute
from simhosts import NIC, netsim_ddp, transfer

from netsim_ddp.fabric.counters.qdisc_stats import basic_counts
from netsim_ddp.fabric.namespaces import netns
from netsim_ddp.fabric.nic.job_plan import REST_CLASS
from netsim_ddp.fabric.nic.shaping import state_path

pytestmark = [pytest.mark.netns, pytest.mark.usefixtures("needs_fabric")]

ROOT = Path(__file__).resolve().parents[2]
PORT = 29531


def scenario_variant(tmp_path: Path, shipped: str, *, background: list | None = None,
                     topology: dict | None = None, fidelity: dict | None = None,
                     **workload) -> Path:
    """A shipped scenario's network (its topology and fidelity changed by `topology` and
    `fidelity`, flows added) with a small, quick model, written where only this test reads it."""
    data = tomllib.loads((ROOT / "scenarios" / f"{shipped}.toml").read_text())
    data["topology"].update(topology or {})
    data.setdefault("fidelity", {}).update(fidelity or {})
    data["workload"].update({"params": "2M", "batch_size": 8, "iterations": 5, "warmup": 1,
                             **workload})
    if background:
        data["background"] = background
    plain = [f"{key} = {_toml(value)}" for key, value in data.items()
             if not isinstance(value, dict)]
    tables = [f"[{table}]\n" + "\n".join(f"{key} = {_toml(value)}"
                                           for key, value in values.items())
              for table, values in data.items() if isinstance(values, dict)]
    path = tmp_path / f"{shipped}-variant.toml"
    path.write_text("\n".join(plain + tables) + "\n")
    return path


def _toml(value) -> str:
    """A TOML value; tables inline (`[[link.override]]` becomes `override = [{...}]`)."""
    if isinstance(value, dict):
        return "{" + ", ".join(f"{key} = {_toml(item)}" for key, item in value.items()) + "}"
    if isinstance(value, list):
        return "[" + ", ".join(_toml(item) for item in value) + "]"
    return json.dumps(value)


def small_default(tmp_path: Path, iterations: int = 5, probe: bool = True) -> Path:
    """The shipped default's network (two nodes, 1 Gbit/s links) with a small, quick model;
    `probe=False` skips the fidelity probe where a test judges something else."""
    return scenario_variant(tmp_path, "default", fidelity={"enabled": probe},
                            iterations=iterations)


def start_agents(hosts, scenario: Path, tmp_path: Path, *extra):
    return [host.popen(netsim_ddp(
        "host", scenario, "--node-rank", host.index, "--nnodes", len(hosts),
        "--master-addr", hosts[0].address, "--master-port", PORT, "--nic", host.nic,
        "--out", tmp_path / f"out{host.index}", "--json", tmp_path / f"result{host.index}.json",
        "--join-timeout", 60, *extra), stdout=subprocess.PIPE, stderr=subprocess.STDOUT,
        text=True) for host in hosts]


def finish(process: subprocess.Popen, timeout: float) -> str:
    try:
        return process.communicate(timeout=timeout)[0]
    except subprocess.TimeoutExpired:
        process.send_signal(signal.SIGTERM)  # the agent restores its NIC on the way out
        output = process.communicate(timeout=60)[0]
        pytest.fail(f"agent ran past {timeout} s:\n{output[-3000:]}")


def host_state(host) -> Path:
    with host.entered():
        return state_path(NIC)


def rest_class_bytes(host) -> int:
    """What the NIC sent outside the job's class (fabric/nic/job_plan.py's REST_CLASS)."""
    with host.entered(), IPRoute() as ipr:
        for msg in ipr.get_classes(index=ipr.link_lookup(ifname=NIC)[0]):
            if msg["handle"] == REST_CLASS:
                return basic_counts(msg)[0]
    raise AssertionError(f"{host.hostname}: no class {REST_CLASS:#x}")


@pytest.mark.ddp
def test_two_hosts_run_default_with_the_checks_of_run(production_hosts, tmp_path):
    """Hosts as production ones look (NICs with four queues, addresses .9 and .10 that c10d
    orders node 1 first, a third host on the switch that is not in the job)."""
    h0, h1, outsider = production_hosts
    two_hosts = [h0, h1]
    # someone's own trees (mq with a pfifo per queue; a pfifo): both must come back
    for command in (["root", "handle", "1:", "mq"],
                    *(["parent", f"1:{queue}", "pfifo", "limit", str(100 + queue)]
                      for queue in range(1, 5))):
        h0.run(["tc", "qdisc", "replace", "dev", NIC, *command], check=True)
    h1.run(["tc", "qdisc", "replace", "dev", NIC, "root", "handle", "7:", "pfifo", "limit",
            "321"], check=True)
    before = [host.tc_dump() for host in two_hosts]
    agents = start_agents(two_hosts, small_default(tmp_path), tmp_path)
    try:
        for line in agents[0].stdout:  # every NIC shaped, the job about to start
            if "all hosts ready" in line:
                break
        # The outsider's traffic is not the job's: it passes in the unshaped class, and only
        # the peer's packets are redirected to the ingress shaper.
        rest = rest_class_bytes(h0)
        transfer(h0, outsider, 2_000_000)
        assert rest_class_bytes(h0) - rest >= 2_000_000
        ingress = h0.run(["tc", "filter", "show", "dev", NIC, "ingress"], capture_output=True,
                         text=True, check=True).stdout
        assert "match 0a4d000a/ffffffff at 12" in ingress  # from h1, 10.77.0.10
        assert "0a4d000b" not in ingress  # not from the outsider, 10.77.0.11
    finally:
        outputs = [finish(agent, 240) for agent in agents]
    assert [agent.returncode for agent in agents] == [0, 0], "\n".join(outputs)
    assert "job finished (passed)" in outputs[1]
    # every NIC exactly as it was (the kernel lists mq's hashed queues in an order of its own)
    assert [sorted(host.tc_dump().splitlines()) for host in two_hosts] == [
        sorted(dump.splitlines()) for dump in before]
    assert not any(host_state(host).exists() for host in two_hosts)

    (report,) = json.loads((tmp_path / "result0.json").read_text())["scenarios"]
    assert report["status"] == "passed", report["checks"]
    assert not (tmp_path / "result1.json").exists()  # node 0 reports, the others don't
    checks = {check["name"]: check for check in report["checks"]}
    assert {"fidelity", "wire-bytes:amp/fp32", "wire-bytes:amp-fp16/fp32",
            "expect:comm_s.median:amp-fp16/fp32"} <= set(checks)
    # shaped to the scenario's rate, as each host's kernel reports it, in both directions...
    for name, host in report["hosts"].items():
        assert host["shaping"]["egress_bps"] == host["shaping"]["ingress_bps"] == 1e9, name
        assert host["restored"] == {"ok": True, "error": None}
    # ...and in effect: the all-reduce cannot beat the link (an unshaped veth runs ~5x faster)
    fidelity = report["fidelity"]
    assert 0.9 <= fidelity["busbw_bps"] / fidelity["expected_bps"] <= 1.05
    modes = report["modes"]
    ratio = (modes["amp-fp16"]["wire_bytes_per_iteration"]
             / modes["fp32"]["wire_bytes_per_iteration"])
    assert ratio == pytest.approx(0.5, abs=0.03)
    # every host's own counters, gathered over torch.distributed, make up the wire bytes
    for mode in modes.values():
        counted = {entry["hostname"]: entry["sent_bytes"] for entry in mode["link_bytes"]}
        assert set(counted) == {"nsdhost0", "nsdhost1"}
        # each host's node rank, though c10d numbered node 1's ranks first
        assert {(e["hostname"], e["node_rank"], e["rank"]) for e in mode["link_bytes"]} == {
            ("nsdhost0", 0, 1), ("nsdhost1", 1, 0)}
        assert all(sent > 0 for sent in counted.values())
        assert sum(counted.values()) / mode["iterations"] == pytest.approx(
            mode["wire_bytes_per_iteration"])


def run_to_the_end(hosts, scenario: Path, tmp_path: Path) -> dict:
    """Every agent to its end; node 0's report, with every NIC exactly as it was before."""
    before = [host.tc_dump() for host in hosts]
    agents = start_agents(hosts, scenario, tmp_path)
    outputs = [finish(agent, 240) for agent in agents]
    assert [agent.returncode for agent in agents] == [0] * len(hosts), "\n".join(outputs)
    assert "job finished (passed)" in outputs[-1]
    assert [host.tc_dump() for host in hosts] == before
    assert not any(host_state(host).exists() for host in hosts)
    (report,) = json.loads((tmp_path / "result0.json").read_text())["scenarios"]
    assert report["status"] == "passed", report["checks"]
    for name, host in report["hosts"].items():
        assert host["restored"] == {"ok": True, "error": None}, name
        # one machine, one clock: each offset found as ~0
        assert abs(host["clock"]["offset_s"]) <= host["clock"]["error_s"] + 0.002, name
    return report


@pytest.mark.ddp
def test_slow_node_on_three_hosts_with_flows_between_them(three_hosts, tmp_path):
    """The shipped slow-node on three hosts: its override by name (gpu3) lands on node rank
    2's NIC; background flows by node name (gpu0 <-> gpu1, fixed on/off so both modes meet
    them) run between the hosts and are accounted as on one host."""
    flow = {"on": "200ms", "off": "100ms", "distribution": "fixed", "rate": "100mbit"}
    scenario = scenario_variant(
        tmp_path, "slow-node", modes=["fp32", "amp-fp16"], iterations=4,
        topology={"nodes": 3, "names": ["gpu0", "gpu1", "gpu3"]},
        background=[{"source": "gpu0", "destination": "gpu1", "seed": 1, **flow},
                    {"source": "gpu1", "destination": "gpu0", "seed": 2, **flow}])
    report = run_to_the_end(three_hosts, scenario, tmp_path)
    rates = {name: (host["node_rank"], host["shaping"]["egress_bps"],
                    host["shaping"]["ingress_bps"]) for name, host in report["hosts"].items()}
    assert rates == {"gpu0": (0, 1e9, 1e9), "gpu1": (1, 1e9, 1e9), "gpu3": (2, 250e6, 250e6)}
    fidelity = report["fidelity"]  # the all-reduce ran at the slow link's pace, not faster
    assert fidelity["expected_bps"] < 250e6
    assert fidelity["busbw_bps"] <= 1.05 * fidelity["expected_bps"]
    assert {"wire-bytes:amp-fp16/fp32", "expect:comm_s.median:amp-fp16/fp32", "crossed:fp32",
            "crossed:amp-fp16", "background:fp32", "background:amp-fp16"} <= {
        check["name"] for check in report["checks"]}
    for name, mode in report["modes"].items():
        # every host's own counters make up the wire bytes, training and background...
        sent = {entry["hostname"]: entry["sent_bytes"] for entry in mode["link_bytes"]}
        assert set(sent) == {"nsdhost0", "nsdhost1", "nsdhost2"}
        assert sum(sent.values()) / mode["iterations"] == pytest.approx(
            mode["wire_bytes_per_iteration"] + mode["background_bytes_per_iteration"])
        # ...the flows' share, counted by their ends on two hosts, was taken off...
        assert mode["background_bytes_per_iteration"] > 0.1 * mode[
            "wire_bytes_per_iteration"], name
        # ...and they ran where the scenario put them: gpu3 (host 2) carries none, so it
        # sends less than both senders (the ring gives every node the same share)
        assert sent["nsdhost2"] < min(sent["nsdhost0"], sent["nsdhost1"]), (name, sent)


@pytest.mark.ddp
def test_a_killed_agent_ends_the_run_and_clean_restores_its_nic(two_hosts, tmp_path):
    h0, h1 = two_hosts
    h1.run(["tc", "qdisc", "replace", "dev", NIC, "root", "handle", "7:", "pfifo", "limit",
            "321"], check=True)
    before = [host.tc_dump() for host in two_hosts]
    # A short heartbeat timeout: node 0 then waits 5 s, not 15, for word from node 1 before
    # it decides that node 1 is gone.
    agents = start_agents(two_hosts, small_default(tmp_path, iterations=500, probe=False),
                          tmp_path, "--heartbeat-timeout", 5)
    try:
        for line in agents[0].stdout:  # both NICs shaped, and the ranks training
            if ": training " in line:
                break
        assert "tbf" in h1.tc_dump()
        agents[1].kill()  # SIGKILL: node 1's agent cannot restore anything
        agents[1].wait()
        started = time.monotonic()
        output = finish(agents[0], 90)
        assert agents[0].returncode == 1
        assert time.monotonic() - started < 60, output[-5000:]
        assert "node n1 (host nsdhost1, 10.77.0.2)" in output, output[-3000:]
        assert h0.tc_dump() == before[0]  # node 0 restored its own on the way out
        assert "tbf" in h1.tc_dump() and host_state(h1).exists()
        (report,) = json.loads((tmp_path / "result0.json").read_text())["scenarios"]
        assert report["status"] == "error" and "n1" in report["error"]

        cleaned = subprocess.run(netsim_ddp("clean"), capture_output=True, text=True)
        assert cleaned.returncode == 0, cleaned.stderr
        assert f"restored {NIC}" in cleaned.stdout
        assert h1.tc_dump() == before[1]
        assert not host_state(h1).exists()
        deadline = time.monotonic() + 10  # SIGKILLed by clean: gone once reaped
        while netns.pids_in([h1.netns])[h1.netns] and time.monotonic() < deadline:
            time.sleep(0.05)
        assert not netns.pids_in([h1.netns])[h1.netns]  # no rank of the dead agent lives on
    finally:
        for agent in agents:
            agent.kill()
            agent.communicate()


def test_a_host_that_never_arrives_ends_the_run_naming_it(two_hosts, tmp_path):
    h0, _ = two_hosts
    before = h0.tc_dump()
    agent = h0.popen(netsim_ddp(  # node 1 never starts
        "host", small_default(tmp_path), "--node-rank", 0, "--nnodes", 2,
        "--master-addr", h0.address, "--master-port", PORT, "--nic", NIC,
        "--json", tmp_path / "r.json", "--join-timeout", 3),
        stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True)
    output = finish(agent, 60)
    assert agent.returncode == 1
    assert "never arrived within 3 s: node n1 (node rank 1)" in output
    assert h0.tc_dump() == before  # nothing was shaped before everyone was there


def test_refuses_a_scenario_whose_nodes_are_not_the_hosts(one_host, tmp_path):
    before = one_host.tc_dump()
    result = one_host.run(netsim_ddp(
        "host", small_default(tmp_path), "--node-rank", 0, "--nnodes", 3, "--master-addr",
        one_host.address, "--master-port", PORT, "--nic", NIC), capture_output=True, text=True)
    assert result.returncode == 2
    assert "topology.nodes is 2 but --nnodes is 3" in result.stderr
    result = one_host.run(netsim_ddp(
        "host", small_default(tmp_path), "--node-rank", 0, "--nnodes", 2, "--master-addr",
        one_host.address, "--master-port", PORT, "--nic", "lo"), capture_output=True, text=True)
    assert result.returncode == 1 and "loopback" in result.stderr
    assert one_host.tc_dump() == before
