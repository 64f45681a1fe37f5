"""The report's timeline and checks list, from a synthetic results document (no run)."""

import json

from rich.console import Console

from netsim_ddp import Scenario
from netsim_ddp.measure.document import parse_document
from netsim_ddp.measure.mode_report import ModeReport
from netsim_ddp.report.figures import fit_title
from netsim_ddp.report.plots import report
from netsim_ddp.report.tables import mode_table, straggler_cell
from netsim_ddp.report.timeline import check_rows
from netsim_ddp.verdicts.scenario_report import ScenarioReport
from netsim_ddp.workload.contract.mode_result import ModeResult, Straggler

SCENARIO = {"name": "timeline", "topology": {"nodes": 2}, "link": {"rate": "1gbit"},
            "background": [{"source": "n0", "destination": "n1", "on": "100ms", "off": "100ms",
                            "seed": 3}],
            "workload": {"params": "1M", "modes": ["fp32", "amp-fp16"]}}


def mode_report(name, collective):
    n = 6
    result = ModeResult.model_construct(
        mode=name, iteration_s=[0.3] * n, compute_s=[0.1] * n, comm_s=[0.2] * n,
        collective_s=[collective] * n, bucket_s=[[collective]] * n,
        stragglers=[Straggler(rank=1, wait_s=0.01)] * 4 + [Straggler(rank=0, wait_s=0.02)] * 2,
        started_monotonic=[100 + 0.35 * i for i in range(n)], sent_bytes_per_iteration=1000,
        world_size=2, iterations=n, params=250, ranks=[], profiler_allreduce_s=None,
        batch_size=4, grad_accumulation=1)
    return ModeReport(result, 1000.0, 0.0, 1e9, node_names=["n0", "n1"])


def document():
    scenario = ScenarioReport(Scenario.from_dict(SCENARIO))
    scenario.modes = {"fp32": mode_report("fp32", 0.2), "amp-fp16": mode_report("amp-fp16", 0.1)}
    entry = scenario.to_record().dump()
    entry["checks"] = [
        {"name": "a-passing-check", "passed": True, "detail": "fine", "p_value": 0.001},
        {"name": "a-failing-check", "passed": False, "detail": "1.2x", "p_value": 0.31},
        {"name": "an-exact-check", "passed": True, "detail": "exact", "p_value": None}]
    entry["link_schedule"] = [{"mode": "fp32", "start_monotonic": 100.0, "end_monotonic": 102,
                               "changes": [{"mode": "fp32", "label": "n1 rate 250Mbit/s",
                                            "at_s": 1.0, "offset_s": 1.001,
                                            "monotonic_s": 101.001}]}]
    return scenario, {"netsim_ddp": "test", "scenarios": [entry], "sweeps": []}


def test_checks_are_listed_failures_first_with_p_values():
    _, doc = document()
    rows = check_rows(parse_document(doc).scenarios[0])
    assert [row[0] for row in rows] == ["FAILED", "ok", "ok"]
    assert rows[0][1:3] == ["a-failing-check", "0.31"]
    assert rows[2][2] == "-"


def test_report_has_the_timeline_and_the_checks(tmp_path):
    _, doc = document()
    path = tmp_path / "results.json"
    path.write_text(json.dumps(doc))
    markdown = report(path, tmp_path / "out").read_text()
    assert (tmp_path / "out" / "timeline-timeline.png").stat().st_size > 10_000
    assert "timeline-timeline.png" in markdown
    failed, passed = markdown.index("| FAILED | a-failing-check"), markdown.index("| ok |")
    assert failed < passed
    assert "n1 4/6 +10.0ms" in markdown  # the straggler column


def test_the_run_table_shows_collective_time_and_the_straggler():
    scenario, _ = document()
    console = Console(width=200, record=True)
    console.print(mode_table(scenario))
    text = console.export_text()
    assert "coll ms" in text and "straggler" in text and "n1 4/6 +10.0ms" in text
    assert straggler_cell(None) == "-"


def test_long_titles_are_wrapped():
    title = fit_title("x" * 30 + " " + "y" * 40, 60)
    assert title.count("\n") == 1 and max(len(line) for line in title.splitlines()) <= 60
