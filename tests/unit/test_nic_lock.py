"""The NIC record's lock: taken on the file that is at the path (no network needed)."""

import fcntl
import os

from netsim_ddp.fabric import naming
from netsim_ddp.fabric.nic import shaping


def test_a_lock_file_unlinked_before_the_flock_is_taken_again(tmp_path, monkeypatch):
    """Whoever holds a lock may unlink its file (a finishing agent, `clean`); a lock taken
    on the unlinked file proves nothing, since the next comer makes a new file and locks it:
    `clean` could take a live agent for dead."""
    monkeypatch.setattr(naming, "_lock_dir", tmp_path)
    path = shaping.state_path("eth9", inode=1)
    real_flock, raced = fcntl.flock, []

    def flock(fd, operation):
        if not raced:  # between our open and our flock, the holder unlinks the file
            raced.append(True)
            os.unlink(path.with_suffix(".lock"))
        return real_flock(fd, operation)

    monkeypatch.setattr(fcntl, "flock", flock)
    fd = shaping.lock_state(path, wait=False)
    assert fd is not None and raced
    try:
        assert os.fstat(fd).st_ino == os.stat(path.with_suffix(".lock")).st_ino
    finally:
        os.close(fd)
