"""Real DDP training inside emulated networks: what each mode puts on the wire and costs."""

import json
import os
import statistics
from pathlib import Path

import pytest
from trust import passed_or_untrusted

from netsim_ddp import Scenario
from netsim_ddp.fabric.namespaces import netns
from netsim_ddp.run.runner import run_scenario
from netsim_ddp.workload import WorkloadError

pytestmark = [pytest.mark.netns, pytest.mark.ddp, pytest.mark.usefixtures("needs_fabric")]

ROOT = Path(__file__).resolve().parents[2]
HEADERS = 1514 / 1448  # wire bytes per TCP payload byte at MTU 1500, full segments


def scenario(nodes=2, ranks=1, rate="500mbit", params="2M", modes=("fp32", "amp", "amp-fp16"),
             iterations=4, **extra):
    return Scenario.from_dict({
        "name": "ddp-test", "topology": {"nodes": nodes, "ranks_per_node": ranks},
        "link": {"rate": rate},
        "workload": {"params": params, "iterations": iterations, "warmup": 1,
                     "batch_size": 8, "modes": list(modes)},
        **extra,
    })


def fabric_namespaces():
    """Namespaces a Fabric of these tests would make (switch and nodes n0, n1...)."""
    from netsim_ddp.fabric.naming import parse_netns_name

    return {name for name in netns.list_names()
            if (parsed := parse_netns_name(name)) and parsed[1] in {"sw", "n0", "n1"}}


@pytest.fixture(scope="module")
def three_modes(netsim_run):
    """One run shared by the tests that only read it: the shipped default (2 nodes at 1 Gbit/s,
    16.8M params, fp32, amp, amp-fp16), whose own item then reports this run."""
    return netsim_run(ROOT / "scenarios" / "default.toml")


@pytest.fixture(scope="module")
def ten_gbe(netsim_run):
    """scenarios/10gbe.toml as it is, with the session's options (its own item then reports
    this run): the scale model, time-dilated x20 with ResNet-50's compute replayed."""
    return netsim_run(ROOT / "scenarios" / "10gbe.toml")


def test_mixed_precision_on_the_wire(three_modes):
    report = three_modes
    assert report.status == "passed", [c.to_record() for c in report.checks]
    fp32, amp, fp16 = (report.modes[m] for m in ("fp32", "amp", "amp-fp16"))
    reference = fp32.wire_bytes_per_iteration
    assert amp.wire_bytes_per_iteration / reference == pytest.approx(1, abs=0.03)
    assert fp16.wire_bytes_per_iteration / reference == pytest.approx(0.5, abs=0.03)
    # The kernel's count agrees with what the comm hook handed to gloo: with 2 ranks each node
    # sends the whole buffer once (ring factor 1), plus TCP/IP/Ethernet headers.
    for mode in (fp32, amp, fp16):
        expected = 2 * mode.result.sent_bytes_per_iteration * HEADERS
        assert mode.wire_bytes_per_iteration == pytest.approx(expected, rel=0.03)
    # Half the bytes, and the link is the bottleneck: the exposed communication follows.
    assert fp16.comm.median < 0.8 * fp32.comm.median
    # On a CPU, amp's slow autocast backward hides comm too, so the comm check alone would pass
    # for an amp-fp16 that stopped compressing; its collectives, timed directly, would not.
    assert fp16.collective.median < 0.8 * amp.collective.median
    assert {c.name for c in report.checks} >= {"fidelity", "wire-bytes:amp/fp32",
                                               "wire-bytes:amp-fp16/fp32"}


def test_every_mode_crossed_the_emulated_network(three_modes):
    checks = {c.name: c for c in three_modes.checks}
    for mode in ("fp32", "amp", "amp-fp16"):
        assert checks[f"crossed:{mode}"].passed, checks[f"crossed:{mode}"].detail
        assert "crossed the emulated links" in checks[f"crossed:{mode}"].detail


