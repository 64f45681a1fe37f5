"""Real DDP runs through torchrun on loopback: what each mode sends, the timing arithmetic,
failures and timeouts that leave nothing behind (the profiler cross-check is in
tests/ddp/test_run.py, on a shaped link).
"""

from __future__ import annotations

import sys
import time
from pathlib import Path

import pytest

from conftest import LoopbackNode, live_processes_mentioning
from netsim_ddp.scenario.workload import AllreduceProbe
from netsim_ddp.workload import RankSpec, WorkloadConfig, WorkloadError, launch
from netsim_ddp.workload.contract.mode_result import ModeResult
from netsim_ddp.workload.launcher.launch import (
    FORKING_TORCHRUN,
    rank_env,
    torchrun_argv,
    torchrun_module,
)
from netsim_ddp.workload.ranks.collective import (
    AGAIN,
    TRAIN,
    VERDICT_FILE,
    attempt_dir,
    give_verdict,
    read_probe,
)
from netsim_ddp.workload.ranks.collective import RESULT_FILE as PROBE_RESULT

ALL_MODES = ["fp32", "amp", "amp-fp16", "amp-bf16"]
TINY = dict(params="200k", batch_size=16, iterations=4, warmup=1, modes=ALL_MODES)
FAILS_FAST_S = 10.0  # a failed rank to launch's error, at most (measured: about 2 s)


# Every test reading `run` trains: the fixture's params carry the `ddp` marker to them.
@pytest.fixture(scope="module", params=[pytest.param(layout, marks=pytest.mark.ddp)
                                        for layout in ("1node-x-2ranks", "2nodes-x-1rank")])
def run(request: pytest.FixtureRequest, tmp_path_factory: pytest.TempPathFactory) -> dict:
    out = tmp_path_factory.mktemp(request.param)
    if request.param == "1node-x-2ranks":
        nodes, per_node = [LoopbackNode("n0")], 2
        # gloo named: the ranks are forked from the node's agent (agent.py), as `run` does;
        # the other layout's 'auto' goes through torchrun itself
        spec = RankSpec(workload=WorkloadConfig(**TINY, backend="gloo"))
        watchdog = None
    else:  # two "nodes" on one address: different node ranks, same master
        nodes, per_node = [LoopbackNode("n0"), LoopbackNode("n1")], 1
        # and the probe inside the launch, as `run` starts it: verdicts "again", then "train"
        spec = RankSpec(workload=WorkloadConfig(**TINY, grad_accumulation=2),
                        allreduce_probe=AllreduceProbe(size_bytes=2**20, iterations=2),
                        probe_gated=True)
        watchdog = _verdicts(out, [AGAIN, TRAIN])
    results = launch(nodes, spec, out, timeout_s=120, ranks_per_node=per_node,
                     socket_ifname="lo", watchdog=watchdog)
    return {"results": results, "out": out, "spec": spec, "watchdog": watchdog}


def _verdicts(out: Path, verdicts: list[str]):
    """A harness's side of the gated probe: each attempt, once its results are there, gets
    the next verdict, and the monotonic time it was given."""
    given: list[float] = []

    def watchdog() -> None:
        attempt = len(given)
        folder = attempt_dir(out, attempt)
        if attempt < len(verdicts) and (folder / PROBE_RESULT).exists():
            give_verdict(folder, verdicts[attempt])
            given.append(time.monotonic())

    watchdog.given = given  # type: ignore[attr-defined]
    return watchdog


def test_every_mode_has_a_result(run: dict) -> None:
    results: dict[str, ModeResult] = run["results"]
    assert list(results) == ALL_MODES
    for mode, result in results.items():
        assert (run["out"] / f"result-{mode}.json").is_file()
        assert result.mode == mode and result.world_size == 2 and result.backend == "gloo"
        assert result.socket_ifname == "lo"
        assert len(result.iteration_s) == len(result.compute_s) == len(result.comm_s) == 4
        assert sorted(r.rank for r in result.ranks) == [0, 1]
        assert all(len(r.loss) == 4 for r in result.ranks)


