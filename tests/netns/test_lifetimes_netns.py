"""Nothing of a run outlives it, and `clean` provably spares live runs (real processes)."""

import json
import os
import shutil
import signal
import subprocess
import sys
import textwrap
import time

import pytest

from netsim_ddp import Scenario
from netsim_ddp.fabric import Fabric, naming
from netsim_ddp.fabric.namespaces import netns, privilege

pytestmark = [pytest.mark.netns, pytest.mark.usefixtures("needs_fabric")]

# A run that starts processes in its nodes and holds its fabric until stdin closes (or it is
# killed): in n0 a child that starts a grandchild in a session of its own (as torchrun does its
# workers), in n1 a child that ignores SIGTERM and says so in a file when it gets one.
HOLDER = textwrap.dedent("""
    import json, signal, sys
    # Ctrl-C must reach it as KeyboardInterrupt even where the tests run as a background job
    # (SIGINT then starts ignored, and Python keeps it so)
    signal.signal(signal.SIGINT, signal.default_int_handler)
    from netsim_ddp import Scenario
    from netsim_ddp.fabric import Fabric
    scenario = Scenario.from_dict({"name": "h", "topology": {"nodes": 2},
                                  "link": {"rate": "100mbit"}})
    TERM_NOTICE = sys.argv[1]
    STUBBORN = ("import signal, sys, time\\n"
                "def note(*_): open(sys.argv[1], 'w').close()\\n"
                "signal.signal(signal.SIGTERM, note)\\n"
                "print('ready', flush=True)\\n"
                "while True: time.sleep(1)")
    PARENT = ("import subprocess, sys, time\\n"
              "g = subprocess.Popen([sys.executable, '-c', 'import time; time.sleep(600)'],"
              " start_new_session=True)\\n"
              "print(g.pid, flush=True)\\n"
              "time.sleep(600)")
    with Fabric(scenario) as fabric:
        parent = fabric.nodes[0].popen([sys.executable, "-c", PARENT],
                                       stdout=__import__("subprocess").PIPE, text=True)
        parent.stdout.readline()  # the grandchild's pid, as the run's PID namespace numbers it
        stubborn = fabric.nodes[1].popen([sys.executable, "-c", STUBBORN, TERM_NOTICE],
                                         stdout=__import__("subprocess").PIPE, text=True)
        stubborn.stdout.readline()
        print(json.dumps({"namespaces": fabric.plan.namespaces, "run_id": fabric.run_id,
                          "pids": [parent.pid, stubborn.pid]}), flush=True)
        sys.stdin.read()
""")


def start_holder(tmp_path):
    process = subprocess.Popen([sys.executable, "-c", HOLDER, str(tmp_path / "got-sigterm")],
                               stdin=subprocess.PIPE, stdout=subprocess.PIPE, text=True)
    return process, json.loads(process.stdout.readline())


def alive(pid):
    try:
        with open(f"/proc/{pid}/stat") as stat:
            return stat.read().rsplit(")", 1)[1].split()[0] not in ("Z", "X")
    except (FileNotFoundError, ProcessLookupError):
        return False


def marked_with(run_id):
    """Live processes that carry the run's id in their environment."""
    found = []
    for entry in os.listdir("/proc"):
        if entry.isdigit():
            try:
                with open(f"/proc/{entry}/environ", "rb") as environ:
                    if f"{naming.RUN_ID_ENV}={run_id}".encode() in environ.read().split(b"\0"):
                        found.append(int(entry))
            except OSError:
                continue
    return [pid for pid in found if alive(pid)]


def wait_until(condition, timeout_s):
    deadline = time.monotonic() + timeout_s
    while not condition():
        if time.monotonic() > deadline:
            return False
        time.sleep(0.005)
    return True


def run_clean(*args):
    return subprocess.run([sys.executable, "-m", "netsim_ddp.cli", "clean", *args],
                          capture_output=True, text=True, timeout=60)


def test_processes_start_in_the_runs_pid_namespace_with_a_safe_path():
    scenario = Scenario.from_dict({"name": "p", "topology": {"nodes": 2},
                                   "link": {"rate": "100mbit"}})
    code = ("import os, json; print(json.dumps([os.readlink('/proc/self/ns/pid'), "
            f"os.environ.get('PYTHONSAFEPATH'), os.environ.get({naming.RUN_ID_ENV!r})]))")
    with Fabric(scenario) as fabric:
        process = fabric.nodes[0].popen([sys.executable, "-c", code], stdout=subprocess.PIPE,
                                        text=True)
        pid_ns, safe_path, run_id = json.loads(process.communicate(timeout=30)[0])
    assert pid_ns != os.readlink("/proc/self/ns/pid")
    assert safe_path == "1" and run_id == fabric.run_id


