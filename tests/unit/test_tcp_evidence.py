"""[link.tcp] and the TCP clocks a scale model dilates; the kernel's TCP counters per mode and
node; the fidelity:tcp check. The kernel's side is in tests/netns/test_tcp_clocks.py."""

from __future__ import annotations

import pytest

from netsim_ddp import Scenario
from netsim_ddp.fabric import tcp_clocks
from netsim_ddp.fabric.counters import tcp_counters
from netsim_ddp.measure.mode_report import ModeReport
from netsim_ddp.measure.tcp_evidence import loss_summary
from netsim_ddp.measure.tcp_evidence import tcp_counters as window_counters
from netsim_ddp.report.tcp_view import loss_cell
from netsim_ddp.scenario.dilation import dilated
from netsim_ddp.scenario.spec import ScenarioError
from netsim_ddp.scenario.tcp import TcpConfig
from netsim_ddp.verdicts.scenario_report import ScenarioReport
from netsim_ddp.verdicts.tcp_checks import tcp_checks
from netsim_ddp.workload.contract.mode_result import ModeResult, RankSamples

SNMP = """Ip: Forwarding DefaultTTL
Ip: 1 64
Tcp: RtoAlgorithm RtoMin RtoMax OutSegs RetransSegs
Tcp: 1 200 120000 5000 17
Udp: InDatagrams OutSegs
Udp: 3 99
"""
NETSTAT = """TcpExt: SyncookiesSent TCPTimeouts DelayedACKs TCPLossProbes
TcpExt: 0 2 40 5
IpExt: InNoRoutes
IpExt: 0
"""


def scenario(dilation=1.0, **tcp):
    return Scenario.from_dict({"name": "t", "topology": {"nodes": 2},
                               "link": {"rate": "1gbit", "tcp": tcp},
                               "emulation": {"dilation": dilation}})


def test_undilated_default_writes_nothing():
    assert tcp_clocks.namespace_sysctls(TcpConfig(), 1.0) == {}


def test_dilation_multiplies_every_clock_and_the_target_rto():
    settings = tcp_clocks.namespace_sysctls(TcpConfig(rto_min="5ms", quickack=True,
                                                      slow_start_after_idle=False,
                                                      congestion_control="cubic"), 40.0)
    assert settings == {"tcp_rto_min_us": "200000", "tcp_min_rtt_wlen": "12000",
                        "tcp_comp_sack_delay_ns": "40000000",
                        "tcp_comp_sack_slack_ns": "4000000", "tcp_tso_rtt_log": "14",
                        "tcp_slow_start_after_idle": "0", "tcp_congestion_control": "cubic"}
    assert tcp_clocks.namespace_sysctls(TcpConfig(), 1000.0)["tcp_min_rtt_wlen"] == "86400"
    # unset under dilation: Linux's cubic, not the host's own default (BBR here)
    assert tcp_clocks.namespace_sysctls(TcpConfig(), 40.0)["tcp_congestion_control"] == "cubic"
    assert tcp_clocks.namespace_sysctls(TcpConfig(congestion_control="bbr"), 40.0)[
        "tcp_congestion_control"] == "bbr"


def test_route_metrics_lock_the_rto_by_hand():
    metrics = tcp_clocks.route_metrics(TcpConfig(quickack=False, congestion_control="cubic"),
                                       40.0, ["tcp_rto_min_us", "tcp_congestion_control"])
    assert metrics == {"rto_min": 8000, "lock": 1 << 13, "quickack": 0, "cc_algo": "cubic"}
    assert tcp_clocks.route_metrics(TcpConfig(congestion_control="cubic"), 40.0, []) == {}


def test_a_dilation_beyond_the_rto_cap_is_refused_naming_it():
    with pytest.raises(ScenarioError, match="tcp_rto_max_ms.*k <= 600"):
        scenario(dilation=700.0)
    with pytest.raises(ScenarioError, match="emulation.dilation.*tcp_rto_max_ms.*k <= 120"):
        scenario(dilation=200.0, rto_min="1s")
    with pytest.raises(ScenarioError, match="emulation.dilation.*tcp_rto_max_ms"):
        dilated(scenario(rto_min="1s"), 200.0)
    assert scenario(dilation=600.0).emulation.dilation == 600.0


def test_tcp_fields_are_the_targets_and_survive_dilation():
    host = dilated(scenario(rto_min="5ms", quickack=True), 40.0)
    assert host.link.tcp.rto_min == pytest.approx(0.005)  # the fabric dilates it, once
    with pytest.raises(ScenarioError, match="congestion_control"):
        scenario(congestion_control="vegas")


def test_counters_parsed_from_the_kernels_tables(tmp_path):
    (tmp_path / "snmp").write_text(SNMP)
    (tmp_path / "netstat").write_text(NETSTAT)
    assert tcp_counters.read_tcp_counters(tmp_path) == {
        "OutSegs": 5000, "RetransSegs": 17, "TCPTimeouts": 2, "DelayedACKs": 40,
        "TCPLossProbes": 5}  # Udp's OutSegs is not TCP's