@pytest.mark.ddp
@pytest.mark.parametrize("run", ["2nodes-x-1rank"], indirect=True)  # the launch with the probe
def test_the_gated_probe_waits_for_each_verdict_before_probing_again_or_training(
        run: dict) -> None:
    first, second = attempt_dir(run["out"], 0), attempt_dir(run["out"], 1)
    assert [r.world_size for r in read_probe(first)] == [2]  # attempt 1, then "again"
    assert (first / VERDICT_FILE).read_text() == AGAIN
    assert (second / VERDICT_FILE).read_text() == TRAIN
    assert not attempt_dir(run["out"], 2).exists()  # "train" ended the probing
    assert (second / PROBE_RESULT).stat().st_mtime <= (second / VERDICT_FILE).stat().st_mtime
    # no mode measured anything before the harness said train (one clock: one host)
    said_train = run["watchdog"].given[1]
    assert all(min(result.started_monotonic) > said_train
               for result in run["results"].values())


def test_only_a_compression_hook_halves_the_bytes(run: dict) -> None:
    """THE PITFALL, measured by the hook: autocast alone sends as much as FP32."""
    results: dict[str, ModeResult] = run["results"]
    fp32 = results["fp32"].sent_bytes_per_iteration
    assert fp32 == 4 * results["fp32"].params  # every gradient, as FP32, once per step
    assert results["amp"].sent_bytes_per_iteration / fp32 == pytest.approx(1.00, abs=0.03)
    assert results["amp-fp16"].sent_bytes_per_iteration / fp32 == pytest.approx(0.50, abs=0.03)
    assert results["amp-bf16"].sent_bytes_per_iteration / fp32 == pytest.approx(0.50, abs=0.03)
    for result in results.values():  # the same on every rank and every step
        assert {b for r in result.ranks for b in r.sent_bytes} == {result.sent_bytes_per_iteration}
    assert [results[m].ranks[0].wire_dtypes for m in ALL_MODES] == [
        ["float32"],
        ["float32"],
        ["float16"],
        ["bfloat16"],
    ]


def test_timing_arithmetic(run: dict) -> None:
    for result in run["results"].values():
        for i, (it, comp, comm) in enumerate(
            zip(result.iteration_s, result.compute_s, result.comm_s, strict=True)
        ):
            assert it == max(r.iteration_s[i] for r in result.ranks)  # slowest rank counts
            assert comp == max(r.compute_s[i] for r in result.ranks)
            assert comm == pytest.approx(max(it - comp, 0.0))
            assert it > 0 and comp > 0


def test_model_size_and_training(run: dict) -> None:
    for result in run["results"].values():
        assert result.params_requested == 200_000
        assert abs(result.params - 200_000) / 200_000 <= 0.02
        for rank in result.ranks:
            assert all(0 < loss < 10 for loss in rank.loss)
            assert rank.skipped_steps == 0
    # The compute-only (no_sync) steps were rolled back, so the ranks never diverged.
    for result in run["results"].values():
        assert len({rank.param_digest for rank in result.ranks}) == 1
    # Same seed, so every mode starts from the same model on the same data: first losses of
    # the two FP32-gradient modes differ only by autocast's rounding.
    fp32, amp = run["results"]["fp32"].ranks[0].loss[0], run["results"]["amp"].ranks[0].loss[0]
    assert amp == pytest.approx(fp32, rel=0.05)


@pytest.mark.ddp
def test_ranks_whose_models_differ_start_from_rank_0s(tmp_path: Path, factories_env: dict):
    # Ranks that built the same parameters skip DDP's start-up broadcast of them; a factory
    # that builds different ones per rank gets it, so the ranks still train one model.
    spec = RankSpec(workload=WorkloadConfig(model="workload_factories:different_on_each_rank",
                                            params=1000, iterations=2, modes=["fp32"],
                                            backend="gloo"))
    result = launch([LoopbackNode("n0")], spec, tmp_path, 120, ranks_per_node=2,
                    socket_ifname="lo", env=factories_env)["fp32"]
    assert len({rank.param_digest for rank in result.ranks}) == 1


def test_torchrun_and_its_ranks_never_import_from_the_working_directory() -> None:
    # torchrun starts its ranks as `python -m`: only the environment reaches them.
    env = rank_env("eth0", {"NSD_EXTRA": "1"})
    assert env["PYTHONSAFEPATH"] == "1"
    assert env["GLOO_SOCKET_IFNAME"] == "eth0" and env["NSD_EXTRA"] == "1"


