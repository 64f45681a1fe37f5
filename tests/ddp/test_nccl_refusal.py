"""On a host without CUDA GPUs and NCCL, `backend = "nccl"` is a refusal naming what is
missing: exit 1 from `run`, a skip with the reason in pytest; never a traceback. Nothing is
built: the refusal comes before the network."""

import json
from pathlib import Path

import pytest

from netsim_ddp.hostfacts.gpus import probe_gpus
from netsim_ddp.hostfacts.placement import place

ROOT = Path(__file__).resolve().parents[2]
SHIPPED = "scenarios/nccl-shared-gpu.toml"


@pytest.fixture
def no_nccl_here():
    inventory = probe_gpus()
    if inventory.nccl_usable:
        pytest.skip(f"this host can use NCCL ({inventory.count} GPUs): nothing to refuse")
    return inventory.missing


@pytest.mark.ddp  # `netsim-ddp run`, even though it refuses before building anything
def test_cli_run_refuses_nccl_with_what_is_missing(no_nccl_here, run_cli, tmp_path):
    result = run_cli("run", ROOT / SHIPPED, "--json", tmp_path / "out.json", timeout=120)
    assert result.returncode == 3, result.stderr  # this host cannot run it: untrusted
    text = " ".join((result.stdout + result.stderr).split())  # rich wraps long lines
    assert "nccl-shared-gpu: UNTRUSTED" in text and "needs CUDA GPUs and NCCL" in text
    assert " ".join(no_nccl_here.split()) in text
    assert "Traceback" not in result.stderr
    (entry,) = json.loads((tmp_path / "out.json").read_text())["scenarios"]
    assert entry["status"] == "untrusted" and entry["placement"]["requested"] == "nccl"
    assert entry["placement"]["host_gpus"]["nccl_usable"] is False


@pytest.mark.netns
@pytest.mark.ddp  # a pytest session running the shipped scenario file
def test_pytest_skips_the_nccl_scenario_with_the_reason(no_nccl_here, pytester, needs_fabric,
                                                        monkeypatch):
    folder = pytester.path / "scenarios"
    folder.mkdir()
    (folder / "nccl.toml").write_text((ROOT / SHIPPED).read_text())
    result = pytester.runpytest_subprocess("scenarios", "-rs")
    result.assert_outcomes(skipped=1)
    result.stdout.fnmatch_lines(["*SKIPPED*nccl-shared-gpu: untrusted on this host: "
                                 "workload.backend = 'nccl' needs CUDA GPUs and NCCL*"])
    result.stdout.fnmatch_lines(["*1 of 1 scenarios untrusted on this host*nccl-shared-gpu*"])
    # CI that must measure or go red: the same scenario fails, by option or environment.
    failed = pytester.runpytest_subprocess("scenarios", "--netsim-untrusted", "fail")
    failed.assert_outcomes(failed=1)
    failed.stdout.fnmatch_lines(["*nccl-shared-gpu: UNTRUSTED (--netsim-untrusted fail)*"])
    monkeypatch.setenv("NETSIM_DDP_UNTRUSTED", "fail")
    pytester.runpytest_subprocess("scenarios").assert_outcomes(failed=1)
    assert "Traceback" not in result.stdout.str()


def test_plan_shows_the_refusal_and_the_mapping_for_a_gpu_host(no_nccl_here, run_cli):
    here = run_cli("plan", ROOT / SHIPPED, timeout=60)
    assert here.returncode == 1
    assert "refused on this host" in " ".join(here.stdout.split())
    gpu_host = run_cli("plan", ROOT / SHIPPED, "--gpus", "1", timeout=60)
    assert gpu_host.returncode == 0, gpu_host.stderr
    text = gpu_host.stdout
    assert "cuda:0" in text and "NCCL_HOSTID" in text and "=eth0" in text
    assert "shared" in text


def test_placement_of_the_shipped_scenario_on_this_host(no_nccl_here):
    from netsim_ddp import Scenario

    sc = Scenario.load(ROOT / SHIPPED)
    assert place(sc.workload, sc.topology).refused.endswith(no_nccl_here)
