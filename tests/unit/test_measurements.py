"""A counter, probe or flow that reported nothing is an error or a failed check, never a zero
that reads as a measurement: link marks, hook bytes, wire bytes, the all-reduce probe's
timings, and the background flows' ends."""

from __future__ import annotations

import json
import subprocess
import sys
from dataclasses import dataclass
from pathlib import Path

import pytest

from netsim_ddp.fabric.background import (
    BackgroundBytes,
    BackgroundError,
    BackgroundTraffic,
    EndReport,
    FlowEnd,
    assemble,
    scheduled_on_s,
)
from netsim_ddp.measure import wire
from netsim_ddp.measure.mode_report import ModeReport
from netsim_ddp.run import probing
from netsim_ddp.scenario.spec import BackgroundFlow
from netsim_ddp.verdicts import run_checks
from netsim_ddp.workload import WorkloadError
from netsim_ddp.workload.contract.mode_result import ModeResult, RankSamples
from netsim_ddp.workload.ranks.collective import AllreduceResult


def rank(index: int, local_rank: int, marks=None, sent: int = 800) -> RankSamples:
    return RankSamples(rank=index, local_rank=local_rank, hostname="h", iteration_s=[0.2, 0.2],
                       compute_s=[0.1, 0.1], comm_s=[0.1, 0.1], sent_bytes=[sent, sent],
                       buckets=[1, 1], wire_dtypes=["float32"], loss=[1.0, 1.0],
                       skipped_steps=0, param_digest="x", link_marks=marks)


def marks(start_s: float, end_s: float, sent: int) -> list[dict[str, float]]:
    return [{"monotonic_s": start_s, "sent_bytes": 1000, "sent_packets": 1},
            {"monotonic_s": end_s, "sent_bytes": 1000 + sent, "sent_packets": 9}]


def result(ranks: list[RankSamples], local_world_size: int = 1, sent: int = 800) -> ModeResult:
    return ModeResult(mode="fp32", model="mlp", params=200, params_requested=200,
                      world_size=len(ranks), local_world_size=local_world_size, backend="gloo",
                      device="cpu", socket_ifname="eth0", batch_size=8, grad_accumulation=1,
                      bucket_size=1 << 20, warmup=1, iterations=2, profiled=False,
                      iteration_s=[0.2, 0.2], compute_s=[0.1, 0.1], comm_s=[0.1, 0.1],
                      sent_bytes_per_iteration=sent, ranks=ranks)


# -- link marks: every node's, or an error ---------------------------------------------------

def test_window_bytes_sum_every_nodes_link() -> None:
    two = result([rank(0, 0, marks(1, 2, 5000)), rank(1, 0, marks(1.1, 2.1, 7000))])
    total, background = wire.window_bytes(two, BackgroundBytes())
    assert total == 12_000 and background == 0


def test_a_node_without_link_marks_is_an_error_not_zero_bytes() -> None:
    """Before, a node whose rank reported no marks was left out of the sum: its bytes read 0."""
    one_missing = result([rank(0, 0, marks(1, 2, 5000)), rank(1, 0, None)])
    with pytest.raises(WorkloadError,
                       match=r"1 of 2 nodes reported their link counters \(ranks \[1\] did not"):
        wire.window_bytes(one_missing, BackgroundBytes())


def test_only_local_rank_zero_marks_and_all_nodes_count() -> None:
    # 2 nodes x 2 ranks: the second node's leader is rank 2; rank 3 never marks.
    ranks = [rank(0, 0, marks(1, 2, 10)), rank(1, 1), rank(2, 0, None), rank(3, 1)]
    with pytest.raises(WorkloadError, match=r"ranks \[2\] did not"):
        wire.window_bytes(result(ranks, local_world_size=2), BackgroundBytes())


def test_link_counters_that_go_backwards_are_an_error() -> None:
    backwards = result([rank(0, 0, marks(1, 2, -10))])
    with pytest.raises(WorkloadError, match="went backwards"):
        wire.window_bytes(backwards, BackgroundBytes())


# -- hook and wire bytes ---------------------------------------------------------------------

def test_zero_hook_or_wire_bytes_fail_a_check() -> None:
    """Before, a zero reference made the wire-ratio check vanish and the run passed."""
    report = ModeReport(result([rank(0, 0), rank(1, 0)], sent=0), 0.0, 5e5, 1e9)
    (check,) = run_checks.measurement_checks({"fp32": report}, nodes=2)
    assert not check.passed and check.name == "measured:fp32"
    assert "comm hook counted no gradient bytes" in check.detail
    assert "links carried 0 training bytes per iteration after subtracting 500000" in check.detail
    assert run_checks.wire_ratio_checks({"fp32": report}) == []  # which is why this check exists


def test_one_node_may_put_nothing_on_the_wire() -> None:
    report = ModeReport(result([rank(0, 0), rank(1, 1)], 2), 0.0, 0.0, 1e9)
    assert run_checks.measurement_checks({"fp32": report}, nodes=1) == []


