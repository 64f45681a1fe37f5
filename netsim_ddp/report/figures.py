"""What every figure of the report shares: matplotlib without a display, each mode's colour,
and titles that fit over their axes."""

from __future__ import annotations

import textwrap

from netsim_ddp.precision.modes import mode_names


def pyplot():
    """matplotlib's pyplot on the Agg backend (PNG, no display needed), imported on first use:
    the harness itself never draws."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    return plt


def mode_color(mode: str, index: int) -> str:
    """A registered mode keeps its colour in every figure (its place in the registry picks one
    of matplotlib's default cycle); an unknown one gets the next free colour by `index`."""
    names = mode_names()
    return f"C{names.index(mode)}" if mode in names else f"C{len(names) + index}"


def fit_title(text: str, width: int = 60) -> str:
    """Wrap a title so it fits over its axes instead of running past the figure."""
    return "\n".join(textwrap.wrap(text, width)) or text
