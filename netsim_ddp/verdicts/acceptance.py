"""Acknowledged regressions: what ends one in the history gate (verdicts.history).

A regression stays one however many runs follow it; only a saved acknowledgement makes an
intended change (a bigger model, a slower but safer setting) the new reference. `netsim-ddp
history --accept RUN` appends a line to ACCEPTED_FILE in the folder that holds the run's
results file; the folder is the history, so the acknowledgement travels with it (commit it,
cache it in CI). Each line names the accepted results file by its name, when its run was
recorded, and when it was accepted. The name ends in .jsonl, so a folder's `*.json` results
never include it.
"""

from __future__ import annotations

import datetime
import json
from collections.abc import Iterable
from pathlib import Path

ACCEPTED_FILE = "netsim-ddp-accepted.jsonl"


class AcceptanceError(ValueError):
    """An acknowledgement that cannot be read or recorded."""


def accepted_names(folder: str | Path) -> set[str]:
    """The results files accepted in `folder` (their names); none when it has no marker."""
    path = Path(folder) / ACCEPTED_FILE
    if not path.is_file():
        return set()
    names = set()
    for number, line in enumerate(path.read_text().splitlines(), start=1):
        if not line.strip():
            continue
        try:
            entry = json.loads(line)
            names.add(str(entry["run"]))
        except (ValueError, KeyError, TypeError):
            raise AcceptanceError(f"{path}, line {number}: not an acknowledgement "
                                  "({\"run\": FILE, ...}); fix or delete the line") from None
    return names


def accepted_sources(sources: Iterable[str]) -> set[str]:
    """Which of these results files (paths as given) are accepted in their own folder."""
    sources = list(sources)
    by_folder = {str(Path(source).parent) for source in sources}
    accepted = {folder: accepted_names(folder) for folder in by_folder}
    return {source for source in sources if Path(source).name in accepted[str(Path(source).parent)]}


def record_acceptance(source: str, created_at: str | None) -> Path:
    """Append the acknowledgement of the results file `source` to its folder's marker file."""
    path = Path(source).parent / ACCEPTED_FILE
    entry = {"run": Path(source).name, "created_at": created_at,
             "accepted_at": datetime.datetime.now(datetime.UTC).isoformat(timespec="seconds")}
    with path.open("a") as marker:
        marker.write(json.dumps(entry) + "\n")
    return path
