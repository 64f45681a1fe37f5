"""Fixtures for the delay line's tests: they build real namespaces, so they need root (where
they cannot run: a skip, or a failure under NETSIM_DDP_REQUIRE_FABRIC, tests/conftest.py)."""

from __future__ import annotations

from collections.abc import Iterator

import pytest

from netsim_ddp.fabric.delayline import DelayLineBuildError, build_binary
from netsim_ddp.fabric.delayline.testbed import Testbed, testbed
from netsim_ddp.fabric.namespaces import netns, privilege


@pytest.fixture(scope="session")
def forwarder_binary(lacks_fabric):
    try:
        return build_binary()
    except DelayLineBuildError as exc:
        lacks_fabric(f"cannot build the delay line forwarder: {exc}")


@pytest.fixture(scope="session")
def as_root(lacks_fabric) -> None:
    if not privilege.host_root():
        lacks_fabric("the delay line tests create namespaces and AF_PACKET sockets: run as root")


def _leftovers(bed: Testbed) -> list[str]:
    return [name for name in netns.list_names() if name.startswith(f"nsd{bed.run_id}-")]


def _bed(**kwargs) -> Iterator[Testbed]:
    with testbed(**kwargs) as bed:
        yield bed
    leftover = _leftovers(bed)
    assert not leftover, f"namespaces left behind: {leftover}"


@pytest.fixture
def bed(as_root, forwarder_binary) -> Iterator[Testbed]:
    """A -> D(forwarder) -> B at MTU 1500; removed (and checked removed) afterwards."""
    yield from _bed()


@pytest.fixture
def capped_bed(as_root, forwarder_binary) -> Iterator[Testbed]:
    """As `bed`, with tbf capping A.eth0 at 500 Mbit/s."""
    yield from _bed(tbf_rate_bit=500_000_000)
