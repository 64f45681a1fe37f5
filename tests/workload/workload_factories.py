"""User-model factories for the tests ("workload_factories:NAME" in a WorkloadConfig)."""

from __future__ import annotations

import os
import threading
import time
from pathlib import Path

import torch
from torch import nn


def tiny(params: int) -> tuple[nn.Module, object]:
    """A working factory: one linear layer, ignoring `params` (the result records the truth)."""
    model = nn.Linear(16, 4)

    def make_batch(batch_size: int, generator: torch.Generator) -> tuple[torch.Tensor, ...]:
        return (
            torch.randn(batch_size, 16, generator=generator),
            torch.randint(0, 4, (batch_size,), generator=generator),
        )

    return model, make_batch


def different_on_each_rank(params: int) -> tuple[nn.Module, object]:
    """A factory whose model depends on more than torch's seed (here, the rank)."""
    model, make_batch = tiny(params)
    with torch.no_grad():
        model.bias.add_(float(os.environ.get("RANK", "0")))
    return model, make_batch


def not_a_workload(params: int) -> str:
    return "oops"


def hang_on_rank1(params: int) -> tuple[nn.Module, object]:
    """Rank 1 never returns (after leaving a marker); rank 0 goes on and blocks in DDP's
    parameter broadcast: a hung job that only the launch timeout can end."""
    if os.environ.get("RANK") == "1":
        Path(os.environ["NSD_TEST_MARKER_DIR"], "rank1-hanging").touch()
        threading.Event().wait()
    return tiny(params)


def explode_on_rank1(params: int) -> tuple[nn.Module, object]:
    """Rank 1 raises; with NSD_TEST_MARKER_DIR set, it first writes there when it did
    (time.monotonic(): one clock for every process of the host)."""
    if os.environ.get("RANK") == "1":
        if "NSD_TEST_MARKER_DIR" in os.environ:
            Path(os.environ["NSD_TEST_MARKER_DIR"], "rank1-exploded").write_text(
                repr(time.monotonic()))
        raise RuntimeError("factory exploded on purpose (nsd-test)")
    return tiny(params)


def explode_on_rank1_while_rank0_hangs(params: int) -> tuple[nn.Module, object]:
    """Rank 1 raises (as explode_on_rank1); rank 0 never returns, so nothing in the job ends it,
    only the launch can. (Left to reach DDP's parameter broadcast, rank 0 would fail on its own
    as soon as rank 1's socket closed: gloo's "Connection reset by peer".)"""
    if os.environ.get("RANK") == "0":
        threading.Event().wait()
    return explode_on_rank1(params)


def tiny_train_model(params: int) -> tuple[nn.Module, object]:
    """tests/scripts/tiny_train.py's model at --width 512 --layers 4 (1.05M parameters), for
    the built-in loop's replay of the same layout as the script's."""
    layers: list[nn.Module] = []
    for _ in range(4):
        layers += [nn.Linear(512, 512), nn.ReLU()]

    def make_batch(batch_size: int, generator: torch.Generator) -> tuple[torch.Tensor, ...]:
        inputs = torch.randn(batch_size, 512, generator=generator)
        return inputs, torch.zeros(batch_size, 512)

    return nn.Sequential(*layers), make_batch
