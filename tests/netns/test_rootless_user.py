"""Rootless as a user meets it: commands run as `nobody` (tests/unprivileged.py), in processes
where numpy has started its threads (OpenBLAS's pool, at import) before netsim-ddp enters its
user namespace, which the kernel refuses to a process with more than one thread."""

import json
import re

import pytest

pytestmark = pytest.mark.netns

NUMPY_FIRST_CLI = "import numpy, sys; from netsim_ddp.cli import main; sys.exit(main())"

SESSION = """
import os, socket
import pytest

@pytest.mark.netns
def test_inside(tmp_path):
    (tmp_path / "written").write_text("by the user")  # pytest-of-<the user's name>
    server = socket.create_server(("127.0.0.1", 0))  # its own loopback is up
    with socket.create_connection(server.getsockname()):
        pass
    server.close()
    assert os.getuid() == 0 and os.environ["NETSIM_DDP_USERNS"].startswith("ok:")

def test_outside():
    assert os.getuid() != 0 and "NETSIM_DDP_USERNS" not in os.environ
"""


def test_check_enters_after_numpy_started_its_threads(unprivileged):
    result = unprivileged.run("python", "-c", NUMPY_FIRST_CLI, "check", "--json", "-")
    assert result.returncode == 0, result.stderr
    capabilities = json.loads(result.stdout)["capabilities"]
    assert capabilities["privilege"] == "rootless"
    assert capabilities["namespaces"] and capabilities["veth"] and capabilities["tbf"]


def test_a_threaded_script_is_told_the_cause_and_the_fix(unprivileged):
    script = ("import numpy\nfrom netsim_ddp.fabric import ensure_network_privilege\n"
              "ensure_network_privilege()\n")
    result = unprivileged.run("python", "-c", script)
    assert result.returncode == 1
    message = result.stderr.strip().splitlines()[-1]
    found = re.match(r"netsim_ddp\.fabric\.namespaces\.privilege\.PrivilegeError: not root, "
                     r"and this process had (\d+) threads", message)
    assert found and int(found[1]) > 1, message
    assert "imported: numpy" in message and "EINVAL" in message
    assert "ensure_network_privilege(restart=True)" in message
    assert "max_user_namespaces" not in message  # the host's settings are not the cause


def test_a_threaded_script_restarts_inside_its_user_namespace(unprivileged):
    script = ("import os, numpy\nprint('started', len(os.listdir('/proc/self/task')), "
              "flush=True)\nfrom netsim_ddp.fabric import ensure_network_privilege\n"
              "print(ensure_network_privilege(restart=True), os.getuid())\n")
    result = unprivileged.run("python", "-c", script)
    assert result.returncode == 0, result.stderr
    first, second, last = result.stdout.splitlines()
    assert first == second and int(first.split()[1]) > 1  # started twice, threaded each time
    assert last == "rootless 0"  # root inside its own user namespace


@pytest.mark.parametrize(("markexpr", "selected"), [("netns", "test_inside"),
                                                    ("not netns and not ddp", "test_outside")])
def test_a_pytest_session_enters_at_its_start_only_for_netns_tests(unprivileged, markexpr,
                                                                   selected):
    (unprivileged.work / "test_session.py").write_text(SESSION)
    result = unprivileged.run("python", "-m", "pytest", "-p", "no:cacheprovider", "-v",
                              "-m", markexpr, "test_session.py")
    assert result.returncode == 0, result.stdout[-3000:] + result.stderr[-2000:]
    assert f"test_session.py::{selected} PASSED" in result.stdout


def test_clean_as_the_user(unprivileged):
    result = unprivileged.run("netsim-ddp", "clean", "--dry-run")
    assert result.returncode == 0 and "Traceback" not in result.stderr, result.stderr
