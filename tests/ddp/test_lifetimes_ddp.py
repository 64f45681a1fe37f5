"""Real `netsim-ddp run`s: each owns its files, and nothing of one outlives its SIGKILL."""

import contextlib
import json
import os
import subprocess
import sys
import time
from pathlib import Path

import pytest

from netsim_ddp.fabric import naming
from netsim_ddp.workload.launcher.launch import FORKING_TORCHRUN, RANK_MODULE

pytestmark = [pytest.mark.netns, pytest.mark.ddp, pytest.mark.usefixtures("needs_fabric")]


def write_scenario(folder: Path, *, iterations: int, delay: str = "0ms") -> Path:
    path = folder / "owned.toml"
    path.write_text(f"""
name = "owned"
[topology]
nodes = 2
[link]
rate = "200mbit"
delay = "{delay}"
[[background]]
source = "n1"
destination = "n0"
on = "50ms"
off = "50ms"
rate = "50mbit"
[workload]
params = "500K"
iterations = {iterations}
warmup = 1
batch_size = 8
modes = ["fp32"]
[fidelity]
enabled = false
""")
    return path


def test_a_reused_out_folder_replays_no_older_runs_signals(tmp_path, run_cli):
    # Reproduced before: the second run's background senders replayed the first run's
    # start/end files in out/signals, never followed the new windows, and the run reported
    # 0 background bytes for every mode, and passed.
    scenario, out = write_scenario(tmp_path, iterations=4), tmp_path / "out"
    for attempt in (1, 2):
        result = run_cli("run", scenario, "--out", out, "--json", tmp_path / f"{attempt}.json")
        (entry,) = json.loads((tmp_path / f"{attempt}.json").read_text())["scenarios"]
        assert entry["status"] != "error", (entry["error"], result.stderr[-3000:])
        assert entry["modes"]["fp32"]["background_bytes_per_iteration"] > 0, attempt
        assert Path(entry["out_dir"]) == (out / "owned" / f"run-{entry['run_id']}")
    assert len(list((out / "owned").glob("run-*"))) == 2
    assert (out / "owned" / "latest").resolve() == Path(entry["out_dir"]).resolve()


def marked_processes(run_id: str) -> dict[int, str]:
    """pid -> command line of live processes that carry the run's id."""
    found = {}
    for entry in os.listdir("/proc"):
        if not entry.isdigit():
            continue
        try:
            with open(f"/proc/{entry}/environ", "rb") as environ:
                if f"{naming.RUN_ID_ENV}={run_id}".encode() not in environ.read().split(b"\0"):
                    continue
            with open(f"/proc/{entry}/stat") as stat:
                if stat.read().rsplit(")", 1)[1].split()[0] in ("Z", "X"):
                    continue
            with open(f"/proc/{entry}/cmdline", "rb") as cmdline:
                found[int(entry)] = cmdline.read().replace(b"\0", b" ").decode(errors="replace")
        except OSError:
            continue
    return found


def test_sigkill_of_run_mid_training_leaves_no_process_alive_after_a_second(tmp_path, run_cli):
    # 1 ms of delay puts a forwarder (SCHED_FIFO as root) on each link where netem is missing.
    scenario = write_scenario(tmp_path, iterations=500, delay="1ms")
    out = tmp_path / "out"
    with open(tmp_path / "stderr.log", "wb") as stderr:
        harness = subprocess.Popen([sys.executable, "-m", "netsim_ddp.cli", "run", scenario,
                                    "--out", out], stdout=subprocess.DEVNULL, stderr=stderr)
    latest, processes = out / "owned" / "latest", {}
    try:
        deadline = time.monotonic() + 240
        while not (latest / "signals" / "start-fp32").exists():  # measured steps under way
            assert harness.poll() is None, (tmp_path / "stderr.log").read_text()[-3000:]
            assert time.monotonic() < deadline, "training did not start within 240 s"
            time.sleep(0.05)
        run_id = latest.resolve().name.removeprefix("run-")
        processes = marked_processes(run_id)
        commands = " ".join(processes.values())
        for part in ("nsd-delayline", "netsim_ddp.fabric.background send",
                     "netsim_ddp.fabric.background sink"):
            assert part in commands, (part, processes)
        # each node's agent and the rank it forked (same command line): 2 nodes x 1 rank
        agents = [c for c in processes.values() if f"-m {FORKING_TORCHRUN} " in c]
        assert len(agents) == 4 and all(f"-m {RANK_MODULE} " in c for c in agents), processes
        harness.kill()
        killed_at = time.monotonic()
        harness.wait(timeout=10)
        while marked_processes(run_id) and time.monotonic() < killed_at + 1.0:
            time.sleep(0.01)
        assert marked_processes(run_id) == {}
    finally:
        if harness.poll() is None:
            harness.kill()
        for pid in processes:  # if the test failed: what this test's run left
            with contextlib.suppress(ProcessLookupError):
                os.kill(pid, 9)
        run_cli("clean")  # SIGKILL leaves the run's (empty) named namespaces as root

