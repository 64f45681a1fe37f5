"""A user's unmodified script in a scale model (`netsim-ddp launch SCALE.toml -- train.py`):
10GbE time-dilated x40, the module the script hands to DDP replayed at the target's compute,
every byte real. Small (2 nodes x 2 ranks, the 1.05M-parameter tests/scripts/tiny_train.py):
trusted, wire bytes matching its gradients, the same as the built-in loop's replay of the same
model (issue 32 item 4), and a release adding 10% more bytes flagged by the baseline gate."""

from __future__ import annotations

import json
import statistics
from pathlib import Path

import pytest

from netsim_ddp import Scenario
from netsim_ddp.run.runner import run_scenario

pytestmark = [pytest.mark.netns, pytest.mark.ddp, pytest.mark.usefixtures("needs_fabric")]

ROOT = Path(__file__).resolve().parents[2]
SCRIPT = ROOT / "tests" / "scripts" / "tiny_train.py"
SMALL = ["--width", "512", "--layers", "4", "--steps", "8"]  # 1.05M parameters
PARAMS = 1_050_624
# A ring all-reduce over 4 ranks, 2 per node: each rank sends 2 x 3/4 of the 4.2 MB, and two
# of the ring's four hops cross the links; plus TCP/IP/Ethernet headers (1448 of 1514: +4.6%).
RING_BYTES = 2 * 2 * 3 / 4 * 4 * PARAMS

SCALE = """name = "script-scale"
[topology]
nodes = 2
ranks_per_node = 2
[link]
rate = "10gbit"
[emulation]
dilation = 40
[workload]
compute = "40ms"
warmup = 2
iterations = 4
"""


def _scenario(tmp_path: Path, workload: str, name: str = "scenario.toml") -> Path:
    path = tmp_path / name
    path.write_text(SCALE + workload)
    return path


def _script_workload(*args: str) -> str:
    command = ", ".join(f'"{a}"' for a in [str(SCRIPT), *SMALL, *args])
    return f'command = [{command}]\nparams = "1M"\n'


def test_a_plain_ddp_script_runs_in_a_scale_model_like_the_builtin_replay(
        tmp_path, monkeypatch):
    script = run_scenario(Scenario.load(_scenario(tmp_path, _script_workload())),
                          out_dir=tmp_path / "out")
    assert script.error is None and script.refused is None, script.error or script.refused
    assert script.passed, [c.message for c in script.checks if not c.passed]
    names = {check.name for check in script.checks}
    assert "fidelity:replay:script" in names  # the replay check covers the script
    mode = script.modes["script"]
    result = mode.result
    assert result.dilation == 40 and result.compute_source == "replay"
    assert result.sent_bytes_per_iteration == 4 * PARAMS  # DDP's buckets: the script's model
    assert RING_BYTES <= mode.wire_bytes_per_iteration <= RING_BYTES * 1.1
    iteration = statistics.median(result.iteration_s)
    assert 0.040 <= iteration < 0.060  # the target's 40 ms of compute, plus the tail's comm

    # Item 4: the built-in loop replaying the same model at the same compute.
    monkeypatch.setenv("PYTHONPATH", str(ROOT / "tests" / "workload"))
    loop = run_scenario(Scenario.load(_scenario(
        tmp_path, 'model = "workload_factories:tiny_train_model"\nparams = "1M"\n'
        'modes = ["fp32"]\n', "loop.toml")), out_dir=tmp_path / "out")
    assert loop.passed, [c.message for c in loop.checks if not c.passed]
    builtin = loop.modes["fp32"]
    assert builtin.result.sent_bytes_per_iteration == result.sent_bytes_per_iteration
    assert builtin.wire_bytes_per_iteration == pytest.approx(mode.wire_bytes_per_iteration,
                                                            rel=0.02)
    assert statistics.median(builtin.result.iteration_s) == pytest.approx(iteration, rel=0.05)


def test_unsupported_scripts_are_refused_with_the_reason(tmp_path, run_cli):
    done = run_cli("launch", _scenario(tmp_path, _script_workload("--fsdp")), "--out",
                   tmp_path / "out", timeout=300)
    assert done.returncode != 0
    assert "FSDP" in done.stdout + done.stderr and "compute replay" in done.stdout + done.stderr


def test_a_release_adding_ten_percent_more_bytes_is_flagged(tmp_path, run_cli):
    scenario = _scenario(tmp_path, _script_workload())
    baseline = tmp_path / "baseline.json"
    saved = run_cli("launch", scenario, "--out", tmp_path / "out", "--save-baseline", baseline,
                    timeout=300)
    assert saved.returncode == 0, saved.stdout + saved.stderr
    gate = ["--baseline", baseline, "--tolerance", "wire_bytes_per_iteration:5%",
            "--out", tmp_path / "out"]
    same = run_cli("launch", scenario, "--json", tmp_path / "same.json", *gate, "--",
                   str(SCRIPT), *SMALL, timeout=300)
    assert same.returncode == 0, same.stdout + same.stderr
    # The release all-reduces 10% of the gradients' floats more each step ("logging").
    more = run_cli("launch", scenario, "--json", tmp_path / "more.json", *gate, "--",
                   str(SCRIPT), *SMALL, "--stats-floats", str(PARAMS // 10), timeout=300)
    assert more.returncode != 0
    (report,) = json.loads((tmp_path / "more.json").read_text())["scenarios"]
    failed = [c for c in report["checks"] if not c["passed"]]
    assert [c["name"] for c in failed] == ["baseline:script:wire_bytes_per_iteration"], failed
    (before,) = json.loads((tmp_path / "same.json").read_text())["scenarios"]
    ratio = (report["modes"]["script"]["wire_bytes_per_iteration"]
             / before["modes"]["script"]["wire_bytes_per_iteration"])
    assert 1.07 <= ratio <= 1.13, (ratio, failed[0]["detail"])