def test_cpu_ranks_are_forked_from_their_agent_and_others_start_through_torchrun() -> None:
    # A CUDA context does not survive a fork, and 'auto' may pick NCCL on the GPUs.
    for backend, module in (("gloo", FORKING_TORCHRUN), ("nccl", "torch.distributed.run"),
                            ("auto", "torch.distributed.run")):
        spec = RankSpec(workload=WorkloadConfig(params=1000, backend=backend))
        argv = torchrun_argv(nnodes=1, nproc_per_node=1, node_rank=0, master_addr="10.0.0.1",
                             master_port=29555, spec_path="/s.json", out_dir="/o",
                             log_dir="/l", agent=torchrun_module(spec))
        assert argv[1:4] == ["-P", "-m", module], backend


def test_torchrun_command_line() -> None:
    argv = torchrun_argv(
        nnodes=3, nproc_per_node=2, node_rank=1, master_addr="10.0.0.1", master_port=29555,
        spec_path="/s.json", out_dir="/o", log_dir="/l", profile_dir="/p",
    )  # fmt: skip
    assert argv[:4] == [sys.executable, "-P", "-m", "torch.distributed.run"]
    text = " ".join(argv)
    for piece in ("--nnodes 3", "--nproc-per-node 2", "--node-rank 1", "--rdzv-backend static",
                  "--master-addr 10.0.0.1", "--master-port 29555", "--max-restarts 0",
                  "-m netsim_ddp.workload.ranks.rank --spec /s.json --out /o",
                  "--profile /p"):
        assert piece in text


@pytest.mark.ddp
def test_crashing_rank_fails_fast_and_cleans_up(tmp_path: Path, factories_env: dict) -> None:
    # Rank 1 raises in the factory; rank 0, on the other node, hangs in its own, and only
    # launch can end it. Fast: from rank 1's exception to launch's error is node n1's torchrun
    # reporting the failure and launch killing node n0 (about 2 s here), not the timeout.
    spec = RankSpec(workload=WorkloadConfig(
        model="workload_factories:explode_on_rank1_while_rank0_hangs", params=1000,
        iterations=2))  # fmt: skip
    timeout = 60.0
    markers = tmp_path / "markers"
    markers.mkdir()
    with pytest.raises(WorkloadError) as excinfo:
        launch([LoopbackNode("n0"), LoopbackNode("n1")], spec, tmp_path / "run", timeout,
               socket_ifname="lo", env={**factories_env, "NSD_TEST_MARKER_DIR": str(markers)})
    raised = time.monotonic()
    exploded = float((markers / "rank1-exploded").read_text())
    assert raised - exploded < FAILS_FAST_S, f"{raised - exploded:.1f} s after rank 1 failed"
    message = str(excinfo.value)
    assert "node n1 failed first" in message and "also failed" not in message  # n0 was ended
    assert "factory exploded on purpose (nsd-test)" in message
    assert "Traceback" in message
    assert live_processes_mentioning(str(tmp_path)) == []


@pytest.mark.ddp
def test_timeout_kills_everything(tmp_path: Path, factories_env: dict) -> None:
    spec = RankSpec(workload=WorkloadConfig(model="workload_factories:hang_on_rank1",
                                            params=1000, iterations=2))  # fmt: skip
    timeout = 10.0  # the ranks are up within ~3 s here, ~7 s on the slower machine kind
    start = time.monotonic()
    with pytest.raises(WorkloadError, match="timed out after 10s") as excinfo:
        launch(
            [LoopbackNode("n0"), LoopbackNode("n1")],
            spec,
            tmp_path,
            timeout,
            socket_ifname="lo",
            env={**factories_env, "NSD_TEST_MARKER_DIR": str(tmp_path)},
        )
    elapsed = time.monotonic() - start
    assert timeout <= elapsed < timeout + 15
    assert (tmp_path / "rank1-hanging").exists()  # the workers were up, and were killed
    assert "still running: n0, n1" in str(excinfo.value)
    assert live_processes_mentioning(str(tmp_path)) == []


@pytest.mark.ddp
def test_gloo_binds_to_the_named_interface(tmp_path: Path) -> None:
    # launch's socket_ifname reaches gloo as GLOO_SOCKET_IFNAME (the harness passes eth0).
    spec = RankSpec(workload=WorkloadConfig(params=1000, iterations=1, modes=["fp32"],
                                            backend="gloo"))
    with pytest.raises(WorkloadError, match="Unable to find address for: nsdbogus0"):
        launch([LoopbackNode("n0")], spec, tmp_path, 60, ranks_per_node=2,
               socket_ifname="nsdbogus0")  # fmt: skip
    assert live_processes_mentioning(str(tmp_path)) == []
