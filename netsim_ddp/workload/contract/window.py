"""The measured window, as the emulated network sees it.

Inside an emulated node (the harness sets NETSIM_DDP_NODE), each node's local rank 0 reads its
link's counters at the window's edges, after a barrier: every rank has then finished the previous
all-reduce, so everything sent before has left the queues and the marks are exact. Each node's
local rank 0 also drops a file at each edge in NETSIM_DDP_SIGNAL_DIR (common.signal_files), which
starts and stops the background traffic's schedule, so every mode meets the same schedule from
its first measured step. On one host every node's rank drops the same file (one folder); on a
multi-host run each host's folder gets its own, for the flows that start there.
"""

from __future__ import annotations

import contextlib
import os
from collections.abc import Callable, Iterator

from netsim_ddp.common.signal_files import END, SIGNAL_DIR_ENV, START, signal_file

NODE_ENV = "NETSIM_DDP_NODE"
# The scenario's node rank of the node a rank runs on: torchrun's c10d rendezvous numbers
# nodes (and so ranks) in an order of its own, so results name nodes by this, never rank // R.
NODE_RANK_ENV = "NETSIM_DDP_NODE_RANK"


def leads_node(local_rank: int) -> bool:
    """Whether this rank reads its node's counters: local rank 0 inside an emulated node."""
    return bool(os.environ.get(NODE_ENV)) and local_rank == 0


def step_loss_reader(local_rank: int) -> Callable[[], dict[str, int]] | None:
    """For the rank that leads its node: a reader of the node's TCP loss counters
    (fabric.tcp_counters.loss_counters), read at every measured step's edges so a slow step
    can name the losses inside it. None elsewhere (one reading per node is enough)."""
    if not leads_node(local_rank):
        return None
    from netsim_ddp.fabric.counters.tcp_counters import loss_counters

    return loss_counters


def counters_grew(before: dict[str, int], after: dict[str, int]) -> dict[str, int]:
    """The counters that grew from `before` to `after`, by how much (none grew: empty)."""
    return {name: after[name] - before[name]
            for name in after if name in before and after[name] > before[name]}


@contextlib.contextmanager
def measured_window(
    mode: str,
    local_rank: int,
    barrier: Callable[[], None],
    inner: contextlib.AbstractContextManager[object],
    marks: list[dict[str, float]],
) -> Iterator[None]:
    """Run the measured iterations inside `inner` (e.g. the profiler), marking both edges."""
    signals = os.environ.get(SIGNAL_DIR_ENV)
    measure_link = leads_node(local_rank)

    def edge(name: str) -> None:
        barrier()
        if measure_link:
            from netsim_ddp.fabric.counters.own_link import mark_own_link
            from netsim_ddp.fabric.counters.tcp_counters import tcp_mark

            mark = mark_own_link()
            if mark is not None:  # with the node's TCP counters (measure.tcp_evidence)
                marks.append({"monotonic_s": mark.monotonic_s, "sent_bytes": mark.sent_bytes,
                              "sent_packets": mark.sent_packets, **tcp_mark()})
        if signals and local_rank == 0:
            signal_file(signals, name, mode).touch()

    edge(START)
    with inner:
        yield
    edge(END)