def test_results_json_carries_the_promised_keys(three_modes):
    from netsim_ddp.verdicts.scenario_report import results_document

    document = json.loads(results_document([three_modes]).to_json())
    (entry,) = document["scenarios"]
    assert entry["name"] == "default" and entry["passed"] is True
    samples = three_modes.scenario.workload.batch_size * 2  # per rank, 2 ranks
    for mode in ("fp32", "amp", "amp-fp16"):
        data = entry["modes"][mode]
        assert (len(data["iteration_s"]) == len(data["comm_s"]) == len(data["compute_s"])
                == three_modes.modes[mode].result.iterations)
        assert data["wire_bytes_per_iteration"] > 0
        assert all(c >= 0 for c in data["comm_s"])
        assert data["samples_per_iteration"] == samples
        assert data["seconds_per_sample"] == pytest.approx(
            data["summary"]["iteration_s"]["median"] / samples)
    assert all({"name", "passed", "detail"} <= set(check) for check in entry["checks"])
    # the host's CPUs while training: the ranks kept them busy
    assert 0 < entry["host_load"]["busy"] <= 1 and 0 <= entry["host_load"]["steal"] <= 1
    assert document["version"] == 2 and document["created_at"] and document["machine_info"]["node"]
    assert len(entry["scenario_digest"]) == 16


def test_busbw_and_ring_bound_are_reported(three_modes):
    fp32 = three_modes.modes["fp32"].to_record().dump()
    # nccl-tests' busbw from the time the collectives were in flight: never above the link.
    assert 0.5 <= fp32["busbw_over_link"] <= 1.05
    n = fp32["world_size"]
    in_flight = fp32["summary"]["collective_s"]["median"]
    assert fp32["busbw_bps"] == pytest.approx(
        2 * (n - 1) / n * fp32["hook_bytes_per_iteration"] * 8 / in_flight, rel=1e-6)
    assert 0.9 <= fp32["comm_over_ring_lower_bound"] <= 2.0


def test_ranks_sharing_a_nic_and_background_traffic_are_accounted(netsim_run):
    # The shipped file (2 ranks per node, on/off flows both ways): its own item then reports
    # this run rather than train it again.
    report = netsim_run(ROOT / "scenarios" / "contended.toml")
    # The accounting checks; the comm-time verdict is the scenario item's business.
    checks = {check.name: check for check in report.checks}
    assert checks["fidelity"].passed and checks["wire-bytes:amp-fp16/fp32"].passed, checks
    # gloo's flat ring over 4 ranks crosses between the nodes twice, each hop 2(W-1)/W x S:
    # 3 S in all; the hops inside a node go to the node's own address, over lo, unshaped
    assert checks["crossed:fp32"].passed and checks["crossed:amp-fp16"].passed, checks
    for mode in (report.modes["fp32"], report.modes["amp-fp16"]):
        expected = 3 * mode.result.sent_bytes_per_iteration * HEADERS
        assert mode.wire_bytes_per_iteration == pytest.approx(expected, rel=0.05)
    fp32, fp16 = report.modes["fp32"], report.modes["amp-fp16"]
    assert fp32.result.world_size == 4
    assert fp32.background_bytes_per_iteration > 0 and fp16.background_bytes_per_iteration > 0
    ratio = fp16.wire_bytes_per_iteration / fp32.wire_bytes_per_iteration
    assert ratio == pytest.approx(0.5, abs=0.03)  # background traffic subtracted exactly


