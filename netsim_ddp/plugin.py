"""pytest plugin (registered by entry point): fixtures to test against an emulated network.

Hooks stay thin; the work lives in the library.
"""

from __future__ import annotations

from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

import pytest

from .scenario import Scenario


def pytest_configure(config: pytest.Config) -> None:
    config.addinivalue_line(
        "markers", "netns: needs root or user namespaces to build a real emulated network")


def _as_scenario(source: Scenario | str | Path | dict[str, Any]) -> Scenario:
    if isinstance(source, Scenario):
        return source
    if isinstance(source, dict):
        return Scenario.from_dict(source)
    return Scenario.load(source)


@pytest.fixture
def make_fabric() -> Iterator[Callable[..., Any]]:
    """Build emulated networks for a test; every one is removed when the test ends.

        def test_link(make_fabric):
            fabric = make_fabric("scenarios/default.toml")
            a, b = fabric.nodes

    Skips the test, saying why, where this host can build no network at all.
    """
    from .fabric import Fabric
    from .fabric.capabilities import probe_capabilities

    capabilities = probe_capabilities()
    if not capabilities.can_build:
        pytest.skip(f"this host cannot build an emulated network: {capabilities.error or capabilities}")
    built: list[Fabric] = []

    def build(source: Scenario | str | Path | dict[str, Any], **kwargs: Any) -> Fabric:
        fabric = Fabric(_as_scenario(source), **kwargs)
        fabric.__enter__()
        built.append(fabric)
        return fabric

    yield build
    for fabric in reversed(built):
        fabric.close()
