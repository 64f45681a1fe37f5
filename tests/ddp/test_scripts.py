"""A user's own training script in the emulated network (`netsim-ddp launch`, [workload]
command): the project's small script (tests/scripts/tiny_train.py), unmodified by the harness,
measured per optimizer step, its variants compared as modes are, and its failures reported."""

from __future__ import annotations

import json
import shutil
from pathlib import Path

import pytest

from netsim_ddp import Scenario
from netsim_ddp.run.session import NetsimSession

pytestmark = [pytest.mark.netns, pytest.mark.ddp, pytest.mark.usefixtures("needs_fabric")]

SCRIPT = Path(__file__).resolve().parents[1] / "scripts" / "tiny_train.py"
SMALL = ["--width", "512", "--layers", "4"]  # 1.05M parameters: 4.2 MB of fp32 gradients


def write(tmp_path: Path, text: str, name: str = "scenario.toml") -> Path:
    path = tmp_path / name
    path.write_text(text)
    return path


VARIANTS = f"""name = "variants"
[topology]
nodes = 2
[link]
rate = "500mbit"
[fidelity]
enabled = false
[workload]
command = ["{SCRIPT}", "--steps", "5", {", ".join(f'"{a}"' for a in SMALL)}]
params = "1M"
warmup = 1
iterations = 3
[[workload.variant]]
name = "fp32"
[[workload.variant]]
name = "fp16-hook"
args = ["--fp16-hook"]
[[workload.variant]]
name = "fsdp-fp32"
args = ["--fsdp", "--reduce-dtype", "float32"]
[[workload.variant]]
name = "fsdp-bf16"
args = ["--fsdp", "--reduce-dtype", "bfloat16"]
[[expect]]
metric = "wire_bytes_per_iteration"
mode = "fp16-hook"
vs = "fp32"
max_ratio = 0.55
[[expect]]
metric = "wire_bytes_per_iteration"
mode = "fsdp-bf16"
vs = "fsdp-fp32"
max_ratio = 0.8
"""


def test_variants_of_a_script_compare_as_modes_do(tmp_path, run_cli):
    results = tmp_path / "results.json"
    done = run_cli("launch", write(tmp_path, VARIANTS), "--json", results, "--out",
                   tmp_path / "out", timeout=400)
    assert done.returncode == 0, done.stdout + done.stderr
    assert "fp16-hook" in done.stdout and "vs fp32" in done.stdout  # the table, as `run`'s
    (scenario,) = json.loads(results.read_text())["scenarios"]
    modes = scenario["modes"]
    assert list(modes) == ["fp32", "fp16-hook", "fsdp-fp32", "fsdp-bf16"]
    wire = {name: mode["wire_bytes_per_iteration"] for name, mode in modes.items()}
    # DDP's fp32 ring all-reduce of 4.2 MB: each of 2 nodes sends half of it twice, plus
    # the packets' headers (1448 bytes of payload in a 1514-byte frame: +4.6%)
    assert 8.4e6 <= wire["fp32"] <= 8.4e6 * 1.1, wire
    assert modes["fp32"]["hook_bytes_per_iteration"] == 4 * 1_050_624  # bucket bytes, exact
    assert modes["fp16-hook"]["script"]["comm_hooks"] == ["fp16_compress_hook"]
    assert modes["fp32"]["summary"]["collective_s"]["median"] > 0  # DDP's hook was timed
    assert "collective_s" not in modes["fsdp-fp32"]["summary"]  # no DDP, no timing
    assert modes["fsdp-fp32"]["script"]["ddp_models"] == 0
    for mode in modes.values():
        assert len(mode["iteration_s"]) == 3 and "comm_s" not in mode["summary"]
        assert len(mode["script"]["step_wire_bytes"]) == 3
        # the steps' bytes (no barrier) and the window's (barriers at its edges) agree
        assert sum(mode["script"]["step_wire_bytes"]) / 3 == pytest.approx(
            mode["wire_bytes_per_iteration"], rel=0.02)
    checks = {check["name"]: check for check in scenario["checks"]}
    assert checks["expect:wire_bytes_per_iteration:fp16-hook/fp32"]["passed"]
    assert checks["expect:wire_bytes_per_iteration:fsdp-bf16/fsdp-fp32"]["passed"]