def _unshaped_bypass(fabric):
    """A veth straight from n0 to n1, no qdisc, no switch, and a /32 route on each side that
    sends the other node's eth0 address through it: the ranks still bind to and dial the
    eth0 addresses, but every packet takes the unshaped path (a routing leak, for real)."""
    from pyroute2 import IPRoute

    n0, n1 = fabric.nodes
    fd = os.open(netns.path_of(n1.netns), os.O_RDONLY)
    try:
        with n0.entered(), IPRoute() as ipr:
            ipr.link("add", ifname="nsdbyp0", kind="veth",
                     peer={"ifname": "nsdbyp1", "net_ns_fd": fd})
            index = ipr.link_lookup(ifname="nsdbyp0")[0]
            ipr.link("set", index=index, state="up")
            ipr.route("add", dst=f"{n1.address}/32", oif=index)
    finally:
        os.close(fd)
    with n1.entered(), IPRoute() as ipr:
        index = ipr.link_lookup(ifname="nsdbyp1")[0]
        ipr.link("set", index=index, state="up")
        ipr.route("add", dst=f"{n0.address}/32", oif=index)


def test_a_bypass_of_the_shaped_links_fails_the_crossing_check(tmp_path):
    # Both guards in one run: the probe finds the unshaped path faster than the link can carry
    # (refused, unless allowed as here), and the trained modes' bytes are not on the links.
    # (A failed run keeps its folder: tmp_path, not /tmp.)
    report = run_scenario(scenario(modes=("fp32", "amp-fp16"), iterations=3,
                                   fidelity={"attempts": 1}), on_built=_unshaped_bypass,
                          allow_untrusted=True, out_dir=tmp_path)
    assert report.status == "failed"
    checks = {check.name: check for check in report.checks}
    assert not checks["fidelity"].passed
    assert "went around the shaped links" in checks["fidelity"].detail
    for mode in ("fp32", "amp-fp16"):
        check = checks[f"crossed:{mode}"]
        assert not check.passed
        assert "did not cross the emulated network" in check.detail
        # expected: the ring's 2 x S plus headers; counted: what the shaped links saw
        sent = report.modes[mode].result.sent_bytes_per_iteration
        assert f"expected {2 * sent * HEADERS / 1e6:.2f} MB" in check.detail
        counted = report.modes[mode].wire_bytes_per_iteration
        assert f"counted {counted / 1e6:.2f} MB" in check.detail
        assert counted < 0.1 * 2 * sent


def test_profiler_agrees_with_exposed_comm_time(tmp_path):
    report = run_scenario(scenario(modes=("fp32",), iterations=8,
                                   fidelity={"enabled": False}),
                          out_dir=tmp_path, profile=True)
    fp32 = report.modes["fp32"].result
    assert fp32.profiled
    traces = sorted(tmp_path.rglob("trace-rank*-fp32.json"))
    assert [path.name for path in traces] == ["trace-rank0-fp32.json", "trace-rank1-fp32.json"]
    for path in traces:
        names = {event.get("name") for event in json.loads(path.read_text())["traceEvents"]}
        assert "gloo:all_reduce" in names
        assert {f"nsd.synced_step.{i}" for i in range(8)} <= names
    for rank in fp32.ranks:  # every measured synced step saw its all-reduce, inside it
        assert rank.profiler_allreduce_s is not None and min(rank.profiler_allreduce_s) > 0
        assert rank.collective_s is not None and min(rank.collective_s) > 0
        for allreduce, iteration in zip(rank.profiler_allreduce_s, rank.iteration_s, strict=True):
            assert allreduce <= iteration + 1e-3  # profiler and perf_counter clocks differ
    assert {b for rank in fp32.ranks for b in rank.buckets} == {1}  # 8 MB < 25 MiB bucket
    # One 8 MB bucket, all-reduced after backward ends: nothing hides it, so the all-reduce
    # the profiler records is the exposed communication, within the noise of the host. At
    # 500 Mbit/s the link, not the host, sets its length (~135 ms), so noise stays small.
    profiled = statistics.median(fp32.profiler_allreduce_s)
    assert 0.7 <= profiled / statistics.median(fp32.comm_s) <= 1.4
    # The direct collective timing (hook hand-off to future completion) sees the same
    # all-reduce from the other side: gloo closes its profiler event after completing the
    # future, and the clocks differ, so neither encloses the other; but a hand-off or a
    # completion stamped at the wrong moment (at enqueue, say) is off by far more than 1.5 x.
    ratios = [c / p for c, p in zip(fp32.collective_s, fp32.profiler_allreduce_s, strict=True)]
    ratio = statistics.median(fp32.collective_s) / profiled
    assert 1 / 1.5 <= ratio <= 1.5, f"collective_s / profiler all-reduce per step: {ratios}"


