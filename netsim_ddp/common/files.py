"""Files written whole: a reader (a process polling for the file, a later run, a user) sees the
old file or the new one, never half of one."""

from __future__ import annotations

from pathlib import Path


def write_whole(path: str | Path, data: str | bytes) -> Path:
    """Write `data` to `path` through a temporary file beside it and a rename."""
    path = Path(path)
    temporary = path.with_name(path.name + ".tmp")
    if isinstance(data, bytes):
        temporary.write_bytes(data)
    else:
        temporary.write_text(data)
    temporary.replace(path)
    return path
