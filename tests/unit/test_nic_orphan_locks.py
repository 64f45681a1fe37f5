"""`netsim-ddp clean` removes the lock files of NIC records that are gone, and no other."""

from __future__ import annotations

import fcntl
import os

from netsim_ddp.fabric import naming
from netsim_ddp.fabric.nic.cleanup import remove_orphan_locks
from netsim_ddp.fabric.nic.shaping import STATE_PREFIX


def test_only_unheld_locks_without_a_record_go(tmp_path, monkeypatch):
    monkeypatch.setattr(naming, "_lock_dir", tmp_path)
    orphan = tmp_path / f"{STATE_PREFIX}1-eth0.lock"
    recorded = tmp_path / f"{STATE_PREFIX}2-eth0.lock"
    held = tmp_path / f"{STATE_PREFIX}3-eth0.lock"
    for lock in (orphan, recorded, held):
        lock.touch()
    recorded.with_suffix(".json").write_text("{}")
    holder = os.open(held, os.O_RDWR)  # an agent between taking its lock and its record
    fcntl.flock(holder, fcntl.LOCK_EX)
    try:
        assert remove_orphan_locks(dry_run=True) == [orphan]
        assert orphan.exists()  # a dry run only says
        assert remove_orphan_locks() == [orphan]
    finally:
        os.close(holder)
    assert not orphan.exists()
    assert recorded.exists() and held.exists()