def test_a_crashing_rank_ends_the_run_and_leaves_nothing(monkeypatch, tmp_path):
    monkeypatch.setenv("PYTHONPATH", str(ROOT / "tests" / "workload"))
    names_before = fabric_namespaces()
    broken = scenario(modes=("fp32",), fidelity={"enabled": False})
    broken = broken.model_copy(update={"workload": broken.workload.model_copy(
        update={"model": "workload_factories:explode_on_rank1"})})
    with pytest.raises(WorkloadError, match=r"node n1 failed first(.|\n)*exploded on purpose"):
        run_scenario(broken, timeout_s=120, out_dir=tmp_path)  # its logs stay: tmp_path
    assert fabric_namespaces() <= names_before  # none of ours left (others may have ended)


def test_10gbe_runs_as_a_scale_model(ten_gbe):
    # Time-dilated x20 with ResNet-50's compute replayed: the host drives the dilated link,
    # and every time is the target's.
    report = ten_gbe
    assert report.status == "passed", [c.to_record() for c in report.checks if not c.passed]
    assert report.dilation == 20 and report.fidelity.trusted
    assert "time-dilated x20" in report.notice and "replayed" in report.notice
    record = report.to_record()
    assert record.emulation.dilation == 20 and record.emulation.compute_source == "replay"
    assert {c.name for c in report.checks} >= {"fidelity:replay:fp32", "fidelity:replay:amp-fp16"}
    fp32, fp16 = report.modes["fp32"], report.modes["amp-fp16"]
    # 102 MB of fp32 gradients between 2 nodes: the ring's 2(N-1)/N x S at 10 Gbit/s is 82 ms
    # of payload, 85.5 ms with TCP/IP/Ethernet headers (the target's; 1.7 s at the 500 Mbit/s
    # the host ran). Measured here 85.6-87.1 ms (docs/scale-model.md). A link slowed by
    # another factor than the division, or host costs not shrunk by k, lands far outside.
    wire_s = fp32.result.sent_bytes_per_iteration * HEADERS * 8 / 10e9
    assert wire_s == pytest.approx(0.0855, rel=0.01)
    assert 0.95 * wire_s < fp32.collective.median < 1.15 * wire_s, fp32.collective.median
    # amp-fp16 all-reduces float16 (half the bytes): its collectives take about half as long
    # (measured here 0.51-0.54 and, under heavy load from parallel work, 0.59); 1.0 would mean
    # the hook stopped compressing, 0.69 the host's float16 cost not shrunk enough (x10)
    ratio = fp16.collective.median / fp32.collective.median
    assert 0.4 < ratio < 0.65, ratio
    # The overlap is the target's: an iteration takes less than the replayed 120 ms compute
    # plus the whole all-reduce (measured 149-151 ms against 206); a replay that released
    # every gradient at the end of the backward would take the sum.
    assert fp32.iteration.median < 0.120 + 0.75 * fp32.collective.median, fp32.iteration.median


def variant(path: Path, **workload) -> dict:
    data = Scenario.load(path).model_dump(mode="json", exclude_none=True)
    data["workload"] |= workload
    return data


# The scale model's two accuracy claims, small (bench/scale_model.py measures them at full
# size): each reuses a run this module makes anyway and adds one short run.

