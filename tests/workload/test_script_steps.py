"""A user's script's steps, as the recorder sees them (workload.contract.steps): no torch, no
network. The edges, link counters and collective timing are stand-ins that record what was asked of
them."""

from __future__ import annotations

import json
from dataclasses import dataclass, field

import pytest

from netsim_ddp.fabric.counters.own_link import LinkMark
from netsim_ddp.workload.contract.steps import (
    Edges,
    MeasuredEnough,
    ScriptRankRecord,
    ScriptSpec,
    StepError,
    StepRecorder,
    record_path,
)


@dataclass
class Fake:
    """Clock, link counter (+1000 bytes a read) and collectives (+10 bytes a step)."""

    now: float = 0.0
    sent: int = 0
    retrans: int = 0
    events: list[str] = field(default_factory=list)

    def clock(self) -> float:
        return self.now

    def read_link(self) -> LinkMark:
        self.sent += 1000
        return LinkMark(self.now, self.sent, self.sent // 100)

    def read_loss(self) -> dict[str, int]:
        """RetransSegs: 4 more at each read from t = 3 s on (none before)."""
        self.retrans += 4 if self.now >= 3.0 else 0
        return {"RetransSegs": self.retrans, "TCPTimeouts": 0}

    def take_step(self) -> tuple[int, list[tuple[float, float]] | None]:
        return 10, [(0.0, 0.001)]

    def describe(self, record: ScriptRankRecord) -> None:
        record.ddp_models = 1


def recorder(tmp_path, fake: Fake, *, warmup: int = 2, iterations: int = 3,
             steps: str = "optimizer", after: str = "stop") -> StepRecorder:
    spec = ScriptSpec(run="v", warmup=warmup, iterations=iterations, steps=steps,
                      after_measured=after, out=str(tmp_path), barrier_timeout_s=5)
    return StepRecorder(
        spec=spec,
        record=ScriptRankRecord(rank=0, local_rank=0, hostname="h", boundaries=0),
        edges=Edges(barrier=lambda name: fake.events.append(f"barrier {name}"),
                    read_link=fake.read_link,
                    signal=lambda edge: fake.events.append(f"signal {edge}"),
                    read_loss=fake.read_loss),
        collectives=fake, clock=fake.clock)


def test_steps_between_boundaries_the_window_at_its_edges_and_a_stop(tmp_path) -> None:
    fake = Fake()
    rec = recorder(tmp_path, fake)
    optimizer = object()
    for now in (1.0, 2.0, 2.5, 3.5):  # warm-up ends at the 2nd step (t=2.0)
        fake.now = now
        rec.optimizer_stepped(optimizer)
    assert fake.events == ["barrier v/start", "signal start"]
    fake.now = 6.0
    with pytest.raises(MeasuredEnough):  # the 5th step closes the window: stop
        rec.optimizer_stepped(optimizer)
    assert fake.events[2:] == ["barrier v/end", "signal end"]
    saved = json.loads(record_path(tmp_path, 0).read_text())
    assert saved["step_s"] == pytest.approx([0.5, 1.0, 2.5])
    assert saved["hook_bytes"] == [10, 10, 10]
    # one read per boundary inside the window, between the two edge marks
    assert saved["step_link_bytes"] == [1000, 1000, 1000]
    # the node's TCP losses per step: none in the step ending at 2.5 s, 4 in each later one
    assert saved["step_tcp_loss"] == [{}, {"RetransSegs": 4}, {"RetransSegs": 4}]
    assert [m["sent_bytes"] for m in saved["link_marks"]] == [1000, 5000]
    assert saved["ddp_models"] == 1 and saved["optimizers"] == ["object"]


def test_finish_lets_the_script_run_on_after_the_window(tmp_path) -> None:
    fake = Fake()
    rec = recorder(tmp_path, fake, warmup=1, iterations=1, after="finish")
    for _ in range(5):
        rec.optimizer_stepped(rec)
    rec.finish()  # enough steps: no error
    assert len(rec.record.step_s) == 1 and rec.record.boundaries == 5


def test_a_script_that_never_steps_is_told_what_was_looked_for(tmp_path) -> None:
    with pytest.raises(StepError, match=r"made no step.*optimizer\.step\(\).*netsim_ddp\.step"):
        recorder(tmp_path, Fake(), steps="auto").finish()


def test_a_script_that_ends_early_says_how_many_steps_it_made(tmp_path) -> None:
    rec = recorder(tmp_path, Fake())
    for _ in range(3):
        rec.optimizer_stepped(rec)
    with pytest.raises(StepError, match=r"ended after 3 steps.*2 warm-up \+ 3 steps = 5"):
        rec.finish()


def test_two_optimizers_need_the_marker(tmp_path) -> None:
    rec = recorder(tmp_path, Fake())
    rec.optimizer_stepped(rec)
    with pytest.raises(StepError, match=r"2 optimizers \(StepRecorder, Fake\).*netsim_ddp"):
        rec.optimizer_stepped(Fake())


def test_auto_takes_the_marker_when_it_comes_in_the_warm_up(tmp_path) -> None:
    fake = Fake()
    rec = recorder(tmp_path, fake, warmup=3, iterations=1, steps="auto")
    first, second = object(), Fake()
    rec.optimizer_stepped(first)
    rec.optimizer_stepped(second)  # two optimizers, but the window is not opening yet
    rec.marked()  # the script marks its steps: from now on only the marker counts
    assert rec.record.steps == "marker" and rec.record.boundaries == 1
    rec.optimizer_stepped(first)
    rec.optimizer_stepped(second)
    assert rec.record.boundaries == 1
    rec.marked()
    rec.marked()
    assert fake.events == ["barrier v/start", "signal start"]


def test_optimizers_are_recorded_when_markers_end_the_steps(tmp_path) -> None:
    """Under steps = "marker" optimizer steps end nothing, but the record still names every
    optimizer that stepped (the results' script.optimizers), in the order they first did."""
    fake = Fake()
    rec = recorder(tmp_path, fake, warmup=1, iterations=2, steps="marker")
    first, second = object(), Fake()
    with pytest.raises(MeasuredEnough):
        for _ in range(3):
            rec.optimizer_stepped(first)
            rec.optimizer_stepped(second)  # two optimizers: fine, the marker ends steps
            rec.marked()
    assert rec.record.boundaries == 3  # the markers' steps only
    saved = json.loads(record_path(tmp_path, 0).read_text())
    assert saved["steps"] == "marker" and saved["optimizers"] == ["object", "Fake"]


def test_a_marker_after_the_window_opened_on_optimizer_steps_is_refused(tmp_path) -> None:
    rec = recorder(tmp_path, Fake(), warmup=1, steps="auto")
    rec.optimizer_stepped(rec)  # opens the window at warm-up step 1
    with pytest.raises(StepError, match=r'set \[workload\] steps = "marker"'):
        rec.marked()


def test_an_explicit_optimizer_setting_refuses_the_marker(tmp_path) -> None:
    with pytest.raises(StepError, match="calls netsim_ddp.step"):
        recorder(tmp_path, Fake()).marked()


def test_the_marker_does_nothing_outside_netsim_ddp() -> None:
    import netsim_ddp

    netsim_ddp.step()  # no recorder installed: a script keeps its call


def records(ddp_models: int) -> list[ScriptRankRecord]:
    return [ScriptRankRecord(rank=rank, local_rank=0, hostname=f"n{rank}", boundaries=4,
                             step_s=[0.2, 0.3], started_monotonic=[1.0, 1.2],
                             hook_bytes=[400 * ddp_models] * 2, step_link_bytes=[10, 30],
                             ddp_models=ddp_models, optimizers=["SGD"],
                             bucket_intervals=[[(0.0, 0.1)], [(0.05, 0.2)]] if ddp_models
                             else None,
                             link_marks=[{"monotonic_s": 1.0, "sent_bytes": 0,
                                          "sent_packets": 0},
                                         {"monotonic_s": 1.5, "sent_bytes": 40,
                                          "sent_packets": 1}])
            for rank in range(2)]


def combined(ddp_models: int):
    from netsim_ddp.scenario.workload import WorkloadConfig
    from netsim_ddp.workload.launcher.script_launch import combine_script

    workload = WorkloadConfig.model_validate({"command": ["t.py"], "iterations": 2})
    return combine_script(records(ddp_models), run="script", command=["t.py"],
                          variant_args=[], variant_env={}, workload=workload,
                          local_world_size=1, socket_ifname="eth0")


def test_ranks_fold_into_one_result_with_no_compute_and_summed_step_bytes() -> None:
    result = combined(ddp_models=1)
    assert result.iteration_s == [0.2, 0.3] and result.compute_s == result.comm_s == []
    assert result.sent_bytes_per_iteration == 400
    assert result.script is not None and result.script.step_wire_bytes == [20, 60]


def test_a_script_whose_ranks_exchange_nothing_fails_its_measured_check() -> None:
    from netsim_ddp.measure.mode_report import ModeReport
    from netsim_ddp.verdicts.run_checks import measurement_checks

    quiet = ModeReport(combined(ddp_models=0), 0.0, 0.0, 1e9)
    (check,) = measurement_checks({"script": quiet}, nodes=2)
    assert not check.passed and "do not exchange gradients" in check.detail
    assert quiet.scaling_efficiency is None and quiet.to_record().summary.comm_s is None
    busy = ModeReport(combined(ddp_models=1), 4e6, 0.0, 1e9)
    assert measurement_checks({"script": busy}, nodes=2) == []


def test_a_script_run_reads_back_exports_tables_and_gates(tmp_path) -> None:
    """What a script's run leaves out (comm, compute, efficiency) is left out everywhere that
    reads results: the document, its exports, the table, the baseline, the history."""
    from rich.console import Console

    from netsim_ddp.measure.document import load_document, save
    from netsim_ddp.measure.mode_report import ModeReport
    from netsim_ddp.report.ci import bencher_metrics, github_benchmark, run_summary
    from netsim_ddp.report.tables import mode_table
    from netsim_ddp.scenario.spec import Scenario
    from netsim_ddp.verdicts import baseline
    from netsim_ddp.verdicts.gate import Tolerance
    from netsim_ddp.verdicts.history import Run, judge_history, parse_metrics
    from netsim_ddp.verdicts.scenario_report import ScenarioReport, results_document

    scenario = Scenario.from_dict({"name": "s", "topology": {"nodes": 2},
                                   "link": {"rate": "1gbit"},
                                   "workload": {"command": ["t.py"], "iterations": 2}})
    report = ScenarioReport(scenario)
    report.modes["script"] = ModeReport(combined(ddp_models=1), 4e6, 0.0, 1e9)
    path = save(results_document([report]), tmp_path / "results.json")
    document = load_document(path)
    record = document.scenarios[0].modes["script"]
    assert record.comm_s == [] and record.summary.comm_s is None
    assert record.script is not None and record.script.step_wire_bytes == [20, 60]
    names = {entry["name"] for entry in github_benchmark(document)}
    assert names == {"s[script] iteration_s.median", "s[script] wire_bytes_per_iteration",
                     "s[script] collective_s.median"}
    assert "scaling_efficiency-median-ratio" not in bencher_metrics(document)["s[script]"]
    assert "| s | passed | script | 250.0 | - | - | 4.00 |" in run_summary(document)
    console = Console(width=200, record=True)
    console.print(mode_table(report))
    assert "script t.py" in console.export_text()
    baseline.save([report], tmp_path / "baseline.json")
    saved = baseline.Baseline(tmp_path / "baseline.json")
    verdicts = saved.compare(report, [Tolerance.parse("median:10%")], 0.05)
    assert [v.passed for v in verdicts] == [True]
    with pytest.raises(baseline.BaselineError, match="comm_s was not measured"):
        saved.compare(report, [Tolerance.parse("comm_s.median:10%")], 0.05)
    metrics, tolerances = parse_metrics([], [])
    history = judge_history([Run(1, str(path), document)], metrics, tolerances)
    assert {str(h.metric) for h in history.metrics} == {"iteration_s.median",
                                                        "wire_bytes_per_iteration"}
