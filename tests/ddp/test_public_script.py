"""pytorch/examples' ImageNet trainer (examples/imagenet), unmodified, through `netsim-ddp
launch`, where the script and a working torchvision are there (examples/imagenet/README.md)."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

import pytest

pytestmark = [pytest.mark.netns, pytest.mark.ddp, pytest.mark.usefixtures("needs_fabric")]

EXAMPLE = Path(__file__).resolve().parents[2] / "examples" / "imagenet"


def torchvision_problem() -> str | None:
    done = subprocess.run([sys.executable, "-c", "import torchvision.models"],
                          capture_output=True, text=True)
    lines = done.stderr.strip().splitlines()
    return None if done.returncode == 0 else (lines[-1] if lines else "import failed")


def test_the_imagenet_trainer_runs_unmodified_and_is_measured(tmp_path, run_cli):
    if not (EXAMPLE / "main.py").exists():
        pytest.skip(f"{EXAMPLE / 'main.py'} is not there: pytorch/examples' imagenet/main.py "
                    "is not shipped (see examples/imagenet/README.md)")
    if problem := torchvision_problem():
        pytest.skip(f"torchvision does not import with this torch: {problem}")
    results = tmp_path / "results.json"
    done = run_cli("launch", EXAMPLE / "scenario.toml", "--iterations", "3", "--json", results,
                   "--out", tmp_path / "out", timeout=600)
    assert "imagenet-resnet18" in done.stdout, done.stdout + done.stderr
    (scenario,) = json.loads(results.read_text())["scenarios"]
    (mode,) = scenario["modes"].values()
    assert len(mode["iteration_s"]) == 3 and mode["script"]["optimizers"] == ["SGD"]
    # On CPU the script trains without DDP; with one it all-reduces ResNet-18's gradients.
    checks = {check["name"]: check["passed"] for check in scenario["checks"]}
    if mode["script"]["ddp_models"] == 0:
        assert checks.get("measured:script") is False and done.returncode == 1
    else:
        assert mode["hook_bytes_per_iteration"] > 40e6 and done.returncode == 0