# -- the all-reduce probe --------------------------------------------------------------------

def probe_results(monkeypatch, results) -> None:
    def read(out):
        if isinstance(results, Exception):
            raise results
        return results
    monkeypatch.setattr(probing, "read_probe", read)


def timed(dtype: str, seconds: list[float]) -> AllreduceResult:
    return AllreduceResult(dtype=dtype, size_bytes=8 << 20, world_size=2, seconds=seconds)


def test_probe_results_give_each_dtypes_bandwidth(monkeypatch, tmp_path) -> None:
    probe_results(monkeypatch, [timed("float32", [0.1, 0.1]), timed("float16", [0.1])])
    by_dtype, _ = probing._probe_results(tmp_path, ["float32", "float16"])
    assert by_dtype["float32"] == pytest.approx((8 << 20) * 8 / 0.1)


@pytest.mark.parametrize("seconds", [[0.0, 0.1], [], [float("nan")]], ids=["zero", "none", "nan"])
def test_probe_timing_that_measured_nothing_is_an_error(monkeypatch, tmp_path, seconds) -> None:
    """Before, a zero duration became an infinite bus bandwidth: a trusted host."""
    probe_results(monkeypatch, [timed("float32", seconds)])
    with pytest.raises(WorkloadError, match="no usable measurement"):
        probing._probe_results(tmp_path, ["float32"])


def test_probe_missing_a_dtype_is_an_error(monkeypatch, tmp_path) -> None:
    """Before, the probe was judged by the dtypes it reported, not those the modes send."""
    probe_results(monkeypatch, [timed("float32", [0.1])])
    with pytest.raises(WorkloadError, match="reported nothing for float16"):
        probing._probe_results(tmp_path, ["float32", "float16"])


def test_probe_without_a_result_file_is_an_error(monkeypatch, tmp_path) -> None:
    probe_results(monkeypatch, FileNotFoundError("allreduce.json"))
    with pytest.raises(WorkloadError, match="no readable result"):
        probing._probe_results(tmp_path, ["float32"])


# -- background flows' ends ------------------------------------------------------------------

def _traffic_with(tmp_path: Path, ends: list[tuple[str, str, str | None]]) -> BackgroundTraffic:
    """A BackgroundTraffic whose running ends are small scripts; each writes `report` (or not)
    and its stderr file, as the real ends do."""
    traffic = BackgroundTraffic(fabric=None, flows=[])
    traffic._reports_folder = tmp_path
    for index, (role, script, report) in enumerate(ends):
        path = tmp_path / f"{index}.json"
        if report is not None:  # the ends' report format: their series, the windows followed
            path.write_text(f'{{"points": {report}, "windows": null}}')
        with open(path.with_suffix(".err"), "wb") as stderr:
            process = subprocess.Popen([sys.executable, "-c", script], stderr=stderr)
        kind = role.split()[0]
        traffic._running.append(FlowEnd(0, kind, role, process, path))
    return traffic


def test_an_end_that_died_mid_run_is_named_at_once(tmp_path) -> None:
    traffic = _traffic_with(tmp_path, [
        ("sender in n0", "import sys; sys.exit('BrokenPipeError: the sink went away')", "[]"),
        ("sink in n1", "import time; time.sleep(30)", "[[1.0, 0], [2.0, 10]]")])
    traffic._running[0].process.wait()
    with pytest.raises(BackgroundError) as caught:
        traffic.check()
    assert "sender in n0 (exit code 1; stderr: BrokenPipeError: the sink went away)" \
        in str(caught.value)
    assert "sink in n1" not in str(caught.value)  # still running: fine
    with pytest.raises(BackgroundError, match="had died before the end"):
        traffic.stop()


def test_a_sink_that_never_carried_the_flow_is_an_error_not_zero_bytes(tmp_path) -> None:
    """Before, an empty series summed to 0 background bytes: a silent 'no contention'."""
    traffic = _traffic_with(tmp_path, [
        ("sender in n0", "import time; time.sleep(30)", "[[1.0, 0], [2.0, 10]]"),
        ("sink in n1", "import time; time.sleep(30)", "[]")])
    with pytest.raises(BackgroundError, match=r"sink in n1 \(no samples"):
        traffic.stop()


def test_ends_that_report_are_accounted(tmp_path) -> None:
    traffic = _traffic_with(tmp_path, [
        ("sender in n0", "import time; time.sleep(30)", "[[1.0, 0], [2.0, 100]]"),
        ("sink in n1", "import time; time.sleep(30)", "[[1.0, 0], [2.0, 10]]")])
    traffic.check()
    assert traffic.stop().total == 110


@dataclass(frozen=True)
class _Loopback:
    """A node for real flow ends on loopback (the project's own traffic only)."""

    name: str
    address: str = "127.0.0.1"

    def popen(self, argv, **kwargs) -> subprocess.Popen:
        return subprocess.Popen(list(argv), **kwargs)


