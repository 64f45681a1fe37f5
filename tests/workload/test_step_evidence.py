"""Each measured step's network evidence: a node's local rank 0 reads its TCP loss counters at
the edges of every synced step (workload.ranks.loop.measure, step_evidence), outside the step's
timing, and records what grew in it; warm-up steps and compute-only steps are not read."""

from __future__ import annotations

import contextlib
from collections.abc import Iterator

import torch

from netsim_ddp.precision.hooks import SentBytes
from netsim_ddp.workload.contract.window import counters_grew, step_loss_reader
from netsim_ddp.workload.ranks.loop import measure


class ReplayLike:
    """The trainer's interface as measure() uses it, with a scheduled compute-only step."""

    device = torch.device("cpu")
    scaler = None

    def begin_iteration(self, iteration: int) -> None: ...

    def step(self, batches: list[object], sync: bool) -> torch.Tensor:
        return torch.tensor(0.0)

    def scheduled_compute_s(self, micro_batches: int) -> float:
        return 0.01

    def late_s(self) -> None:
        return None

    @contextlib.contextmanager
    def rolled_back(self) -> Iterator[None]:
        yield


def test_every_measured_synced_step_records_what_grew_in_it() -> None:
    # Readings in order: two per synced step (before, after). Warm-up: 2 steps, 4 readings.
    retrans = iter([0, 0, 0, 3,          # warm-up: 3 retransmissions, not measured
                    3, 3, 3, 10, 10, 10])  # measured: none, then 7, then none
    reads: list[int] = []

    def read() -> dict[str, int]:
        value = next(retrans)
        reads.append(value)
        return {"RetransSegs": value, "TCPTimeouts": 1 if len(reads) >= 8 else 0}

    samples = measure(ReplayLike(), [(None, None)], SentBytes(), warmup=2, iterations=3,
                      grad_accumulation=1, barrier=lambda: None, step_evidence=read)
    assert samples.step_tcp_loss == [{}, {"RetransSegs": 7, "TCPTimeouts": 1}, {}]
    assert len(reads) == 2 * (2 + 3)  # synced steps only: compute-only steps read nothing
    assert len(samples.iteration_s) == 3


def test_without_a_reader_nothing_is_recorded() -> None:
    samples = measure(ReplayLike(), [(None, None)], SentBytes(), warmup=1, iterations=2,
                      grad_accumulation=1, barrier=lambda: None)
    assert samples.step_tcp_loss == []


def test_only_a_nodes_local_rank_0_reads(monkeypatch) -> None:
    monkeypatch.delenv("NETSIM_DDP_NODE", raising=False)
    assert step_loss_reader(0) is None  # not in an emulated node
    monkeypatch.setenv("NETSIM_DDP_NODE", "n0")
    assert step_loss_reader(1) is None
    reader = step_loss_reader(0)
    assert reader is not None
    assert set(reader()) <= {"RetransSegs", "TCPTimeouts", "TCPSpuriousRTOs", "TCPLossProbes"}
    assert "RetransSegs" in reader()  # every kernel's snmp has it


def test_counters_grew_keeps_only_growth() -> None:
    assert counters_grew({"a": 1, "b": 5, "c": 2}, {"a": 4, "b": 5, "d": 9}) == {"a": 3}
