"""Built-in models hit the requested size; everything is seeded; user factories load."""

from __future__ import annotations

import pytest
import torch

from netsim_ddp.workload.ranks.models import (
    build_workload,
    count_params,
    make_batches,
    mlp_shape,
    transformer_shape,
)


@pytest.mark.parametrize("params", [1_000, 200_000, 16_800_000, 30_000_000, 1_000_000_000])
def test_mlp_shape_within_2_percent(params: int) -> None:
    width, classes = mlp_shape(params)
    count = 4 * (width**2 + width) + classes * (width + 1)  # the formula build_mlp follows
    assert classes >= 2
    assert abs(count - params) / params <= 0.02


@pytest.mark.parametrize("params", [10_000, 200_000, 16_800_000, 100_000_000])
def test_transformer_shape_within_2_percent(params: int) -> None:
    vocab, d_model = transformer_shape(params)
    # embeddings + 2 encoder layers (12 d^2 + 13 d each) + 2-class head, as TinyEncoder builds
    count = (vocab + 32) * d_model + 2 * (12 * d_model**2 + 13 * d_model) + 2 * d_model + 2
    assert d_model % 4 == 0 and vocab >= 256
    assert abs(count - params) / params <= 0.02


@pytest.mark.parametrize(
    ("model", "params"),
    [("mlp", 200_000), ("mlp", 3_000_000), ("transformer", 200_000), ("transformer", 3_000_000)],
)
def test_built_models_have_the_requested_parameter_count(model: str, params: int) -> None:
    workload = build_workload(model, params, seed=0)
    assert abs(count_params(workload.model) - params) / params <= 0.02
    inputs, targets = workload.make_batch(3, torch.Generator().manual_seed(0))
    loss = workload.loss_fn(workload.model(inputs), targets)
    assert loss.ndim == 0 and torch.isfinite(loss)


@pytest.mark.parametrize("too_small", [("mlp", 100), ("transformer", 1000)])
def test_too_small_is_a_clear_error(too_small: tuple[str, int]) -> None:
    with pytest.raises(ValueError, match="too small"):
        build_workload(*too_small, seed=0)


@pytest.mark.parametrize("model", ["mlp", "transformer"])
def test_seeded_init_and_data(model: str) -> None:
    a, b, c = (build_workload(model, 20_000, seed=s) for s in (7, 7, 8))
    for pa, pb in zip(a.model.parameters(), b.model.parameters(), strict=True):
        assert torch.equal(pa, pb)
    pairs = zip(a.model.parameters(), c.model.parameters(), strict=True)
    assert not all(torch.equal(pa, pc) for pa, pc in pairs)

    rank0 = make_batches(a, 4, 3, seed=7, rank=0)
    again = make_batches(b, 4, 3, seed=7, rank=0)
    rank1 = make_batches(a, 4, 3, seed=7, rank=1)
    assert all(
        torch.equal(x, y)
        for bx, by in zip(rank0, again, strict=True)
        for x, y in zip(bx, by, strict=True)
    )
    assert not torch.equal(rank0[0][0], rank1[0][0])  # each rank trains on its own shard


def test_user_factory_loads() -> None:
    workload = build_workload("workload_factories:tiny", 123, seed=0)
    assert count_params(workload.model) == 16 * 4 + 4
    inputs, targets = make_batches(workload, 5, 1, seed=0, rank=0)[0]
    assert inputs.shape == (5, 16) and targets.shape == (5,)


def test_user_factory_contract_violations() -> None:
    with pytest.raises(TypeError, match="expected a Workload"):
        build_workload("workload_factories:not_a_workload", 1, seed=0)
    with pytest.raises(ValueError, match="has no 'missing'"):
        build_workload("workload_factories:missing", 1, seed=0)
    with pytest.raises(ModuleNotFoundError):
        build_workload("no_such_module_nsd:f", 1, seed=0)
