"""Wire accounting: what the nodes sent within a mode's measured window (their own NIC
counters at the window's edges), and background traffic's share of it."""

from __future__ import annotations

from netsim_ddp.fabric.background import BackgroundBytes
from netsim_ddp.workload import ModeResult, WorkloadError


def _link_marks(result: ModeResult) -> list[tuple[dict[str, float], dict[str, float]]]:
    """(start, end) link counters of every node: local rank 0 of each reads its node's."""
    nodes = result.world_size // max(result.local_world_size, 1)
    leaders = [rank for rank in result.ranks if rank.local_rank == 0]
    missing = [rank.rank for rank in leaders if not rank.link_marks]
    if missing or len(leaders) != nodes:
        raise WorkloadError(
            f"mode {result.mode}: {len(leaders) - len(missing)} of {nodes} nodes reported their "
            f"link counters (ranks {missing} did not): their bytes would count as zero")
    marks = []
    for rank in leaders:
        assert rank.link_marks is not None
        if len(rank.link_marks) != 2:
            raise WorkloadError(f"mode {result.mode}: rank {rank.rank} reported "
                                f"{len(rank.link_marks)} link marks, not start and end")
        start, end = rank.link_marks
        if end["sent_bytes"] < start["sent_bytes"] or end["monotonic_s"] < start["monotonic_s"]:
            raise WorkloadError(f"mode {result.mode}: rank {rank.rank}'s link counters went "
                                f"backwards ({start} -> {end})")
        marks.append((start, end))
    return marks


def link_marks_window(result: ModeResult) -> tuple[float, float] | None:
    """(start, end) CLOCK_MONOTONIC of the mode's measured iterations, from the link marks."""
    marks = [rank.link_marks for rank in result.ranks if rank.link_marks]
    if not marks:
        return None
    return (min(m[0]["monotonic_s"] for m in marks), max(m[-1]["monotonic_s"] for m in marks))


def window_bytes(result: ModeResult, background: BackgroundBytes) -> tuple[float, float]:
    """(all bytes the nodes sent, background's share) within the mode's measured window."""
    marks = _link_marks(result)
    total = sum(end["sent_bytes"] - start["sent_bytes"] for start, end in marks)
    begin = min(start["monotonic_s"] for start, _ in marks)
    finish = max(end["monotonic_s"] for _, end in marks)
    return total, background.between(begin, finish)


def check_background_followed(result: ModeResult, background: BackgroundBytes) -> None:
    """Every background sender must have followed this mode's measured window; else the
    background bytes are not a measurement of it (0 would pass for "no traffic")."""
    marks = [rank.link_marks for rank in result.ranks if rank.link_marks]
    begin = min(start["monotonic_s"] for start, _ in marks)
    finish = max(end["monotonic_s"] for _, end in marks)
    missed = background.missed_window(result.mode, begin, finish)
    if missed:
        raise WorkloadError(f"mode {result.mode}: background traffic did not run in its measured "
                            f"window: {'; '.join(missed)}")
