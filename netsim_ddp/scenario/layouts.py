"""Parameter layouts for compute replay: which layers a model has and the shapes of their
parameters, in registration order. No torch here: the shipped layouts are JSON data
(layouts/*.json, generated from the real models' definitions by tools/make_layouts.py, shapes
only), so a scenario naming one can be validated, and its parameter count known, anywhere.

A layout decides DDP's buckets (their count, sizes and boundaries follow the parameters in
reverse order), so a replayed ResNet-50 all-reduces what the real one would.
"""

from __future__ import annotations

import json
import math
from dataclasses import dataclass
from functools import cache
from pathlib import Path

LAYOUT_DIR = Path(__file__).resolve().parent / "layouts"
GENERIC_LAYERS = 24  # a generic layout: this many equal layers (a 24-block transformer-ish)


@dataclass(frozen=True)
class Layer:
    name: str
    shapes: tuple[tuple[int, ...], ...]

    @property
    def params(self) -> int:
        return sum(math.prod(shape) for shape in self.shapes)


@dataclass(frozen=True)
class Layout:
    name: str
    source: str
    layers: tuple[Layer, ...]

    @property
    def params(self) -> int:
        return sum(layer.params for layer in self.layers)

    @property
    def shares(self) -> list[float]:
        """Each layer's fraction of the parameters (the default split of backward time)."""
        total = self.params
        return [layer.params / total for layer in self.layers]


def layout_names() -> list[str]:
    return sorted(path.stem for path in LAYOUT_DIR.glob("*.json"))


@cache
def named_layout(name: str) -> Layout:
    """A shipped layout by name ('resnet50', 'vgg16', 'bert-base', ...)."""
    path = LAYOUT_DIR / f"{name}.json"
    if not path.is_file():
        raise ValueError(f"unknown layout {name!r}; shipped layouts: {', '.join(layout_names())}")
    data = json.loads(path.read_text(encoding="utf-8"))
    layout = Layout(name, data["source"], tuple(
        Layer(layer_name, tuple(tuple(shape) for shape in shapes))
        for layer_name, shapes in data["layers"]))
    if layout.params != data["params"]:
        raise ValueError(f"{path}: its layers hold {layout.params} parameters, not the "
                         f"{data['params']} it records; regenerate it (tools/make_layouts.py)")
    return layout


def generic_layout(params: int, layers: int = GENERIC_LAYERS) -> Layout:
    """`params` parameters in `layers` equal layers (the remainder in the last): for a replay
    that knows only the model's size."""
    if params < layers:
        raise ValueError(f"a generic layout of {params} parameters needs at least {layers}")
    each = params // layers
    sizes = [each] * (layers - 1) + [params - each * (layers - 1)]
    return Layout(f"generic-{layers}", f"{params} parameters in {layers} equal layers", tuple(
        Layer(f"layer{i}", ((size,),)) for i, size in enumerate(sizes)))
