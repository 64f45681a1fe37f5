"""The README's promise, as a new user would test it: `netsim-ddp run` and a pytest session of
a shipped scenario file train in an emulated network without root (as `nobody`, with a venv it
can run: tests/unprivileged.py)."""

import json
import os
import xml.etree.ElementTree as ET

import pytest

pytestmark = [pytest.mark.netns, pytest.mark.ddp]

SMALL = """
name = "small"
[topology]
nodes = 2
[link]
rate = "500mbit"
[workload]
params = "1M"
batch_size = 8
iterations = 6
warmup = 1
modes = ["fp32", "amp-fp16"]
"""

# A plugin loaded before netsim-ddp's (pytest -p): numpy starts its threads at import, as a
# test module's would. It notes each start: threads, and whether in a user namespace yet.
NUMPY_FIRST = """
import os
import numpy

with open(os.path.join(os.path.dirname(__file__), "starts"), "a") as starts:
    starts.write(f"{len(os.listdir('/proc/self/task'))} "
                 f"{os.environ.get('NETSIM_DDP_USERNS', '-').split(':')[0]}\\n")
"""


def test_run_as_a_user(unprivileged):
    (unprivileged.work / "small.toml").write_text(SMALL)
    result = unprivileged.run("netsim-ddp", "run", "small.toml", "--json", "results.json",
                              timeout=300)
    assert result.returncode == 0, result.stdout[-3000:] + result.stderr[-3000:]
    (entry,) = json.loads((unprivileged.work / "results.json").read_text())["scenarios"]
    assert entry["status"] == "passed"
    assert entry["modes"]["fp32"]["wire_bytes_per_iteration"] > 0
    # Its namespaces lived in its own user namespace: never named on the host.
    host = os.listdir("/run/netns") if os.path.isdir("/run/netns") else []
    assert not [name for name in host if entry["run_id"] in name]


def test_pytest_session_of_a_shipped_scenario_as_a_user(unprivileged):
    (unprivileged.work / "numpy_first.py").write_text(NUMPY_FIRST)
    junit = unprivileged.work / "junit.xml"
    result = unprivileged.run(
        "python", "-m", "pytest", "-p", "numpy_first", "-p", "no:cacheprovider",
        "scenarios/default.toml", "--netsim-iterations", "6", "--junitxml", junit,
        cwd=unprivileged.repo, timeout=300,
        env={"PYTHONPATH": f"{unprivileged.repo}:{unprivileged.work}"})
    assert result.returncode == 0, result.stdout[-4000:] + result.stderr[-2000:]
    (case,) = ET.parse(junit).getroot().iter("testcase")
    assert case.get("name") == "default"
    assert not [child.tag for child in case if child.tag in ("failure", "error", "skipped")]
    # Threaded when netsim-ddp's plugin came to enter, so pytest was started again inside.
    first, second = (line.split() for line in
                     (unprivileged.work / "starts").read_text().splitlines())
    assert int(first[0]) > 1 and first[1] == "-" and second[1] == "ok"
