"""A public training script nobody here wrote, unmodified: Hugging Face TRL's SFT script
(`python -m trl.scripts.sft`, shipped in the `trl` wheel; examples/trl-sft), through the
issue's own command, `netsim-ddp launch scenarios/default.toml -- SCRIPT ARGS`. transformers'
Trainer wraps the model in DDP (gloo on the CPU) under torchrun; the harness counts its AdamW
steps and times and counts the all-reduce of its gradients.

CI installs `netsim-ddp[examples]` (trl); elsewhere the test skips without it, and fails under
NETSIM_DDP_REQUIRE_FABRIC (CI's switch) rather than skip."""

from __future__ import annotations

import importlib.util
import json
import subprocess
import sys
from pathlib import Path

import pytest

pytestmark = [pytest.mark.netns, pytest.mark.ddp, pytest.mark.usefixtures("needs_fabric")]

ROOT = Path(__file__).resolve().parents[2]
MAKE_ASSETS = ROOT / "examples" / "trl-sft" / "make_assets.py"


@pytest.fixture
def trl_installed(lacks_fabric):
    if importlib.util.find_spec("trl") is None:
        lacks_fabric("trl is not installed (pip install 'netsim-ddp[examples]')")


def test_trls_sft_script_runs_unmodified_and_its_ddp_is_measured(
        tmp_path, run_cli, monkeypatch, trl_installed):
    assets = tmp_path / "assets"
    made = subprocess.run([sys.executable, MAKE_ASSETS, assets, "--hidden", "128",
                           "--layers", "2", "--rows", "200"], capture_output=True, text=True)
    assert made.returncode == 0, made.stderr
    monkeypatch.setenv("HF_HUB_OFFLINE", "1")  # a local model and dataset: no hub
    results = tmp_path / "results.json"
    done = run_cli(
        "launch", ROOT / "scenarios" / "default.toml", "--iterations", "3",
        "--json", results, "--out", tmp_path / "out", "--",
        "-m", "trl.scripts.sft", "--model_name_or_path", assets / "model",
        "--dataset_name", assets / "data", "--output_dir", tmp_path / "sft",
        "--max_steps", "8", "--per_device_train_batch_size", "4", "--max_length", "32",
        "--report_to", "none", "--save_strategy", "no", "--use_cpu", "--bf16", "false",
        timeout=300)
    assert done.returncode == 0, done.stdout + done.stderr[-3000:]
    table = done.stdout.splitlines()
    assert any(line.split()[:1] == ["script"] for line in table), done.stdout
    (scenario,) = json.loads(results.read_text())["scenarios"]
    (mode,) = scenario["modes"].values()
    script = mode["script"]
    assert len(mode["iteration_s"]) == 3
    assert script["optimizers"] == ["AdamW"] and script["ddp_models"] == 1, script
    # DDP handed its comm hook every fp32 gradient once per step ...
    assert mode["hook_bytes_per_iteration"] == 4 * mode["params"] > 0
    # ... and two nodes' ring all-reduce sends each node's full gradient once: 2 x, plus the
    # headers of the packets and the store's few hundred bytes.
    ratio = mode["wire_bytes_per_iteration"] / mode["hook_bytes_per_iteration"]
    assert 1.95 < ratio < 2.3, ratio
    assert all(check["passed"] for check in scenario["checks"]), scenario["checks"]
