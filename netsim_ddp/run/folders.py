"""A run's folder: its own, made fresh (never shared with an earlier run's files), and a
temporary one removed once nobody will read it."""

from __future__ import annotations

import shutil
import tempfile
from pathlib import Path


def remove_when_done(temporary: Path | None, status: str) -> bool:
    """Remove a run's temporary folder (none given: nothing) once nobody will read it: the run
    passed or was untrusted (its JSON says what the host did), or the folder is empty. A failed
    or erred run keeps its logs. True if removed."""
    if temporary is None or not temporary.is_dir():
        return False
    if status in ("failed", "error") and any(temporary.iterdir()):
        return False
    shutil.rmtree(temporary, ignore_errors=True)
    return True


def run_folder(base: Path | None, run_id: str) -> Path:
    """A folder only this run writes: `base/run-<run id>`, made fresh, with `base/latest`
    pointing at it (a temporary folder without `base`). A folder shared with an earlier run
    would replay its signals to the background flows and lend it its result and error files."""
    if base is None:
        return Path(tempfile.mkdtemp(prefix=f"netsim-ddp-run-{run_id}-"))
    base.mkdir(parents=True, exist_ok=True)
    out = base / f"run-{run_id}"
    out.mkdir()  # FileExistsError rather than share one
    latest = base / f".latest-{run_id}"
    latest.symlink_to(out.name)
    latest.replace(base / "latest")  # atomic: parallel runs never see it half-made
    return out
