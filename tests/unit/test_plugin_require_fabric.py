"""The plugin's fixtures skip on a host that cannot build a network, unless the host is meant to
(NETSIM_DDP_REQUIRE_FABRIC, as CI sets it): then they fail, naming why."""

from __future__ import annotations

import pytest

from netsim_ddp import plugin
from netsim_ddp.fabric import capabilities


@pytest.fixture
def unbuildable(monkeypatch):
    broken = capabilities.Capabilities.unavailable("rootless", "unshare refused (test)")
    assert not broken.can_build
    monkeypatch.setattr(capabilities, "probe_capabilities", lambda: broken)


def test_a_host_that_cannot_build_skips(unbuildable, monkeypatch):
    monkeypatch.delenv(plugin.REQUIRE_FABRIC_ENV, raising=False)
    with pytest.raises(pytest.skip.Exception, match="unshare refused"):
        plugin._skip_unless_buildable()


def test_a_host_that_must_build_fails(unbuildable, monkeypatch):
    monkeypatch.setenv(plugin.REQUIRE_FABRIC_ENV, "1")
    with pytest.raises(pytest.fail.Exception, match="NETSIM_DDP_REQUIRE_FABRIC is set, but"):
        plugin._skip_unless_buildable()
