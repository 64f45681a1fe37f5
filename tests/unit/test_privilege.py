"""Why a process could not enter a user namespace, told truthfully; what it inherited from a
restart; who may shape a host's NIC; which pytest sessions enter at all. No namespace is made
here (tests/tier_guard.py would fail the test): the real entries are tests/netns and tests/ddp
test_rootless_user*.py, as `nobody`."""

import errno
import os
import threading
from types import SimpleNamespace

import pytest

from netsim_ddp.fabric.namespaces import privilege, userns
from netsim_ddp.fabric.nic.checks import NicError, check_may_shape
from netsim_ddp.plugin import may_build_networks


@pytest.fixture
def settings(tmp_path, monkeypatch):
    """A /proc/sys of the test's own: write(name, value) sets a sysctl."""
    monkeypatch.setattr(privilege, "_PROC_SYS", tmp_path)

    def write(name, value):
        path = tmp_path.joinpath(*name.split("."))
        path.parent.mkdir(parents=True, exist_ok=True)
        path.write_text(f"{value}\n")

    for name in ("user.max_user_namespaces", "kernel.unprivileged_userns_clone",
                 "kernel.apparmor_restrict_unprivileged_userns"):
        write(name, {"user.max_user_namespaces": 96368}.get(name, 1 if "clone" in name else 0))
    return write


@pytest.fixture
def fresh(monkeypatch):
    """privilege's state as in a process that has not entered yet."""
    monkeypatch.setattr(privilege, "_mode", None)
    monkeypatch.setattr(privilege, "_refused", None)
    monkeypatch.delenv(userns.ENV, raising=False)


def test_einval_with_threads_names_them_and_the_fix_not_the_host(settings):
    release = threading.Event()
    worker = threading.Thread(target=release.wait, name="waiter")
    worker.start()
    try:
        message = privilege.refusal("unshare", errno.EINVAL, ["python3", "waiter", "python3"])
    finally:
        release.set()
        worker.join()
    assert message.startswith("not root, and this process had 3 threads")
    assert "started from Python (" in message and "waiter" in message
    assert "EINVAL" in message and "ensure_network_privilege(restart=True)" in message
    assert "none of this host's settings forbids them" in message
    assert "max_user_namespaces" not in message and "sysctl" not in message


def test_einval_with_threads_on_a_host_that_forbids_too_says_both(settings):
    settings("kernel.unprivileged_userns_clone", 0)
    message = privilege.refusal("unshare", errno.EINVAL, ["python3", "python3"])
    assert "had 2 threads" in message
    assert "this host forbids them too: kernel.unprivileged_userns_clone = 0" in message


def test_einval_with_one_thread_is_a_kernel_without_user_namespaces(settings):
    message = privilege.refusal("unshare", errno.EINVAL, ["python3"])
    assert "CONFIG_USER_NS" in message and "threads" not in message


@pytest.mark.parametrize(("name", "value", "code", "fix"), [
    ("kernel.unprivileged_userns_clone", 0, errno.EPERM, "set it to 1"),
    ("kernel.apparmor_restrict_unprivileged_userns", 1, errno.EPERM, "AppArmor"),
    ("user.max_user_namespaces", 0, errno.ENOSPC, "set it above 0"),
])
def test_a_refusal_names_the_setting_that_forbids(settings, name, value, code, fix):
    settings(name, value)
    message = privilege.refusal("unshare", code, ["python3"])
    assert f"{name} = {value} ({fix}" in message
    assert errno.errorcode[code] in message and "threads" not in message
    others = {"kernel.unprivileged_userns_clone", "kernel.apparmor_restrict_unprivileged_userns",
              "user.max_user_namespaces"} - {name}
    assert not any(f"{other} =" in message for other in others)  # only what forbids


def test_a_refusal_no_setting_explains_says_so(settings):
    message = privilege.refusal("id maps", errno.EPERM, ["python3"])
    assert message.startswith("not root, and this host refuses unprivileged user namespaces "
                              "(id maps: EPERM")
    assert "none of user.max_user_namespaces" in message and "seccomp" in message


def test_a_refused_restart_reports_the_hosts_answer_without_trying_again(
        settings, fresh, monkeypatch):
    settings("kernel.unprivileged_userns_clone", 0)
    monkeypatch.setenv(userns.ENV, f"error:unshare:{errno.EPERM}:{os.getpid()}")
    monkeypatch.setattr(os, "geteuid", lambda: 1000)
    reason = privilege.prepare(restart=True)  # an unshare would fail the test (tier guard)
    assert reason is not None and "kernel.unprivileged_userns_clone = 0" in reason
    assert userns.ENV not in os.environ  # this process's children try for themselves
    with pytest.raises(privilege.PrivilegeError, match="unprivileged_userns_clone"):
        privilege.ensure_network_privilege()


def test_a_marker_of_another_namespace_or_process_is_not_adopted(fresh, monkeypatch):
    monkeypatch.setattr(os, "geteuid", lambda: 0)
    monkeypatch.setenv(userns.ENV, f"ok:1000:1000:{userns.user_namespace_inode() + 1}")
    assert privilege.ensure_network_privilege() == "root"
    monkeypatch.setattr(privilege, "_mode", None)
    monkeypatch.setenv(userns.ENV, f"error:unshare:{errno.EPERM}:{os.getpid() + 1}")
    assert privilege.ensure_network_privilege() == "root"
    for garbage in ("ok:1000", "ok:a:b:c", "error:unshare:x:1", "whatever"):
        monkeypatch.setattr(privilege, "_mode", None)
        monkeypatch.setenv(userns.ENV, garbage)
        assert privilege.ensure_network_privilege() == "root"


def test_kernel_threads_counts_what_python_cannot_see():
    before = len(userns.kernel_threads())
    release = threading.Event()
    worker = threading.Thread(target=release.wait)
    worker.start()
    try:
        assert len(userns.kernel_threads()) == before + 1
    finally:
        release.set()
        worker.join()


def test_only_a_process_with_net_admin_may_shape_a_nic(monkeypatch):
    assert privilege.has_net_admin() == (os.geteuid() == 0)
    monkeypatch.setattr(privilege, "has_net_admin", lambda: False)
    with pytest.raises(NicError, match=r"--nic eth1: .* needs root .*sudo netsim-ddp host"):
        check_may_shape("eth1")


@pytest.mark.parametrize(("markexpr", "enters"), [
    ("", True), ("netns and not ddp", True), ("ddp", True), ("netns or slow", True),
    ("not netns and not ddp", False), ("not netns", False), ("(((", True),
])
def test_a_session_enters_only_if_it_may_select_a_netns_test(markexpr, enters):
    config = SimpleNamespace(known_args_namespace=SimpleNamespace(markexpr=markexpr),
                             getini=lambda name: True)
    assert may_build_networks(config) is enters


def test_help_collect_only_and_the_ini_switch_never_enter():
    for flag in ("help", "version", "collectonly"):
        options = SimpleNamespace(markexpr="", **{flag: True})
        assert not may_build_networks(SimpleNamespace(known_args_namespace=options,
                                                      getini=lambda name: True))
    assert not may_build_networks(SimpleNamespace(
        known_args_namespace=SimpleNamespace(markexpr=""), getini=lambda name: False))
