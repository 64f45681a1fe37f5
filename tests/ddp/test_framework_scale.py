"""Framework scripts as their users write them, unmodified, in scale models (examples/): an
Accelerate script and a PyTorch Lightning script (DDPStrategy with fp16_compress_hook), 2
nodes x 2 ranks on 10GbE, time-dilated, compute replayed: trusted, DDP's buckets their models'
gradients, the wire bytes their ring's; Lightning's CUDA-only comm hook registered in the scale
model and reported as missing in a real-time run.

CI installs `netsim-ddp[examples]` (accelerate, pytorch-lightning); elsewhere these skip
without them, and fail under NETSIM_DDP_REQUIRE_FABRIC rather than skip."""

from __future__ import annotations

import importlib.util
import json
from pathlib import Path

import pytest

pytestmark = [pytest.mark.netns, pytest.mark.ddp, pytest.mark.usefixtures("needs_fabric")]

ROOT = Path(__file__).resolve().parents[2]
PARAMS = 4 * (1024 * 1024 + 1024) + 1024 * 10 + 10  # the examples' MLP: 4.2M parameters
# DDP's fp32 ring all-reduce over 4 ranks, 2 per node: two of its four hops cross the links.
RING_BYTES = 2 * 2 * 3 / 4 * 4 * PARAMS


@pytest.fixture
def installed(lacks_fabric):
    def need(module: str) -> None:
        if importlib.util.find_spec(module) is None:
            lacks_fabric(f"{module} is not installed (pip install 'netsim-ddp[examples]')")
    return need


def _launch(run_cli, tmp_path: Path, scenario_file: Path, *command: object) -> dict:
    results = tmp_path / "results.json"
    done = run_cli("launch", scenario_file, "--iterations", "3", "--json", results, "--out",
                   tmp_path / "out", *command, timeout=400)
    assert results.exists(), done.stdout + done.stderr
    (scenario,) = json.loads(results.read_text())["scenarios"]
    scenario["returncode"], scenario["output"] = done.returncode, done.stdout + done.stderr
    return scenario


def test_an_accelerate_script_runs_in_a_scale_model(tmp_path, run_cli, installed):
    installed("accelerate")
    scenario = _launch(run_cli, tmp_path, ROOT / "examples" / "accelerate" / "scenario.toml")
    assert scenario["returncode"] == 0, scenario["output"]
    mode = scenario["modes"]["script"]
    assert scenario["emulation"]["compute_source"] == "replay"
    assert mode["script"]["optimizers"] == ["AdamW"] and mode["script"]["ddp_models"] == 1
    assert mode["hook_bytes_per_iteration"] == 4 * PARAMS
    assert RING_BYTES <= mode["wire_bytes_per_iteration"] <= RING_BYTES * 1.1


def test_a_lightning_script_gets_its_cuda_only_comm_hook_in_a_scale_model(
        tmp_path, run_cli, installed):
    installed("pytorch_lightning")
    scenario = _launch(run_cli, tmp_path, ROOT / "examples" / "lightning" / "scenario.toml")
    assert scenario["returncode"] == 0, scenario["output"]
    hooked, plain = scenario["modes"]["fp16-hook"], scenario["modes"]["no-hook"]
    assert hooked["script"]["comm_hooks"] == ["fp16_compress_hook"]
    assert hooked["hook_bytes_per_iteration"] == plain["hook_bytes_per_iteration"] == 4 * PARAMS
    assert RING_BYTES <= plain["wire_bytes_per_iteration"] <= RING_BYTES * 1.1
    ratio = hooked["wire_bytes_per_iteration"] / plain["wire_bytes_per_iteration"]
    assert 0.48 <= ratio <= 0.52, ratio  # the fp16 hook is what the target's GPUs run
    framework = [c for c in scenario["checks"] if c["name"] == "framework:fp16-hook"]
    assert framework and framework[0]["passed"] and "as CUDA would" in framework[0]["detail"]


def test_a_lightning_script_in_real_time_is_told_its_hook_did_not_run(
        tmp_path, run_cli, installed):
    installed("pytorch_lightning")
    scenario = _launch(run_cli, tmp_path, ROOT / "scenarios" / "default.toml", "--",
                       ROOT / "examples" / "lightning" / "train.py", "--steps", "8",
                       "--width", "256", "--layers", "2", "--num-nodes", "2")
    assert scenario["returncode"] != 0
    (check,) = [c for c in scenario["checks"] if c["name"] == "framework:script"]
    assert not check["passed"] and "fp16_compress_hook" in check["detail"]
    assert "DDP's comm hooks: none" in check["detail"]  # the witness: no hook, fp32 bytes