def test_a_sink_whose_sender_another_host_stopped_first_is_not_taken_for_dead() -> None:
    """On several hosts each agent stops its own ends: senders everywhere first, then the rest
    (netsim-ddp host). Before, a sink exited (code 0) as soon as the remote sender reset the
    connection, and its agent then reported it as 'had died before the end' (seen in CI on the
    three-host slow-node test)."""
    flow = BackgroundFlow(source="n0", destination="n1", on="50ms", off="50ms",
                          distribution="fixed", rate="10mbit", seed=1)
    sink_host = BackgroundTraffic(None, [flow])
    sender_host = BackgroundTraffic(None, [flow])
    try:
        port = sink_host.start_sink(0, _Loopback("n1"))
        sender_host.start_sender(0, _Loopback("n0"), "127.0.0.1", port)
        sender_host.stop_senders()
        sink = sink_host._running[0].process
        assert sink.stdout.readline().strip() == "ended"  # it saw the reset, and stays
        (received,) = sink_host.stop_ends()
        (sender,) = sender_host.stop_ends()
    finally:
        sink_host.stop_ends()
        sender_host.stop_ends()
    # It reported its counters (stop_ends raised nothing). What it received may be 0: the
    # sender closes with a reset (SO_LINGER 0), which drops whatever the sink had not read.
    assert sender.points[-1][1] > 0 and received.points


def test_ends_from_several_hosts_assemble_flow_by_flow_senders_first() -> None:
    """`netsim-ddp host` gathers each host's ends in any order; BackgroundBytes.senders must
    still be each flow's sender, in flow order, and survive the trip through JSON."""
    def end(flow: int, kind: str, sent: int) -> EndReport:
        windows = ((("fp32", 1.5, 2.5),) if kind == "sender" else None)
        return EndReport(flow, kind, f"{kind} of flow {flow}", ((1.0, 0), (3.0, sent)), windows)

    gathered = [end(1, "sink", 5), end(0, "sender", 100), end(1, "sender", 300),
                end(0, "sink", 2)]
    travelled = [EndReport.from_dict(json.loads(json.dumps(e.as_dict()))) for e in gathered]
    assert travelled == gathered
    background = assemble(travelled)
    assert [points[-1][1] for points in background.senders] == [100, 300]
    assert background.total == 407
    assert [role for role, _ in background.windows] == ["sender of flow 0", "sender of flow 1"]
    assert background.missed_window("fp32", 1.0, 2.0) == []


# -- background flows within each mode's window ----------------------------------------------

def _flows(*starts: float) -> list[BackgroundFlow]:
    return [BackgroundFlow.model_validate(
        {"source": "n0", "destination": "n1", "on": "200ms", "off": "300ms",
         "start": f"{start}s", "distribution": "fixed"}) for start in starts]


def test_scheduled_on_time_counts_the_overlap() -> None:
    (flow,) = _flows(0.1)
    assert scheduled_on_s(flow, 1.0) == pytest.approx(0.2 + 0.2)  # [0.1, 0.3], [0.6, 0.8]
    assert scheduled_on_s(flow, 0.2) == pytest.approx(0.1)
    assert scheduled_on_s(flow, 0.05) == 0


def _modes(*windows: tuple[float, float]) -> dict[str, ModeResult]:
    modes = ["fp32", "amp", "amp-fp16"]
    return {modes[i]: result([rank(0, 0, marks(start, end, 10))]).model_copy(
        update={"mode": modes[i]}) for i, (start, end) in enumerate(windows)}


def test_a_flow_silent_in_a_window_it_was_scheduled_on_fails() -> None:
    """Item 1's symptom from this side: a sender that never saw the window sent 0 bytes, and
    the run passed reporting no background. Now that is a failed check with the numbers."""
    sender = ((0.0, 0), (1.0, 0), (2.0, 5_000_000), (3.0, 5_000_000), (4.0, 5_000_000))
    sink = ((0.0, 0), (4.0, 100))
    background = BackgroundBytes((sender, sink))
    checks = run_checks.background_checks(_flows(0.0), background, _modes((1.0, 2.0), (3.0, 4.0)))
    fp32, amp = checks
    assert fp32.passed and "flow 0 (n0 -> n1) sent 5.0 MB in 0.40 s scheduled on" in fp32.detail
    assert not amp.passed and amp.name == "background:amp"
    assert "flow 0 (n0 -> n1) was scheduled on for 0.40 s but sent nothing" in amp.detail


def test_a_flow_not_yet_on_may_send_nothing() -> None:
    background = BackgroundBytes((((0.0, 0), (9.0, 0)), ((0.0, 0), (9.0, 0))))
    (check,) = run_checks.background_checks(_flows(5.0), background, _modes((1.0, 2.0)))
    assert check.passed


def test_flows_without_their_senders_counters_fail() -> None:
    (check,) = run_checks.background_checks(_flows(0.0, 0.0), BackgroundBytes(((), ())),
                                        _modes((1.0, 2.0)))
    assert not check.passed and "2 flows but 1 senders" in check.detail
