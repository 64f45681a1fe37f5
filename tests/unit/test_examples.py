"""The shipped examples' scenario files stay valid as the schema changes (they are not under
scenarios/, so no pytest item loads them)."""

from __future__ import annotations

from pathlib import Path

import pytest

from netsim_ddp import Scenario

EXAMPLES = sorted((Path(__file__).resolve().parents[2] / "examples").glob("*/scenario.toml"))


@pytest.mark.parametrize("path", EXAMPLES, ids=lambda path: path.parent.name)
def test_an_example_scenario_loads_and_runs_a_script(path):
    scenario = Scenario.load(path)
    assert scenario.workload.command, f"{path}: an example runs a public script"


def test_the_trl_example_runs_trls_module_with_both_variants():
    (path,) = [path for path in EXAMPLES if path.parent.name == "trl-sft"]
    workload = Scenario.load(path).workload
    assert workload.command is not None and workload.command[:2] == ["-m", "trl.scripts.sft"]
    assert workload.modes == ["fp32", "bf16"]
