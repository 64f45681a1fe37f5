"""The unit tier's guard (a pytest plugin, loaded by tests/conftest.py).

A test without the `netns` or `ddp` marker belongs to the unit tier (`pytest -m "not netns and
not ddp"`), which must run unprivileged and within a minute. So a unit test that builds a
namespace or starts a training process fails at once, naming the marker it lacks, instead of
slipping into that tier and slowing it (or failing only where there is no root).
"""

from __future__ import annotations

import os
import sys

import pytest

HEAVY_MARKERS = ("netns", "ddp")
# Command lines that train, or that build networks (netsim-ddp subcommands that need privileges).
_TRAINING_ARGV = ("torch.distributed.run", "torchrun", "netsim_ddp.workload.ranks.rank")
_NETWORK_SUBCOMMANDS = {"run": "ddp", "probe": "netns", "check": "netns", "clean": "netns"}


class TierViolation(BaseException):
    """A BaseException, so that no `except Exception` in the code under test can swallow it."""


class _TierGuard:
    unit_test: str | None = None  # node id of the unit-tier test in setup or call, if any

    def refuse(self, what: str, marker: str) -> None:
        if self.unit_test is not None:
            raise TierViolation(
                f"{self.unit_test} {what}, but has no `{marker}` marker: the unit tier must run "
                f"unprivileged and fast. Mark it @pytest.mark.{marker}, or make it a unit test.")

    def audit(self, event: str, args: tuple) -> None:
        if event != "subprocess.Popen" or self.unit_test is None:
            return
        argv = [os.fsdecode(a) for a in (args[1] if isinstance(args[1], (list, tuple))
                                         else [args[1]])]
        if any(needle in arg for arg in argv for needle in _TRAINING_ARGV):
            self.refuse("starts a DDP training process", "ddp")
        for i, arg in enumerate(argv):
            if arg == "netsim_ddp.cli" or os.path.basename(arg) == "netsim-ddp":
                command = next((a for a in argv[i + 1:] if not a.startswith("-")), None)
                if command in _NETWORK_SUBCOMMANDS:
                    self.refuse(f"runs `netsim-ddp {command}`", _NETWORK_SUBCOMMANDS[command])


class _GuardedLibc:
    """netsim_ddp.fabric.namespaces.netns's and .userns's libc, refusing to unshare or enter a
    namespace in a unit test (every namespace the project makes, root or rootless, goes through
    these two calls)."""

    def __init__(self, libc, guard: _TierGuard):
        self._libc, self._guard = libc, guard

    def __getattr__(self, name: str):
        if name in ("unshare", "setns"):
            self._guard.refuse("creates or enters a network namespace", "netns")
        return getattr(self._libc, name)


_GUARD = _TierGuard()


def pytest_configure(config):
    from netsim_ddp.fabric.namespaces import netns, userns

    if not isinstance(netns.libc, _GuardedLibc):
        netns.libc = _GuardedLibc(netns.libc, _GUARD)
        userns.libc = _GuardedLibc(userns.libc, _GUARD)
        sys.addaudithook(_GUARD.audit)  # hooks cannot be removed: installed once per process


def _in_unit_tier(item) -> bool:
    return not any(item.get_closest_marker(name) for name in HEAVY_MARKERS)


@pytest.hookimpl(wrapper=True)
def pytest_runtest_setup(item):
    # Setup too: a session fixture a unit test pulls in (say, the capability probe) counts.
    _GUARD.unit_test = item.nodeid if _in_unit_tier(item) else None
    try:
        return (yield)
    finally:
        _GUARD.unit_test = None


@pytest.hookimpl(wrapper=True)
def pytest_runtest_call(item):
    _GUARD.unit_test = item.nodeid if _in_unit_tier(item) else None
    try:
        return (yield)
    finally:
        _GUARD.unit_test = None
