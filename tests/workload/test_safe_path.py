"""Ranks never import from the working directory of whoever started the harness."""

from pathlib import Path

import pytest

from conftest import LoopbackNode
from netsim_ddp.workload import RankSpec, WorkloadConfig, launch


def poison(folder: Path, marker: Path) -> Path:
    """A folder whose json.py, if ever imported, leaves `marker` and breaks the importer."""
    folder.mkdir()
    (folder / "json.py").write_text(f"open({str(marker)!r}, 'w').close()\n"
                                    "raise ImportError('the poisoned json.py was imported')\n")
    return folder


@pytest.mark.ddp  # real ranks on loopback
def test_ranks_and_torchrun_ignore_a_json_py_in_the_callers_cwd(tmp_path, monkeypatch):
    marker = tmp_path / "imported"
    monkeypatch.chdir(poison(tmp_path / "cwd", marker))
    # gloo: the ranks are forked from each node's agent, the path every `run` takes; torchrun's
    # own ranks get the same PYTHONSAFEPATH=1 (launch.rank_env).
    spec = RankSpec(workload=WorkloadConfig(params=1000, iterations=1, modes=["fp32"],
                                            backend="gloo"))
    results = launch([LoopbackNode("n0")], spec, tmp_path / "out", 120, ranks_per_node=2,
                     socket_ifname="lo")
    assert set(results) == {"fp32"}
    assert not marker.exists()

