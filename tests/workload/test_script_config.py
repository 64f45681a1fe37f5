"""[workload] command and [[workload.variant]]: what a scenario may say about a user's script,
and the errors that name the field and the fix."""

from __future__ import annotations

import pytest

from netsim_ddp.scenario.spec import Scenario, ScenarioError

BASE = {"name": "s", "topology": {"nodes": 2}, "link": {"rate": "1gbit"}}


def scenario(workload: dict, **extra) -> Scenario:
    return Scenario.from_dict({**BASE, "workload": workload, **extra}, "s.toml")


def test_variants_stand_where_modes_stand() -> None:
    s = scenario({"command": ["train.py", "--epochs", "1"],
                  "variant": [{"name": "fp32"}, {"name": "amp", "args": ["--amp"],
                                                 "env": {"X": "1"}}]},
                 expect=[{"metric": "wire_bytes_per_iteration", "mode": "amp", "vs": "fp32",
                          "max_ratio": 0.55}])
    assert s.workload is not None and s.workload.modes == ["fp32", "amp"]
    assert s.workload.variant_named("amp").env == {"X": "1"}
    assert scenario({"command": ["-m", "pkg.train"]}).workload.modes == ["script"]


@pytest.mark.parametrize(("workload", "extra", "field", "words"), [
    ({"command": ["t.py"], "modes": ["fp32"]}, {}, "workload", "variant"),
    ({"command": ["t.py"], "batch_size": 4}, {}, "workload", "batch_size"),
    ({"command": ["t.py"], "warmup": 0}, {}, "workload", "warmup >= 1"),
    ({"command": ["-m"]}, {}, "workload", "module name"),
    ({"command": ["t.py"], "variant": [{"name": "a"}, {"name": "a"}]}, {}, "workload", "twice"),
    ({"command": ["t.py"], "variant": [{"name": "Big Name"}]}, {}, "workload.variant.0.name",
     "a-z"),
    ({"params": "1M", "variant": [{"name": "a"}]}, {}, "workload", "set command"),
    ({"params": "1M", "steps": "marker"}, {}, "workload", "set command"),
    ({"command": ["t.py"]}, {"expect": [{"metric": "comm_s.median", "mode": "script",
                                         "max": 1.0}]}, "expect.0.metric", "compute-only"),
    ({"command": ["t.py"]}, {"expect": [{"metric": "iteration_s", "mode": "fp32",
                                         "max": 1.0}]}, "expect.0.mode", "not run"),
])
def test_bad_script_workloads_name_the_field(workload, extra, field, words) -> None:
    with pytest.raises(ScenarioError) as excinfo:
        scenario(workload, **extra)
    assert excinfo.value.field == field
    assert words in str(excinfo.value)


def test_launch_turns_a_loop_scenario_into_a_script_one() -> None:
    loop = Scenario.from_dict({**BASE, "workload": {"params": "1M", "warmup": 0,
                                                    "iterations": 5, "modes": ["fp32"]}})
    script = loop.with_command(["/abs/train.py", "--x"], steps="marker")
    workload = script.workload
    assert workload is not None and workload.command == ["/abs/train.py", "--x"]
    assert (workload.iterations, workload.warmup, workload.steps) == (5, 1, "marker")
    assert workload.modes == ["script"]


def test_the_shipped_example_scenario_loads() -> None:
    from pathlib import Path

    path = Path(__file__).resolve().parents[2] / "examples" / "imagenet" / "scenario.toml"
    workload = Scenario.load(path).workload
    assert workload is not None and workload.command is not None
    assert workload.command[0] == "main.py" and "--dummy" in workload.command


def test_launch_refuses_a_missing_script_or_command_before_building(tmp_path) -> None:
    from pathlib import Path

    from click.testing import CliRunner

    from netsim_ddp.cli import main

    default = str(Path(__file__).resolve().parents[2] / "scenarios" / "default.toml")
    runner = CliRunner()
    missing = runner.invoke(main, ["launch", default, "--", str(tmp_path / "nope.py")])
    assert missing.exit_code == 2 and "no script" in missing.output
    no_command = runner.invoke(main, ["launch", default])
    assert no_command.exit_code == 2 and "no command" in no_command.output
    host = tmp_path / "s.toml"
    host.write_text('[topology]\nnodes = 2\n[link]\nrate = "1gbit"\n'
                    '[workload]\ncommand = ["t.py"]\n')
    refused = runner.invoke(main, ["host", str(host), "--node-rank", "0", "--nnodes", "2",
                                   "--master-addr", "127.0.0.1", "--master-port", "1",
                                   "--nic", "lo"])
    assert refused.exit_code == 2 and "netsim-ddp launch" in refused.output