def test_sigkill_of_the_harness_ends_every_process_of_the_run_within_a_second(tmp_path,
                                                                               capsys):
    holder, info = start_holder(tmp_path)
    try:
        marked = marked_with(info["run_id"])
        assert set(info["pids"]) <= set(marked) and len(marked) == 3  # and the grandchild
        holder.kill()
        killed_at = time.monotonic()
        holder.wait(timeout=10)
        wait_until(lambda: not any(alive(pid) for pid in marked), 1.0)
        survivors = [pid for pid in marked if alive(pid)]
        assert time.monotonic() - killed_at < 5 and not survivors, survivors
        # What SIGKILL does leave (as root: the named, empty namespaces) is reported at the
        # start of the next run, and `clean` finds no process left to kill.
        assert not any(netns.pids_in(info["namespaces"]).values())  # the kernel did it
        from netsim_ddp.cli import run as run_commands

        run_commands._warn_about_stale_runs()
        assert "`netsim-ddp clean` removes them" in capsys.readouterr().err
    finally:
        holder.kill()
        run_clean()
    assert not set(info["namespaces"]) & set(netns.list_names())


def test_a_second_ctrl_c_during_teardown_leaves_no_process_behind(tmp_path):
    holder, info = start_holder(tmp_path)
    holder.send_signal(signal.SIGINT)
    # Teardown has begun: the stubborn child got its SIGTERM and ignores it.
    assert wait_until((tmp_path / "got-sigterm").exists, 30)
    holder.send_signal(signal.SIGINT)
    holder.wait(timeout=60)
    assert holder.returncode != 0
    assert not any(alive(pid) for pid in info["pids"])
    assert not set(info["namespaces"]) & set(netns.list_names())


LOCKER = textwrap.dedent("""
    import sys
    from netsim_ddp.fabric import naming
    def pause():  # between the lock file's open and its flock: wait for the test (once)
        naming._between_open_and_flock = lambda: None
        print("opened", flush=True)
        sys.stdin.readline()
    naming._between_open_and_flock = pause
    lock = naming.RunLock(sys.argv[1])
    lock.acquire()
    naming._between_open_and_flock = lambda: None
    print("locked", flush=True)
    sys.stdin.read()
""")


def test_clean_cannot_unlink_a_lock_between_a_runs_open_and_flock():
    run_id = naming.new_run_id()
    run = subprocess.Popen([sys.executable, "-c", LOCKER, run_id], stdin=subprocess.PIPE,
                           stdout=subprocess.PIPE, text=True)
    try:
        assert run.stdout.readline() == "opened\n"
        # The run has opened (created) its lock file but holds no flock yet: to `clean` it is
        # an orphan lock, and clean unlinks it.
        swept = run_clean()
        assert f"removed the lock file of dead run {run_id}" in swept.stdout, swept.stdout
        run.stdin.write("go\n")
        run.stdin.flush()
        # Its flock was taken on the unlinked file: the run saw that and locked a new one.
        assert run.stdout.readline() == "locked\n"
        assert naming.is_live(run_id)
        dry = run_clean("--dry-run")
        assert f"left run {run_id} alone: it is live" in dry.stdout, dry.stdout
    finally:
        run.stdin.close()
        run.wait(timeout=30)


def lock_file_state(path):
    info = path.stat()
    return info.st_ino, info.st_mtime_ns, path.read_text()


def test_dry_run_writes_nothing_and_clean_removes_a_killed_runs_namespaces(tmp_path):
    if not privilege.host_root():
        pytest.skip("namespaces of runs are named on the host only as root")
    holders = [start_holder(tmp_path) for _ in range(2)]
    for holder, _ in holders:
        holder.kill()
        holder.wait(timeout=10)
    no_lock, info = (run for _, run in holders)
    lock_of = {run["run_id"]: naming.lock_dir() / f"nsd{run['run_id']}.lock"
               for run in (no_lock, info)}
    # A run killed by an older netsim-ddp, or another's: no lock file.
    lock_of[no_lock["run_id"]].unlink()
    kept = lock_file_state(lock_of[info["run_id"]])
    namespaces = no_lock["namespaces"] + info["namespaces"]
    dry = run_clean("--dry-run")
    assert dry.returncode == 0, dry.stderr
    for name in namespaces:
        assert f"would remove namespace {name}" in dry.stdout
    assert not lock_of[no_lock["run_id"]].exists()  # not created to look
    assert lock_file_state(lock_of[info["run_id"]]) == kept  # not rewritten
    assert set(namespaces) <= set(netns.list_names())
    result = run_clean()
    for name in namespaces:
        assert f"removed namespace {name}" in result.stdout
    assert not set(namespaces) & set(netns.list_names())
    assert not any(path.exists() for path in lock_of.values())


