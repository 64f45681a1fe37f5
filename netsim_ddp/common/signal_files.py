"""The measured windows' signal files: how the ranks tell the harness's helpers (background
flows, the link scheduler) that a mode's measured iterations start and end, across process and
namespace boundaries, with nothing but a shared folder.

Each node's local rank 0 creates `start-MODE` after the barrier that opens the window and
`end-MODE` after the one that closes it (on one host every node writes the same file into one
folder; on a multi-host run each host's folder gets its own). A follower takes each `start-`
file it has not seen as a new window and keeps to it until that mode's `end-` file exists. The
folder must be fresh for every run: an earlier run's files would be replayed as windows.
"""

from __future__ import annotations

from pathlib import Path

SIGNAL_DIR_ENV = "NETSIM_DDP_SIGNAL_DIR"  # where the ranks find the folder
START, END = "start", "end"


def signal_file(directory: Path | str, edge: str, mode: str) -> Path:
    """The file each node's local rank 0 creates when a mode's measured window starts or ends."""
    return Path(directory) / f"{edge}-{mode}"


def new_window(directory: Path, seen: set[str]) -> str | None:
    """The mode of a window that started and is not in `seen` (added to it), or None yet.
    A folder not made yet has no windows."""
    try:
        names = sorted(entry.name for entry in directory.iterdir())
    except FileNotFoundError:
        return None
    for name in names:
        if name.startswith(f"{START}-") and name not in seen:
            seen.add(name)
            return name.removeprefix(f"{START}-")
    return None


def window_ended(directory: Path, mode: str) -> bool:
    return signal_file(directory, END, mode).exists()
