"""The scheduler recipes in docs/multihost.md: what a GPU cluster needs is in them."""

import re
from pathlib import Path

DOC = (Path(__file__).resolve().parents[2] / "docs" / "multihost.md").read_text()


def block(language: str, containing: str) -> str:
    (found,) = [b for b in re.findall(rf"^```{language}\n(.*?)^```", DOC, re.S | re.M)
                if containing in b]
    return found


def test_slurm_holds_the_nodes_alone_with_their_gpus():
    sbatch = {line.split()[1].split("=")[0] for line in block("bash", "#SBATCH").splitlines()
              if line.startswith("#SBATCH")}
    assert {"--exclusive", "--gpus-per-node", "--ntasks-per-node"} <= sbatch


def test_the_kubernetes_job_keeps_its_json_on_a_volume_and_asks_for_gpus():
    job = block("yaml", "kind: Job")
    mounts = re.findall(r"mountPath: (\S+)\}", job)
    (json_out,) = re.findall(r"--json (\S+)", job)
    assert any(json_out.startswith(mount.rstrip("/") + "/") for mount in mounts), (mounts,
                                                                                   json_out)
    assert "persistentVolumeClaim" in job and "nvidia.com/gpu" in job
    assert 'capabilities: {add: ["NET_ADMIN"]}' in job
