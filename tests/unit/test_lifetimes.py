"""Each run owns its files, and its lock proves it alive (no namespaces, no processes)."""

import os
import tempfile
from pathlib import Path

import pytest

from netsim_ddp import Scenario
from netsim_ddp.fabric import naming
from netsim_ddp.fabric.background import BackgroundBytes, BackgroundTraffic
from netsim_ddp.run import folders, runner
from netsim_ddp.run.folders import run_folder
from netsim_ddp.scenario.workload import WorkloadConfig
from netsim_ddp.verdicts.gate import Verdict
from netsim_ddp.verdicts.scenario_report import ScenarioReport
from netsim_ddp.workload import RankSpec, launch


@pytest.fixture
def lock_dir(tmp_path, monkeypatch):
    directory = tmp_path / "locks"
    monkeypatch.setattr(naming, "_lock_dir", directory)
    return directory


def test_a_lock_taken_on_a_file_unlinked_meanwhile_is_taken_again(lock_dir, monkeypatch):
    # The race: a run opens its lock file; before it flocks, `clean` (holding the flock of
    # that file, since the run is not yet holding it) unlinks it as an orphan. The run then
    # flocks a file nobody can find: the next `clean` would create a new file, lock it, and
    # take the live run for dead. The hook puts clean's move exactly into that gap.
    run = naming.RunLock("abc123")
    cleaner = naming.RunLock("abc123")
    interleaved = []

    def clean_in_the_gap():
        if not interleaved:
            interleaved.append(True)
            assert cleaner.acquire(wait=False)  # nobody holds it yet: an "orphan"
            cleaner.release(remove=True)

    monkeypatch.setattr(naming, "_between_open_and_flock", clean_in_the_gap)
    assert run.acquire(wait=False)
    monkeypatch.setattr(naming, "_between_open_and_flock", lambda: None)
    assert interleaved
    held, at_path = os.fstat(run.fd), os.stat(run.path)
    assert (held.st_dev, held.st_ino) == (at_path.st_dev, at_path.st_ino)
    # ...so the run is provably alive to anyone who looks now.
    assert not naming.RunLock("abc123").acquire(wait=False)
    assert naming.is_live("abc123")
    run.release()
    assert not naming.is_live("abc123")


def test_liveness_probe_writes_nothing(lock_dir):
    assert not naming.is_live("abc123")
    assert not lock_dir.exists()  # no folder, no file made just to look
    run = naming.RunLock("abc123")
    assert run.acquire()
    before = sorted(os.listdir(lock_dir))
    assert naming.is_live("abc123")
    assert sorted(os.listdir(lock_dir)) == before
    run.release()
    assert os.listdir(lock_dir) == []


def test_a_lock_folder_that_is_not_safely_ours_is_refused(tmp_path):
    elsewhere = tmp_path / "elsewhere"
    elsewhere.mkdir()
    link = tmp_path / "netsim-ddp-1000"
    link.symlink_to(elsewhere)
    with pytest.raises(naming.LockDirError, match="symlink"):
        naming.RunLock("abc123", directory=link).acquire()
    shared = tmp_path / "shared"
    shared.mkdir()
    shared.chmod(0o777)
    with pytest.raises(naming.LockDirError, match="remove it"):
        naming.RunLock("abc123", directory=shared).acquire()
    assert list(elsewhere.iterdir()) == [] and list(shared.iterdir()) == []


@pytest.fixture
def temp_root(tmp_path, monkeypatch):
    """The temporary folder every tempfile.mkdtemp here makes its folders in."""
    root = tmp_path / "tmp"
    root.mkdir()
    monkeypatch.setattr(tempfile, "tempdir", str(root))
    return root


def test_every_run_gets_a_fresh_folder_and_latest_points_at_it(tmp_path, temp_root):
    first = run_folder(tmp_path, "aaaaaa")
    (first / "signals").mkdir()
    (first / "signals" / "start-fp32").touch()
    second = run_folder(tmp_path, "bbbbbb")
    assert first != second and list(second.iterdir()) == []
    assert (tmp_path / "latest").resolve() == second.resolve()
    with pytest.raises(FileExistsError):
        run_folder(tmp_path, "bbbbbb")  # never two runs in one folder
    assert run_folder(None, "cccccc").parent == temp_root
    assert [p.name[:21] for p in temp_root.iterdir()] == ["netsim-ddp-run-cccccc"]


@pytest.mark.parametrize(("outcome", "kept"), [
    ({}, False), ({"refused": "the probe reached 80% of the link"}, False),
    ({"error": "rank 1 crashed"}, True),
    ({"checks": [Verdict("amp-fp16 vs fp32", False, "not faster")]}, True)])
def test_a_temporary_run_folder_is_removed_unless_someone_will_read_its_logs(
        temp_root, monkeypatch, outcome, kept):
    # Without --out every run wrote a /tmp folder and left it, hundreds a day under CI.
    scenario = Scenario.from_dict({"name": "tidy", "topology": {"nodes": 2},
                                   "link": {"rate": "10gbit"}})

    def run_in_folder(scenario, dilation, *, out_dir, **_):
        folder = run_folder(out_dir, "dddddd")
        (folder / "train").mkdir()
        return ScenarioReport(scenario, out_dir=folder, **outcome)

    monkeypatch.setattr(runner, "_run_in_folder", run_in_folder)
    report = runner._run_at(scenario, 1.0, out_dir=None)
    assert (report.out_dir is not None) is kept
    assert len(list(temp_root.iterdir())) == kept
    out = temp_root.parent / "out"
    given = runner._run_at(scenario, 1.0, out_dir=out)  # a folder the user named stays
    assert given.out_dir is not None and given.out_dir.is_dir()


