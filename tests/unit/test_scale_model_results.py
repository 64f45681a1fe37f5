"""A scale model's results: times divided by k (host times beside them), the one-line notice,
the replay-schedule check, and baselines and history that never mix kinds of run."""

from __future__ import annotations

import pytest

from netsim_ddp import Scenario
from netsim_ddp.measure.mode_report import ModeReport
from netsim_ddp.measure.target_time import (
    REAL_TIME,
    emulation_label,
    notice,
    replay_late_s,
    to_target_time,
)
from netsim_ddp.verdicts.baseline import Baseline, BaselineError, save
from netsim_ddp.verdicts.gate import Tolerance
from netsim_ddp.verdicts.run_checks import replay_checks
from netsim_ddp.verdicts.scenario_report import ScenarioReport
from netsim_ddp.workload.contract.mode_result import RankSamples, Straggler, combine


def rank(index: int, late: list[float] | None, k: float = 1.0) -> RankSamples:
    return RankSamples(
        rank=index, local_rank=0, hostname="n", iteration_s=[1.0 * k, 1.2 * k],
        compute_s=[0.8 * k, 0.8 * k], comm_s=[0.2 * k, 0.4 * k], sent_bytes=[400, 400],
        buckets=[1, 1], wire_dtypes=["float32"], loss=[0.0, 0.0], skipped_steps=0,
        param_digest="replay", started_monotonic=[100.0, 110.0],
        bucket_intervals=[[(0.5 * k, 0.9 * k)], [(0.5 * k, 1.1 * k)]], replay_late_s=late)


def result(k: float, late: list[float] | None = None):
    return combine([rank(0, late, k), rank(1, late, k)], mode="fp32", model="mlp",
                   params=100, params_requested=100, world_size=2, local_world_size=1,
                   backend="gloo", device="cpu", socket_ifname=None, batch_size=1,
                   grad_accumulation=1, bucket_size=1, warmup=0, iterations=2,
                   profiled=False, dilation=k, compute_source="replay")


def test_every_duration_is_divided_by_k_and_clocks_are_not() -> None:
    host = result(40.0, late=[0.04, 0.08])
    target = to_target_time(host, 40.0)
    assert target.iteration_s == pytest.approx([1.0, 1.2])
    assert target.compute_s == pytest.approx([0.8, 0.8])
    assert target.comm_s == pytest.approx([0.2, 0.4])
    assert target.collective_s == pytest.approx([0.4, 0.6])
    assert target.bucket_s == [pytest.approx([0.4]), pytest.approx([0.6])]
    assert target.ranks[0].bucket_intervals[1][0] == pytest.approx((0.5, 1.1))
    assert replay_late_s(target) == pytest.approx([0.001, 0.002])
    # the host's figures beside them; absolute clocks stay the host's (they place windows)
    assert target.host_s["iteration_s"] == pytest.approx([40.0, 48.0])
    assert target.started_monotonic == host.started_monotonic == [100.0, 110.0]
    assert target.sent_bytes_per_iteration == host.sent_bytes_per_iteration
    assert to_target_time(target, 40.0) is target  # never divided twice
    with pytest.raises(ValueError, match="dilation 40"):
        to_target_time(host, 20.0)


def test_stragglers_wait_in_target_time() -> None:
    host = result(10.0).model_copy(update={"stragglers": [Straggler(rank=1, wait_s=0.5)]})
    assert to_target_time(host, 10.0).stragglers[0].wait_s == pytest.approx(0.05)


def test_notice_and_labels() -> None:
    assert notice(1, "real") is None
    assert "x20" in notice(20, "real") and "replayed" in notice(1, "replay")
    assert "spread over 3 machines" in notice(1, "real", machines=3)
    assert "machines" not in notice(20, "replay")
    assert emulation_label(1, "real") == REAL_TIME
    assert emulation_label(40, "replay") != emulation_label(20, "replay")


SCENARIO = {"name": "scale", "topology": {"nodes": 2}, "link": {"rate": "10gbit"},
            "emulation": {"dilation": 10},
            "workload": {"layout": "resnet50", "compute": "100ms", "modes": ["fp32"]}}


def scale_report(k: float, late: list[float] | None = None) -> ScenarioReport:
    data = SCENARIO | {"emulation": {"dilation": k}}
    report = ScenarioReport(Scenario.from_dict(data), dilation=k)
    report.modes = {"fp32": ModeReport(to_target_time(result(k, late), k), 800.0, 0.0, 1e10)}
    return report