def test_this_threads_namespace_has_the_counters():
    counters = tcp_counters.read_tcp_counters()
    assert {"RetransSegs", "TCPTimeouts", "TCPLossProbes", "DelayedACKs"} <= set(counters)


def rank(index, node, start, end):
    return RankSamples(
        rank=index, local_rank=0, hostname="h", node_rank=node, iteration_s=[0.2],
        compute_s=[0.1], comm_s=[0.1], sent_bytes=[8], buckets=[1], wire_dtypes=["float32"],
        loss=[1.0], skipped_steps=0, param_digest="x",
        link_marks=[{"monotonic_s": 1.0, "sent_bytes": 0, "sent_packets": 0,
                     **{f"tcp.{k}": v for k, v in start.items()}},
                    {"monotonic_s": 2.0, "sent_bytes": 8, "sent_packets": 1,
                     **{f"tcp.{k}": v for k, v in end.items()}}])


def result(ranks):
    return ModeResult(mode="fp32", model="mlp", params=2, params_requested=2,
                      world_size=len(ranks), local_world_size=1, backend="gloo", device="cpu",
                      socket_ifname="eth0", batch_size=8, grad_accumulation=1, bucket_size=1,
                      warmup=1, iterations=1, profiled=False, iteration_s=[0.2],
                      compute_s=[0.1], comm_s=[0.1], sent_bytes_per_iteration=8, ranks=ranks)


LOSSY = result([rank(0, 0, {"RetransSegs": 10, "TCPTimeouts": 1},
                     {"RetransSegs": 25, "TCPTimeouts": 4}),
                rank(1, 1, {"RetransSegs": 0, "TCPTimeouts": 0},
                     {"RetransSegs": 2, "TCPTimeouts": 0})])


def test_window_counters_per_node_and_in_the_record():
    records = window_counters(LOSSY)
    assert [(r.node_rank, r.counters) for r in records] == [
        (0, {"RetransSegs": 15, "TCPTimeouts": 3}), (1, {"RetransSegs": 2, "TCPTimeouts": 0})]
    assert loss_summary(records) == "RetransSegs 17, TCPTimeouts 3"
    assert loss_cell(records) == "retx 17 rto 3"
    record = ModeReport(LOSSY, 8, 0, 1e9).to_record()
    assert record.dump()["tcp_counters"][0]["counters"] == {"RetransSegs": 15, "TCPTimeouts": 3}
    clean = result([rank(0, 0, {"RetransSegs": 3}, {"RetransSegs": 3})])
    assert loss_summary(window_counters(clean)) is None and loss_cell(window_counters(clean)) == ""


def report(k, settings, mode_result=LOSSY):
    out = ScenarioReport(scenario(), dilation=k, tcp_settings=settings)
    out.modes["fp32"] = ModeReport(mode_result, 8, 0, 1e9)
    return out


def test_fidelity_tcp_fails_an_undilated_rto_that_timed_out_and_counts_them():
    undilated = {"node0": {"tcp_rto_min_us": "200000"}, "node1": {"tcp_rto_min_us": "200000"}}
    (check,) = tcp_checks(report(40.0, undilated))
    assert check.name == "fidelity:tcp:fp32" and not check.passed
    assert "3 timeouts" in check.detail
    dilated_rto = {n: {"tcp_rto_min_us": "8000000"} for n in ("node0", "node1")}
    (check,) = tcp_checks(report(40.0, dilated_rto))
    assert check.passed and "TCPTimeouts 3" in check.detail
    on_route = {n: {"tcp_rto_min_us": "200000", "route:RTAX_RTO_MIN": 8000}
                for n in ("node0", "node1")}
    assert tcp_checks(report(40.0, on_route))[0].passed
    no_timeout = result([rank(0, 0, {"TCPTimeouts": 1}, {"TCPTimeouts": 1})])
    assert tcp_checks(report(40.0, undilated, no_timeout))[0].passed
    assert tcp_checks(report(1.0, undilated)) == []  # real time: the kernel's clock is the target's


def test_loss_in_the_run_table_keeps_every_mode_name_whole_in_a_log():
    """The loss goes into the table's caption: as a 14th column it pushed the table past a
    120-column log, and rich cut the mode names ('script' read 'scri…' and a test that looked
    for its row failed whenever TCP happened to retransmit)."""
    from rich.console import Console

    from netsim_ddp.report.tables import mode_table

    lossy = ScenarioReport(Scenario.from_dict({
        "name": "t", "topology": {"nodes": 2}, "link": {"rate": "1gbit"},
        "workload": {"params": "1M", "modes": ["fp32", "amp-fp16"]}}))
    lossy.modes["fp32"] = ModeReport(LOSSY, 8, 0, 1e9)
    lossy.modes["amp-fp16"] = ModeReport(LOSSY, 8, 0, 1e9)
    console = Console(width=120, record=True)
    console.print(mode_table(lossy))
    text = console.export_text()
    rows = [line.split()[:1] for line in text.splitlines()]
    assert ["fp32"] in rows and ["amp-fp16"] in rows
    assert "fp32 retx 17 rto 3" in " ".join(text.split())