GATE = """name = "release-gate"
[topology]
nodes = 2
[link]
rate = "500mbit"
[fidelity]
enabled = false
[workload]
command = ["train.py", "--steps", "7", "--width", "512", "--layers", "4"]
params = "1M"
warmup = 2
iterations = 5
"""


def test_a_script_change_that_adds_per_step_communication_is_flagged(tmp_path):
    """The same scenario, the script edited between runs (as a release changes it): three
    runs of the old script make the history and the baseline, the fourth adds an all-reduce
    of the weights after every step; both gates flag it, by its wire bytes and its time."""
    script = tmp_path / "train.py"
    shutil.copy(SCRIPT, script)
    scenario = Scenario.load(write(tmp_path, GATE))
    history, baseline = tmp_path / "history", tmp_path / "baseline.json"
    tolerances = ["median:10%", "wire_bytes_per_iteration:5%"]
    for run in range(3):
        session = NetsimSession.create(out_dir=tmp_path / "out", history_dir=history,
                                       tolerances=tolerances,
                                       save_baseline=baseline if run == 2 else None)
        report = session.run(scenario)
        session.finish()
        assert report.passed, [c for c in report.checks if not c.passed] or report.error
    source = script.read_text()
    changed = source.replace('"--average-weights", action="store_true"',
                             '"--average-weights", action="store_false"')
    assert changed != source
    script.write_text(changed)
    session = NetsimSession.create(out_dir=tmp_path / "out", history_dir=history,
                                   tolerances=tolerances, baseline=str(baseline))
    report = session.run(scenario)
    session.finish()
    failed = {check.name: check.detail for check in report.checks if not check.passed}
    print("\n".join(f"{name}: {detail}" for name, detail in failed.items()))  # -rP shows it
    assert "baseline:script:wire_bytes_per_iteration" in failed, report.checks
    assert "history:script:wire_bytes_per_iteration" in failed, report.checks
    assert "+" in failed["baseline:script:wire_bytes_per_iteration"]


ERRORS = f"""name = "broken"
[topology]
nodes = 2
[link]
rate = "500mbit"
[fidelity]
enabled = false
[workload]
command = ["{SCRIPT}", {", ".join(f'"{a}"' for a in SMALL)}]
warmup = 1
iterations = 3
[[workload.variant]]
name = "{{name}}"
args = {{args}}
"""


@pytest.mark.parametrize(("name", "args", "timeout", "words"), [
    # (a script that never steps: tests/workload/test_script_steps.py, without a network)
    ("too-short", ["--steps", "2"], None,
     "ended after 2 steps, but the scenario measures 1 warm-up + 3 steps = 4"),
    ("hangs", ["--hang-at", "2"], 20, "timed out after 20s"),
])
def test_a_broken_script_fails_the_run_with_the_reason(tmp_path, name, args, timeout, words):
    text = ERRORS.format(name=name, args=json.dumps(args))
    session = NetsimSession.create(out_dir=tmp_path / "out", timeout_s=timeout)
    report = session.run(Scenario.load(write(tmp_path, text)))
    assert report.status == "error", report.checks
    assert words in (report.error or ""), report.error
    if name == "hangs":  # the ranks' last lines say where they were
        assert "rank 0: step 2, sleeping" in (report.error or ""), report.error
    # nothing outlives the run: no agent or rank (forked ranks keep the agent's command line,
    # which names the run's folder) is left
    survivors = []
    for cmdline in Path("/proc").glob("[0-9]*/cmdline"):
        try:
            if str(tmp_path).encode() in cmdline.read_bytes():
                survivors.append(cmdline.parent.name)
        except OSError:
            continue  # exited while we looked
    assert not survivors
