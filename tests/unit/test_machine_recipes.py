"""The scheduler recipes in docs/scale-across-machines.md: every option they pass is one the
`machine` command has, each machine gets the scheduler's own index, and the pod may make
namespaces."""

import re
from pathlib import Path

import pytest

from netsim_ddp.cli.app import main

DOC = (Path(__file__).resolve().parents[2] / "docs" / "scale-across-machines.md").read_text()
OPTIONS = {opt for param in main.commands["machine"].params for opt in param.opts}


def recipe(language: str, containing: str) -> str:
    (found,) = [b for b in re.findall(rf"^```{language}\n(.*?)^```", DOC, re.S | re.M)
                if containing in b]
    return found


@pytest.mark.parametrize(("language", "containing", "index"), [
    ("bash", "#SBATCH", '"$SLURM_PROCID"'),
    ("yaml", "kind: Job", '"$JOB_COMPLETION_INDEX"'),
])
def test_a_recipe_passes_only_the_commands_options_and_the_schedulers_index(
        language, containing, index):
    text = recipe(language, containing)
    command = text[text.index("netsim-ddp machine"):]
    assert set(re.findall(r"(?<![\w-])--[a-z][a-z-]+", command)) <= OPTIONS
    assert f"--machine-rank {index}" in command.replace("\n", " ")
    assert "--machines" in command and "--nic" in command


def test_the_job_is_indexed_and_its_pods_may_make_namespaces():
    job = recipe("yaml", "kind: Job")
    assert "completionMode: Indexed" in job
    assert 'capabilities: {add: ["NET_ADMIN", "SYS_ADMIN"]}' in job