def test_dilation_invariance_k_and_2k(ten_gbe, netsim_run):
    """scenarios/10gbe.toml at its k = 20 and at k = 10, fp32: target-time medians agree
    within 10% (measured here within 1%: docs/scale-model.md). A time not scaled by k
    (the replayed compute, a rate, the division) would differ by up to 2x."""
    data = variant(ROOT / "scenarios" / "10gbe.toml", modes=["fp32"], iterations=4)
    data["emulation"] = {"dilation": 10}
    at_10 = netsim_run(Scenario.from_dict(data))
    assert at_10.status == "passed", [c.to_record() for c in at_10.checks if not c.passed]
    assert (ten_gbe.dilation, at_10.dilation) == (20, 10)
    low, high = at_10.modes["fp32"], ten_gbe.modes["fp32"]
    for series in ("iteration", "collective"):
        a, b = getattr(low, series).median, getattr(high, series).median
        assert b / a == pytest.approx(1, abs=0.10), f"{series}: k=10 {a:.4f} s, k=20 {b:.4f} s"


def test_replay_reproduces_a_real_runs_iteration_and_exposed_comm(three_modes, netsim_run,
                                                                   measure_until):
    """scenarios/default.toml trained for real, then replayed with that run's own compute-only
    step times (fp32 and amp-fp16, as bench/scale_model.py replay does): iteration medians
    within 15%, exposed comm within 20% (the bench, quiet: 0.96-1.00; loaded: 0.84-0.97). A
    replay that dropped its compute leaves exposed comm 0.55-0.78 of the real one.

    The replay runs at dilation 2, as a scale model would: at k = 1 a 2-core CI host released
    amp-fp16's gradients a median 4 ms late against 3.4 ms allowed (5% of its 67 ms compute),
    and the replay's own fidelity check refused, rightly, saying to raise the dilation."""
    assert three_modes.modes, f"the real run trained nothing: {three_modes.refused}"

    def replay_of(real):
        fp32, fp16 = real.modes["fp32"], real.modes["amp-fp16"]
        data = variant(ROOT / "scenarios" / "default.toml", modes=["fp32", "amp-fp16"],
                       iterations=4, compute=f"{fp32.compute.median!r}s",
                       compute_amp=f"{fp16.compute.median!r}s")
        data["emulation"] = {"dilation": 2}
        return real, netsim_run(Scenario.from_dict(data))

    def ratios_of(real, report):
        return {(mode, series): getattr(report.modes[mode], series).median
                / getattr(real.modes[mode], series).median
                for mode in ("fp32", "amp-fp16") for series in ("iteration", "comm")}

    def within(mode, series):
        # amp-fp16's exposed comm: 0.77-0.79 of the real run's in all four CI attempts here on
        # 2026-12-07 (fresh real runs included; 0.96-1.00 quiet, 0.84-0.97 loaded before), an
        # open question (issue 47's note), so 25% there. A replay that dropped its compute
        # breaks the iteration medians (15%) whatever its comm does.
        return 0.15 if series == "iteration" else 0.25 if mode == "amp-fp16" else 0.20

    def close(pair):
        return pair[1].modes and all(
            ratio == pytest.approx(1, abs=within(mode, series))
            for (mode, series), ratio in ratios_of(*pair).items())

    # Two runs measured minutes apart on a shared host, either of which a busy spell can move
    # (CI: amp-fp16's comm 0.79 of the real run's, twice, against one real run): a pair that
    # missed is measured again, the real run too.
    reals = iter([lambda: three_modes, lambda: netsim_run(Scenario.from_dict(variant(
        ROOT / "scenarios" / "default.toml", modes=["fp32", "amp-fp16"])))])
    real, replayed = measure_until(lambda: replay_of(next(reals)()), close, attempts=2)
    assert replayed.modes, f"the replay trained nothing: {replayed.refused}"
    assert replayed.to_record().emulation.compute_source == "replay"
    # Both runs trustworthy: the link, and the replay's schedule kept (4 iterations are too
    # few for the scenario's comm-time expectation, which is not this test's business).
    for report, names in ((real, ["fidelity"]), (replayed, [
            "fidelity", "fidelity:replay:fp32", "fidelity:replay:amp-fp16"])):
        checks = {c.name: c for c in report.checks}
        for name in names:
            assert checks[name].passed, checks[name].detail
    ratios = ratios_of(real, replayed)
    for (mode, series), ratio in ratios.items():
        assert ratio == pytest.approx(1, abs=within(mode, series)), f"replayed / real: {ratios}"


