"""`run` records a broken scenario as an error and goes on with the next (issue 9, item 11).

The failure is real, not a mock: the scenario's folder under --out is a regular file, so the
run breaks inside the built fabric with the OS's own error (not a FabricError or WorkloadError,
which were the only ones recorded before; anything else ended the command with a traceback and
lost the results of the scenarios already run).
"""

import json

import pytest

from netsim_ddp import Scenario
from netsim_ddp.run.session import NetsimSession

pytestmark = [pytest.mark.netns, pytest.mark.usefixtures("needs_fabric")]

SCENARIO = """name = "{name}"
[topology]
nodes = 2
[link]
rate = "500mbit"
[fidelity]
enabled = false
[workload]
params = "200k"
iterations = 2
warmup = 1
batch_size = 4
modes = ["fp32"]
"""


def test_session_records_any_failure_as_the_scenarios_error(tmp_path):
    scenario = Scenario.from_dict({"name": "blocked", "topology": {"nodes": 2},
                                   "link": {"rate": "500mbit"}, "fidelity": {"enabled": False},
                                   "workload": {"params": "200k", "modes": ["fp32"]}})
    out = tmp_path / "out"
    out.mkdir()
    (out / "blocked").write_text("a file where the run's folder goes")
    session = NetsimSession.create(out_dir=out)
    report = session.run(scenario)
    assert report.status == "error"
    assert report.error and "Error" in report.error.split(":")[0], report.error
    assert session.reports == [report]


@pytest.mark.ddp
def test_run_goes_on_after_a_broken_scenario_and_keeps_its_json(tmp_path, run_cli):
    for name in ("blocked", "fine"):
        (tmp_path / f"{name}.toml").write_text(SCENARIO.format(name=name))
    out = tmp_path / "out"
    out.mkdir()
    (out / "blocked").write_text("a file where the run's folder goes")
    results = tmp_path / "results.json"
    done = run_cli("run", tmp_path / "blocked.toml", tmp_path / "fine.toml", "--out", out,
                   "--json", results, timeout=240)
    assert done.returncode == 1, done.stderr  # a scenario broke: not a pass
    assert "Traceback" not in done.stderr
    entries = {entry["name"]: entry for entry in json.loads(results.read_text())["scenarios"]}
    assert entries["blocked"]["status"] == "error" and entries["blocked"]["error"]
    assert entries["fine"]["status"] == "passed", entries["fine"]
    assert entries["fine"]["modes"]["fp32"]["iteration_s"]
