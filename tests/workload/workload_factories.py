"""User-model factories for the tests ("workload_factories:NAME" in a WorkloadConfig)."""

from __future__ import annotations

import os
import threading
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
    if os.environ.get("RANK") == "1":
        raise RuntimeError("factory exploded on purpose (nsd-test)")
    return tiny(params)