def test_replay_check_fails_a_host_that_could_not_keep_the_schedule() -> None:
    # compute 0.8 s target: 5% allows 40 ms; 2 ms late passes, 100 ms fails and says how late
    ok, = replay_checks(scale_report(10, late=[0.02, 0.02]))
    assert ok.passed and ok.name == "fidelity:replay:fp32"
    late, = replay_checks(scale_report(10, late=[1.0, 1.0]))
    assert not late.passed
    assert "100.00 ms" in late.detail and "raise emulation.dilation" in late.detail
    assert replay_checks(scale_report(10, late=None)) == []


def test_the_record_says_it_is_a_scale_model() -> None:
    record = scale_report(10, late=[0.0, 0.0]).to_record()
    assert record.emulation is not None and record.emulation.dilation == 10
    assert "time-dilated x10" in record.emulation.notice
    assert record.modes["fp32"].dilation == 10
    assert record.modes["fp32"].host_s["iteration_s"] == pytest.approx([10.0, 12.0])


def test_a_baseline_of_another_dilation_is_refused(tmp_path) -> None:
    path = save([scale_report(10, late=[0.0, 0.0])], tmp_path / "base.json")
    baseline = Baseline(path)
    tolerances = [Tolerance.parse("median:10%")]
    verdicts = baseline.compare(scale_report(10, [0.0, 0.0]), tolerances, 0.05)
    assert [v.passed for v in verdicts] == [True], verdicts  # fp32's median: one, passed
    with pytest.raises(BaselineError, match="dilation x10.*dilation x20"):
        baseline.compare(scale_report(20, [0.0, 0.0]), tolerances, 0.05)


def test_history_keeps_kinds_of_run_apart(tmp_path) -> None:
    from netsim_ddp.measure.document import save as save_document
    from netsim_ddp.verdicts.history import judge_history, load_runs
    from netsim_ddp.verdicts.scenario_report import results_document

    paths = []
    for index, k in enumerate((10, 10, 20, 1)):
        report = scale_report(k, [0.0, 0.0])
        if k == 1:  # a plain run of the same scenario: real time, real compute
            report = ScenarioReport(Scenario.from_dict(
                SCENARIO | {"emulation": {}, "workload": {"params": "1M", "modes": ["fp32"]}}))
            plain = result(1.0).model_copy(update={"compute_source": "real"})
            report.modes = {"fp32": ModeReport(to_target_time(plain, 1.0), 800.0, 0.0, 1e10)}
        paths.append(save_document(results_document([report]), tmp_path / f"{index}.json"))
    runs, _ = load_runs(paths, by_time=False)
    history = judge_history(runs)
    labels = {h.key.label for h in history.metrics}
    assert labels == {"scale[fp32] (dilation x10, compute replay)",
                      "scale[fp32] (dilation x20, compute replay)", "scale[fp32]"}
    assert any("separate series" in note for note in history.notes)


def test_auto_dilation_takes_the_least_trusted_power_of_two(monkeypatch) -> None:
    from netsim_ddp.measure.probe import CollectiveFidelity
    from netsim_ddp.run import runner

    tried = []

    def fake_run_at(scenario, k, **options):
        tried.append(k)
        fraction = {1.0: 0.5, 2.0: 0.8}.get(k, 0.97)  # the host drives the link from k = 4
        probe = CollectiveFidelity(2**20, 2, [fraction * 1e9], 1e9, 0.9)
        report = ScenarioReport(scenario, fidelity=probe, dilation=k)
        report.refused = None if probe.trusted else probe.reason
        return report

    monkeypatch.setattr(runner, "_run_at", fake_run_at)
    report = runner.run_scenario(Scenario.from_dict(SCENARIO | {"emulation": {
        "dilation": "auto"}}))
    assert tried == [1.0, 2.0, 4.0] and report.dilation == 4.0 and report.refused is None
    assert "k = 4" in report.dilation_chosen and "k = 2: probe reached 80%" in \
        report.dilation_chosen
    tried.clear()
    capped = runner.run_scenario(Scenario.from_dict(SCENARIO | {"emulation": {
        "dilation": "auto", "max_dilation": 2}}))
    assert tried == [1.0, 2.0] and capped.refused is not None
    assert "no k up to max_dilation 2" in capped.dilation_chosen