def test_true_10gbe_is_refused_where_the_host_cannot_drive_it(netsim_run, lacks_fabric):
    # scenarios/10gbe.toml without its dilation: a true 10 Gbit/s link, which this host's gloo
    # cannot drive (three probe attempts, no training). A host that drives it cannot show the
    # refusal: a skip, saying so, but a failure where the host must (CI: a 2-core VM), so a
    # probe that stopped refusing cannot pass there.
    data = Scenario.load(ROOT / "scenarios" / "10gbe.toml").model_dump(mode="json",
                                                                       exclude_none=True)
    data["emulation"] = {"dilation": 1}
    report = netsim_run(Scenario.from_dict(data))
    fidelity = report.fidelity
    if fidelity.trusted:
        lacks_fabric(f"this host drives 10 Gbit/s all-reduce faithfully, so it cannot show the "
                     f"refusal: {fidelity.reason}")
    assert report.status == "untrusted" and not report.modes
    assert "cannot move the workload's traffic" in report.refused
    # a refusal repeats: every attempt fell short, and the reason lists them
    assert len(fidelity.attempts_bps) == report.scenario.fidelity.attempts > 1
    assert f"best of {len(fidelity.attempts_bps)} attempts" in report.refused
    assert fidelity.host_load is not None and "host CPUs" in report.refused


def test_cli_run_refuses_with_a_reason_and_exit_3(tmp_path, run_cli, lacks_fabric):
    # The CLI's side of a refusal, at the cost of one probe (the shipped 10gbe.toml's refusal
    # is the test above's): a small model at 10 Gbit/s, in both wire dtypes, since gloo sums
    # float16 slower than float32. A host that drives it trains briefly, then the test skips,
    # or fails under NETSIM_DDP_REQUIRE_FABRIC (as above).
    too_fast = tmp_path / "too-fast.toml"
    too_fast.write_text('name = "too-fast"\n[topology]\nnodes = 2\n[link]\nrate = "10gbit"\n'
                        '[fidelity]\nattempts = 1\n[workload]\nparams = "1M"\niterations = 2\n'
                        'warmup = 1\nmodes = ["fp32", "amp-fp16"]\n')
    result = run_cli("run", too_fast, "--json", tmp_path / "out.json")
    document = json.loads((tmp_path / "out.json").read_text())
    (entry,) = document["scenarios"]
    if entry["status"] != "untrusted":
        lacks_fabric("this host drives 10 Gbit/s all-reduces faithfully, in every wire dtype, "
                     f"so it cannot show the refusal (status {entry['status']})")
    assert result.returncode == 3  # untrusted: not "your release regressed"
    assert "UNTRUSTED" in result.stdout + result.stderr and entry["passed"] is False
    assert entry["refused"] and "try a quieter host" in entry["untrusted"]


def test_delayed_scenario_runs_end_to_end(netsim_run):
    # The shipped file as it is: scenarios/delayed.toml's own item then reports this run rather
    # than train it again. Its normal jitter needs netem's distribution tables, which pyroute2
    # cannot load, so the delay line carries it on every host (tests/netns has netem's side).
    report = netsim_run(ROOT / "scenarios" / "delayed.toml")
    # A busy host lets the delay line's frames leave late: untrusted, never failed.
    passed_or_untrusted(report, may_miss=["delay-line"])
    assert report.modes and report.delay_backends == {"n0": "delay-line", "n1": "delay-line"}
    for stats in report.delay_line_stats.values():
        assert stats["forwarded"] > 0 and stats["dropped_queue_full"] == 0
    document = report.to_record().dump()
    assert document["network"]["delay_backends"]["n0"] == "delay-line"