def test_background_traffic_makes_no_folder_before_an_end_starts(temp_root):
    # Made in __init__, a folder outlived every object whose ends never started (the unit
    # tests' own helpers left over a hundred).
    traffic = BackgroundTraffic(None, [])
    assert list(temp_root.iterdir()) == []
    traffic.stop()
    assert list(temp_root.iterdir()) == []


def test_background_reports_sit_in_the_run_folder_beside_the_signals(temp_root, tmp_path):
    # In /tmp, a run killed before it stopped its flows (SIGKILL: no finally runs) left the
    # folder loose there, one per full test run; in the run's folder it stays with its logs.
    signals = tmp_path / "run" / "signals"
    signals.mkdir(parents=True)
    traffic = BackgroundTraffic(None, [], signals=signals)
    folder = traffic._reports
    assert folder.parent == signals.parent and folder.is_dir()
    assert list(temp_root.iterdir()) == []
    traffic.stop()
    assert not folder.exists()


def test_background_traffic_refuses_an_earlier_runs_signals(tmp_path):
    (tmp_path / "start-fp32").touch()
    with pytest.raises(ValueError, match="earlier run's signals"):
        BackgroundTraffic(None, [], signals=tmp_path)


def test_launch_refuses_a_folder_holding_an_earlier_runs_files(tmp_path):
    (tmp_path / "logs" / "n0").mkdir(parents=True)
    (tmp_path / "logs" / "n0" / "error.json").write_text("{}")

    class NeverStarted:
        name, address = "n0", "127.0.0.1"

        def popen(self, argv, **kwargs):
            raise AssertionError("launch started a process in a used folder")

    spec = RankSpec(workload=WorkloadConfig(params=1000, iterations=1, modes=["fp32"]))
    with pytest.raises(ValueError, match="not empty"):
        launch([NeverStarted()], spec, tmp_path, 10)


def bytes_with(windows):
    return BackgroundBytes(series=((),), windows=(("sender in n1", tuple(windows)),))


def test_a_sender_that_followed_the_window_passes():
    assert bytes_with([("fp32", 10.001, 12.0)]).missed_window("fp32", 10.0, 11.9) == []


@pytest.mark.parametrize("windows, reason", [
    ([], "never saw the window start"),
    ([("amp", 10.001, 12.0)], "never saw the window start"),
    ([("fp32", 2.0, 2.001)], "-8.000 s from its start"),  # a replayed, stale start file
    ([("fp32", 12.5, 13.0)], "outside the 1.900 s window"),  # starved past the window
])
def test_a_sender_that_missed_the_window_is_named(windows, reason):
    (problem,) = bytes_with(windows).missed_window("fp32", 10.0, 11.9)
    assert problem.startswith("the sender in n1") and reason in problem


def test_senders_without_signals_are_not_judged():
    assert BackgroundBytes(series=((),)).missed_window("fp32", 10.0, 11.9) == []


def test_rootless_locks_live_in_the_users_own_folder():
    assert naming.user_lock_dir(1000) == Path(naming.tempfile.gettempdir()) / "netsim-ddp-1000"


def test_the_root_cause_is_a_ranks_own_error_before_any_echo_of_it(tmp_path):
    # Forked ranks die within the same second: n0's rank, cut off by n1's crash, wrote its
    # error file first and its agent exited first, yet n1's own error is the cause.
    import json

    from netsim_ddp.workload.launcher.launch import failure_report

    class Node:
        def __init__(self, name):
            self.name = name

    for node, text in (("n0", "RuntimeError: [pair.cc:553] Connection closed by peer"),
                       ("n1", "RuntimeError: factory exploded on purpose")):
        rank_dir = tmp_path / node / "none_x" / "attempt_0" / "0"
        rank_dir.mkdir(parents=True)
        (rank_dir / "error.json").write_text(json.dumps(
            {"message": {"message": text, "extraInfo": {"timestamp": "1700000000"}}}))
        (rank_dir / "stderr.log").write_text(f"Traceback\n{text}\n")
    report = failure_report([Node("n0"), Node("n1")], tmp_path, failed=[0, 1])
    assert report.startswith("node n1 failed first: RuntimeError: factory exploded on purpose")
    assert "also failed: node n0: RuntimeError: [pair.cc:553] Connection closed" in report


@pytest.mark.parametrize(("status", "kept"), [("passed", False), ("failed", True)])
def test_an_agents_temporary_folder_goes_with_its_finished_job(temp_root, status, kept):
    # `netsim-ddp host` / `machine` without --out: a follower hears the leader's verdict.
    from netsim_ddp.cli import run as cli_run

    folder = run_folder(None, "eeeeee")
    (folder / "train").mkdir()  # the ranks' logs
    with pytest.raises(SystemExit):
        cli_run._run_agent(lambda: status, None, None, None, first=False, member="n1",
                           leader="n0", temporary=folder)
    assert folder.exists() is kept


def test_an_empty_temporary_folder_goes_whatever_the_outcome(temp_root):
    # An agent refused or broken before anything ran wrote nothing there to read.
    empty, written = run_folder(None, "ffffff"), run_folder(None, "gggggg")
    (written / "logs").mkdir()
    assert folders.remove_when_done(empty, "error") and not empty.exists()
    assert not folders.remove_when_done(written, "error") and written.exists()
    assert not folders.remove_when_done(None, "passed")