ROOTLESS_CLEAN = textwrap.dedent("""
    import json, os, subprocess, sys
    from netsim_ddp.fabric import naming, stale
    dead, live = sys.argv[1], sys.argv[2]
    os.setgroups([]); os.setgid(65534); os.setuid(65534)
    folder = naming.user_lock_dir(65534)
    live_lock = naming.RunLock(live, directory=folder)
    live_lock.acquire()
    dead_lock = naming.RunLock(dead, directory=folder)
    dead_lock.acquire()
    os.close(dead_lock.fd)  # its holder was SIGKILLed: lock dropped, file left
    leftover = subprocess.Popen(["sleep", "600"], env={naming.RUN_ID_ENV: dead})
    spared = subprocess.Popen(["sleep", "600"], env={naming.RUN_ID_ENV: live})
    dry = stale.clean_stale_runs(dry_run=True)
    done = stale.clean_stale_runs()
    leftover_code = leftover.wait(timeout=10)
    spared_alive = spared.poll() is None
    spared.kill()
    live_lock.release()
    print(json.dumps({"dry": vars(dry), "done": vars(done), "leftover": leftover_code,
                      "spared_alive": spared_alive,
                      "dead_lock_left": dead_lock.path.exists()}))
""")


def test_rootless_clean_sweeps_its_users_dead_runs_and_names_roots(tmp_path):
    if not privilege.host_root():
        pytest.skip("needs root to drop to an unprivileged user for the test")
    root_holder, root_run = start_holder(tmp_path)  # a dead root run: rootless can only list it
    root_holder.kill()
    root_holder.wait(timeout=10)
    dead, live = naming.new_run_id(), naming.new_run_id()
    made = not naming.user_lock_dir(65534).exists()  # then the user's runs here make it
    try:
        result = subprocess.run([sys.executable, "-c", ROOTLESS_CLEAN, dead, live],
                                capture_output=True, text=True, timeout=60, cwd="/")
        assert result.returncode == 0, result.stderr
        info = json.loads(result.stdout)
    finally:
        run_clean()
        if made:  # a full test run leaves nothing in /tmp
            shutil.rmtree(naming.user_lock_dir(65534), ignore_errors=True)
    assert info["dry"]["killed_processes"] >= 1 and dead in info["dry"]["removed_locks"]
    assert info["done"]["killed_processes"] >= 1 and dead in info["done"]["removed_locks"]
    assert live not in info["dry"]["removed_locks"] + info["done"]["removed_locks"]
    assert info["leftover"] == -signal.SIGKILL and not info["dead_lock_left"]
    assert info["spared_alive"] and live in info["done"]["live_runs"]
    assert set(root_run["namespaces"]) <= set(info["done"]["root_litter"])


def test_background_helpers_ignore_a_json_py_in_the_callers_cwd(tmp_path, monkeypatch):
    from netsim_ddp.fabric.background import BackgroundTraffic

    marker, cwd = tmp_path / "imported", tmp_path / "cwd"
    cwd.mkdir()
    (cwd / "json.py").write_text(f"open({str(marker)!r}, 'w').close()\n"
                                 "raise ImportError('the poisoned json.py was imported')\n")
    monkeypatch.chdir(cwd)
    scenario = Scenario.from_dict({
        "name": "b", "topology": {"nodes": 2}, "link": {"rate": "100mbit"},
        "background": [{"source": "n1", "destination": "n0", "on": "50ms", "off": "50ms"}]})
    with Fabric(scenario) as fabric:
        with BackgroundTraffic(fabric, scenario.background) as traffic:
            assert wait_until(lambda: fabric.counters()["n1"].sent_bytes > 100_000, 30)
            background = traffic.stop()
    assert background.total > 100_000 and not marker.exists()
