"""Models to train: synthetic built-ins sized by parameter count, or the user's own factory.

The network cost of DDP depends on the gradient bytes (= trainable parameters) and on how long
compute takes to hide them, so the built-ins are sized by parameter count: within 2% of the
request (in practice within a fraction of a percent).

User factory contract ("package.module:factory" in the scenario):

    def factory(params: int) -> Workload | tuple[nn.Module, MakeBatch]
                                        | tuple[nn.Module, MakeBatch, LossFn]

    make_batch(batch_size: int, generator: torch.Generator) -> (inputs, targets)
        Tensors on the CPU, drawn only from `generator` so data is reproducible; the harness moves
        them to the device and seeds the generator with seed + rank.
    loss_fn(outputs, targets) -> scalar tensor; default torch.nn.functional.cross_entropy.

The harness calls torch.manual_seed(seed) just before the factory, so initialisation is
deterministic and identical across modes. `params` is the scenario's request; the factory may
ignore it, and the result records the real count. The module must be importable by the ranks
(on PYTHONPATH in their environment).
"""

from __future__ import annotations

import importlib
import math
from collections.abc import Callable
from dataclasses import dataclass

import torch
from torch import nn
from torch.nn import functional as F

Batch = tuple[torch.Tensor, torch.Tensor]
MakeBatch = Callable[[int, torch.Generator], Batch]
LossFn = Callable[[torch.Tensor, torch.Tensor], torch.Tensor]

MLP_DEPTH = 4  # hidden layers; the output layer's width absorbs the rounding remainder
TRANSFORMER_LAYERS = 2
TRANSFORMER_HEADS = 4
TRANSFORMER_SEQ = 32
MIN_VOCAB = 256
MIN_MLP_PARAMS = 1_000  # width 15: below that the 2% bound and the shape stop making sense
MIN_TRANSFORMER_PARAMS = 10_000  # d_model 12


@dataclass(frozen=True)
class Workload:
    model: nn.Module
    make_batch: MakeBatch
    loss_fn: LossFn = F.cross_entropy


def count_params(model: nn.Module) -> int:
    """Trainable parameters: exactly what DDP all-reduces gradients for."""
    return sum(p.numel() for p in model.parameters() if p.requires_grad)


def mlp_shape(params: int, depth: int = MLP_DEPTH) -> tuple[int, int]:
    """(width, classes) for an MLP of `depth` width x width layers plus a width -> classes head.

    Count = depth*(w^2 + w) + classes*(w + 1). Take the largest w that leaves room for >= 2
    classes, then let `classes` absorb the remainder: the error is under w + 1 parameters.
    """
    if params < MIN_MLP_PARAMS:
        raise ValueError(f"an MLP of {params} parameters is too small; ask for >= {MIN_MLP_PARAMS}")
    a, b, c = depth, depth + 2, 2 - params  # depth*w^2 + (depth+2)*w + 2 <= params
    width = int((-b + math.sqrt(b * b - 4 * a * c)) / (2 * a))
    while depth * (width**2 + width) + 2 * (width + 1) > params:
        width -= 1
    while depth * ((width + 1) ** 2 + width + 1) + 2 * (width + 2) <= params:
        width += 1
    classes = (params - depth * (width**2 + width)) // (width + 1)
    return width, classes


def build_mlp(params: int) -> Workload:
    width, classes = mlp_shape(params)
    layers: list[nn.Module] = []
    for _ in range(MLP_DEPTH):
        layers += [nn.Linear(width, width), nn.ReLU()]
    model = nn.Sequential(*layers, nn.Linear(width, classes))

    def make_batch(batch_size: int, generator: torch.Generator) -> Batch:
        inputs = torch.randn(batch_size, width, generator=generator)
        return inputs, torch.randint(0, classes, (batch_size,), generator=generator)

    return Workload(model, make_batch)


class TinyEncoder(nn.Module):
    """Token + position embeddings, transformer encoder layers, mean-pool, 2-class head."""

    def __init__(self, vocab: int, d_model: int) -> None:
        super().__init__()
        self.embed = nn.Embedding(vocab, d_model)
        self.position = nn.Parameter(torch.randn(TRANSFORMER_SEQ, d_model) * 0.02)
        self.layers = nn.ModuleList(
            nn.TransformerEncoderLayer(
                d_model, TRANSFORMER_HEADS, 4 * d_model, dropout=0.0, batch_first=True
            )
            for _ in range(TRANSFORMER_LAYERS)
        )
        self.head = nn.Linear(d_model, 2)

    def forward(self, tokens: torch.Tensor) -> torch.Tensor:
        hidden = self.embed(tokens) + self.position
        for layer in self.layers:
            hidden = layer(hidden)
        logits: torch.Tensor = self.head(hidden.mean(dim=1))
        return logits


def transformer_shape(params: int) -> tuple[int, int]:
    """(vocab, d_model): d_model a multiple of the head count, vocab absorbs the remainder.

    Count = (vocab + seq)*d + layers*(12 d^2 + 13 d) + 2 d + 2 (nn.TransformerEncoderLayer has
    12 d^2 + 13 d with a 4d feed-forward); the error is under d parameters.
    """

    def fixed(d: int) -> int:  # everything except the vocab's embedding rows
        return TRANSFORMER_SEQ * d + TRANSFORMER_LAYERS * (12 * d * d + 13 * d) + 2 * d + 2

    if params < MIN_TRANSFORMER_PARAMS:
        raise ValueError(
            f"a transformer of {params} parameters is too small; "
            f"ask for >= {MIN_TRANSFORMER_PARAMS}"
        )
    step = TRANSFORMER_HEADS
    d_model = step
    while fixed(d_model + step) + MIN_VOCAB * (d_model + step) <= params:
        d_model += step
    return (params - fixed(d_model)) // d_model, d_model


def build_transformer(params: int) -> Workload:
    vocab, d_model = transformer_shape(params)
    model = TinyEncoder(vocab, d_model)

    def make_batch(batch_size: int, generator: torch.Generator) -> Batch:
        tokens = torch.randint(0, vocab, (batch_size, TRANSFORMER_SEQ), generator=generator)
        return tokens, torch.randint(0, 2, (batch_size,), generator=generator)

    return Workload(model, make_batch)


def load_factory(spec: str) -> Callable[[int], object]:
    module_name, _, attr = spec.partition(":")
    module = importlib.import_module(module_name)
    try:
        return getattr(module, attr)  # type: ignore[no-any-return]
    except AttributeError:
        raise ValueError(f"model factory {spec!r}: module {module_name} has no {attr!r}") from None


def _as_workload(spec: str, made: object) -> Workload:
    if isinstance(made, Workload):
        return made
    if isinstance(made, tuple) and len(made) in (2, 3) and isinstance(made[0], nn.Module):
        return Workload(*made)
    raise TypeError(
        f"model factory {spec!r} returned {type(made).__name__}; expected a Workload or "
        "(model, make_batch) or (model, make_batch, loss_fn)"
    )


def build_workload(model: str, params: int, seed: int) -> Workload:
    """The model named in the config, initialised from `seed` (same on every rank and mode)."""
    torch.manual_seed(seed)
    if model == "mlp":
        return build_mlp(params)
    if model == "transformer":
        return build_transformer(params)
    return _as_workload(model, load_factory(model)(params))


def make_batches(
    workload: Workload, batch_size: int, count: int, seed: int, rank: int
) -> list[Batch]:
    """`count` synthetic batches for `rank`: seeded by seed + rank, identical across modes."""
    generator = torch.Generator().manual_seed(seed + rank)
    return [workload.make_batch(batch_size, generator) for _ in range(count)]
