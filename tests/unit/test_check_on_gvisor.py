"""`netsim-ddp check` on kernels whose namespace or netlink calls fail with OSError (gVisor):
it reports what is missing and exits 1, it does not crash. Nothing is built: the kernel calls
are stand-ins that fail as gVisor's do."""

import contextlib
import errno

from click.testing import CliRunner

from netsim_ddp.cli import main
from netsim_ddp.fabric import capabilities, naming
from netsim_ddp.fabric.namespaces import netns, privilege


class NoNetlink:
    def __init__(self, *args, **kwargs):
        raise OSError(errno.EAFNOSUPPORT, "Address family not supported by protocol")


def test_check_reports_a_kernel_whose_netlink_fails_with_oserror(monkeypatch, tmp_path):
    monkeypatch.setattr(naming, "_lock_dir", tmp_path)
    monkeypatch.setattr(privilege, "ensure_network_privilege", lambda: "root")
    monkeypatch.setattr(netns, "create", lambda name: None)
    monkeypatch.setattr(netns, "remove", lambda name: None)
    monkeypatch.setattr(netns, "entered", lambda name: contextlib.nullcontext())
    monkeypatch.setattr(capabilities, "IPRoute", NoNetlink)
    capabilities.probe_capabilities.cache_clear()
    try:
        result = CliRunner().invoke(main, ["check"])
    finally:
        capabilities.probe_capabilities.cache_clear()
    assert result.exit_code == 1, result.output
    assert result.exception is None or isinstance(result.exception, SystemExit), result.exception
    assert "netlink in a network namespace failed" in result.output
    assert "Address family not supported" in result.output
