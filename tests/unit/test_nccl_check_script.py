"""bench/nccl_check.sh picks a Python that can import torch (no GPU needed for this part)."""

import os
import subprocess
import sys
from pathlib import Path

import pytest

SCRIPT = Path(__file__).resolve().parents[2] / "bench" / "nccl_check.sh"


@pytest.mark.skipif(sys.prefix == sys.base_prefix, reason="needs a Python that is a venv")
def test_a_python_that_is_itself_a_venv_gets_a_folder_not_a_venv_without_its_torch(tmp_path):
    """--system-site-packages gives a new venv the *base* interpreter's packages: made from a
    venv's python, it has no torch, and every later step would stop for a false reason."""
    pytest.importorskip("torch")
    wheels = tmp_path / "wheels"
    wheels.mkdir()
    (wheels / "netsim_ddp-0.0.0-py3-none-any.whl").write_bytes(b"")  # found, never installed
    env = os.environ | {"PYTHON": sys.executable, "NSD_VENV": str(tmp_path / "venv"),
                        "NSD_SITE": str(tmp_path / "site"), "NSD_OUT": str(tmp_path / "out"),
                        "NSD_SETUP_ONLY": "1"}
    done = subprocess.run(["bash", str(SCRIPT), str(wheels)], env=env, capture_output=True,
                          text=True, timeout=300)
    assert done.returncode == 0, done.stdout + done.stderr
    assert "would not see" in done.stdout
    assert f"would use {sys.executable} --target {tmp_path / 'site'}" in done.stdout
    assert not (tmp_path / "venv").exists()
