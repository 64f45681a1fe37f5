"""--netsim-history (the session the plugin and CLI share): each run is added to the folder and
judged against it; the verdict is a check like the others. Runs are synthetic: no training."""

from __future__ import annotations

import random

import pytest

from netsim_ddp import Scenario
from netsim_ddp.measure.mode_report import ModeReport
from netsim_ddp.run.session import NetsimSession, SessionOptionError
from netsim_ddp.verdicts.history import DEFAULT_TOLERANCE
from netsim_ddp.verdicts.scenario_report import ScenarioReport
from netsim_ddp.workload.contract.mode_result import ModeResult

SCENARIO = Scenario.from_dict({"name": "hist", "topology": {"nodes": 2},
                               "link": {"rate": "1gbit"},
                               "workload": {"params": "1M", "modes": ["fp32"]}})


def fake_run(comm: float, seed: int):
    """A runner that trains nothing: fp32 with `comm` seconds of exposed communication."""
    def run(scenario, **_options) -> ScenarioReport:
        draw = random.Random(seed)
        compute_s = [0.1 + draw.gauss(0, 0.002) for _ in range(20)]
        comm_s = [comm + draw.gauss(0, 0.005) for _ in range(20)]
        result = ModeResult.model_construct(
            mode="fp32", iteration_s=[c + m for c, m in zip(compute_s, comm_s, strict=True)],
            compute_s=compute_s, comm_s=comm_s, sent_bytes_per_iteration=4_000_000,
            world_size=2, iterations=20, params=1_000_000, ranks=[], profiler_allreduce_s=None,
            batch_size=4, grad_accumulation=1)
        report = ScenarioReport(scenario)
        report.modes = {"fp32": ModeReport(result, 8e6, 0.0, 1e9)}
        return report
    return run


def test_each_run_joins_the_history_and_a_slower_one_fails_its_history_check(
        tmp_path, monkeypatch):
    summary = tmp_path / "summary.md"
    monkeypatch.setenv("GITHUB_STEP_SUMMARY", str(summary))
    folder = tmp_path / "history"
    reports = []
    for number, comm in enumerate([0.5, 0.5, 0.5, 0.56]):
        session = NetsimSession.create(history_dir=folder)
        reports.append(session.run(SCENARIO, runner=fake_run(comm, number)))
        session.finish()
    assert len(list(folder.glob("*.json"))) == 4
    history = [[c for c in r.checks if c.name.startswith("history")] for r in reports]
    assert history[0] == []  # nothing before
    names = [c.name for c in history[3]]
    assert len(names) >= 3 and [[c.name for c in h] for h in history[1:3]] == [names, names]
    assert all(c.passed for h in history[1:3] for c in h)
    failed = [c for c in reports[3].checks if not c.passed]
    assert [c.name for c in failed] == ["history:fp32:iteration_s.median",
                                        "history:fp32:comm_s.median",
                                        "history:fp32:scaling_efficiency.median"]
    assert "best level (runs 1-3)" in failed[0].detail
    assert f"+{DEFAULT_TOLERANCE:.0%}" in failed[0].detail
    text = summary.read_text()
    assert text.count("## netsim-ddp results") == 4 and "**REGRESSION**" in text


def test_history_tolerances_are_checked_before_any_run(tmp_path):
    with pytest.raises(SessionOptionError, match="unknown metric"):
        NetsimSession.create(history_dir=tmp_path, tolerances=["speed:5%"])
    session = NetsimSession.create(history_dir=tmp_path, tolerances=["median:20%"])
    for number, comm in enumerate([0.5, 0.5, 0.5, 0.56]):
        report = session.run(SCENARIO, runner=fake_run(comm, number))
    iteration = next(c for c in report.checks if c.name == "history:fp32:iteration_s.median")
    assert iteration.passed and "+20%" in iteration.detail


def test_history_is_an_option_of_run_and_of_pytest(request):
    from click.testing import CliRunner

    from netsim_ddp.cli import main

    assert request.config.getoption("netsim_history") is None  # registered, not given
    assert "--history DIR" in CliRunner().invoke(main, ["run", "--help"]).output
