"""The agents' control channel: c10d's TCPStore hosted by member 0's agent (hellos,
heartbeats, the first abort, waiting for every member). Members are the hosts of `netsim-ddp
host` (one node each) or the machines of `netsim-ddp machine` (a share of the nodes each)."""

from __future__ import annotations

import contextlib
import json
import threading
import time
from collections.abc import Callable
from datetime import timedelta
from typing import Any, Protocol

from netsim_ddp.common.clock import estimate_offset
from netsim_ddp.run.hosts.host_options import HostError

CLOCK_ROUNDS = 8
PREFIX = "netsim-ddp/"


POLL_S = 0.2


HEARTBEAT_S = 1.0


class Member(Protocol):
    """What the channel needs of an agent's options: its rank among the members, their count,
    where member 0 listens, and how long to wait."""

    @property
    def node_rank(self) -> int: ...
    @property
    def nnodes(self) -> int: ...
    @property
    def master_addr(self) -> str: ...
    @property
    def master_port(self) -> int: ...
    @property
    def join_timeout_s(self) -> float: ...
    @property
    def heartbeat_timeout_s(self) -> float: ...


class Control:
    """The job's control channel: c10d's TCPStore, hosted by member 0's agent. `role`: what a
    member is called in messages ("node", "machine"); `names`: each member's name."""

    def __init__(self, options: Member, names: list[str], role: str = "node"):
        from torch.distributed import TCPStore

        self.options = options
        self.names = names
        self.role = role
        self.endpoint = f"{options.master_addr}:{options.master_port}"
        try:
            self.store = TCPStore(options.master_addr, options.master_port,
                                  is_master=options.node_rank == 0,
                                  timeout=timedelta(seconds=options.join_timeout_s),
                                  wait_for_workers=False)
        except (RuntimeError, ValueError) as exc:  # DistStoreError and kin
            if options.node_rank == 0:
                raise HostError(f"{role} 0 cannot listen on {self.endpoint}: {exc}") from None
            raise HostError(f"{role} 0 ({names[0]}) never arrived: no netsim-ddp {role} agent "
                            f"answered at {self.endpoint} within {options.join_timeout_s:g} s"
                            ) from None
        self.hellos: dict[int, dict[str, Any]] = {}
        self._beats: dict[int, tuple[int, float]] = {}
        self._stop = threading.Event()
        self._beater: threading.Thread | None = None

    # -- the store, with errors that say what went wrong -------------------------------------

    def _call(self, what: str, fn, *args):
        try:
            return fn(*args)
        except (RuntimeError, ValueError) as exc:
            raise HostError(f"lost contact with {self.role} 0 ({self.names[0]}) at {self.endpoint} "
                            f"while {what}: its agent exited or the network failed ({exc})"
                            ) from None

    def set(self, key: str, value: str | bytes) -> None:
        self._call(f"writing {key}", self.store.set, PREFIX + key, value)

    def get(self, key: str) -> bytes:
        return self._call(f"reading {key}", self.store.get, PREFIX + key)

    def has(self, key: str) -> bool:
        return bool(self._call(f"reading {key}", self.store.check, [PREFIX + key]))

    def get_json(self, key: str) -> Any:
        return json.loads(self.get(key))

    def describe(self, rank: int) -> str:
        hello = self.hellos.get(rank)
        host = f" (host {hello['hostname']}, {hello['address']})" if hello else ""
        return f"{self.role} {self.names[rank]}{host}"

    # -- failure ------------------------------------------------------------------------------

    def abort(self, reason: str) -> None:
        """Tell every agent to stop; the first reason posted is the one they all report."""
        entry = json.dumps({"node_rank": self.options.node_rank, "reason": reason})
        with contextlib.suppress(HostError, RuntimeError, ValueError):
            self.store.compare_set(PREFIX + "abort", "", entry)

    def raise_if_aborted(self) -> None:
        if self.has("abort"):
            entry = self.get_json("abort")
            if entry["node_rank"] != self.options.node_rank:
                raise HostError(f"{self.describe(entry['node_rank'])} failed: {entry['reason']}")
            raise HostError(entry["reason"])

    def join(self, hello: dict[str, Any], flags: tuple[str, str],
             named: Callable[[int], str]) -> None:
        """Post this member's hello, its rank claimed once; beat; wait for every member's
        hello (`named(rank)` names one that never arrives); member 0 then refuses any member
        given another scenario or options. `flags`: the options that give a member its rank
        and the member count (named in the errors)."""
        options, (rank_flag, count_flag) = self.options, flags
        mine = json.dumps(hello)
        claimed = self._call("saying hello", self.store.compare_set,
                             f"{PREFIX}hello/{options.node_rank}", "", mine)
        if claimed.decode() != mine:
            other = json.loads(claimed)
            raise HostError(f"{self.role} rank {options.node_rank} is already taken by host "
                            f"{other['hostname']} ({other['address']}): give each agent its "
                            f"own {rank_flag}")
        self.start_heartbeat()
        self.wait_for([f"hello/{rank}" for rank in range(options.nnodes)],
                      options.join_timeout_s, lambda missing: "never arrived within "
                      f"{options.join_timeout_s:g} s: "
                      + ", ".join(named(rank_of_key(key)) for key in missing), watch=False)
        self.hellos = {rank: self.get_json(f"hello/{rank}") for rank in range(options.nnodes)}
        if options.node_rank != 0:
            return
        for rank, other in self.hellos.items():
            if other["digest"] != hello["digest"]:
                raise HostError(f"{self.describe(rank)} was given a different scenario or "
                                f"options than {self.role} 0: every agent runs the same file "
                                f"with the same {count_flag} and --iterations")

    def start_heartbeat(self) -> None:
        def beat() -> None:
            from torch.distributed import TCPStore

            with contextlib.suppress(RuntimeError, ValueError):
                store = TCPStore(self.options.master_addr, self.options.master_port,
                                 is_master=False, timeout=timedelta(seconds=30))
                while not self._stop.wait(HEARTBEAT_S):
                    store.add(f"{PREFIX}beat/{self.options.node_rank}", 1)

        self._beater = threading.Thread(target=beat, name="netsim-ddp-heartbeat", daemon=True)
        self._beater.start()

    def silent(self) -> list[int]:
        """Nodes whose heartbeat has not moved for --heartbeat-timeout: gone."""
        now, gone = time.monotonic(), []
        for rank in self.hellos:
            if rank == self.options.node_rank:
                continue
            count = int(self._call("reading heartbeats", self.store.add,
                                   f"{PREFIX}beat/{rank}", 0))
            last = self._beats.get(rank)
            if last is None or count != last[0]:
                self._beats[rank] = (count, now)
            elif now - last[1] > self.options.heartbeat_timeout_s:
                gone.append(rank)
        return gone

    def check_heartbeats(self) -> None:
        """A host whose heartbeat stopped is gone: abort naming it."""
        gone = self.silent()
        if gone:
            reason = (f"{self.describe(gone[0])} stopped answering for "
                      f"{self.options.heartbeat_timeout_s:g} s: its agent died or its host went "
                      "away")
            self.abort(reason)
            raise HostError(reason)

    def check(self) -> None:
        """Raise if another member aborted the job or went silent (naming it)."""
        self.raise_if_aborted()
        self.check_heartbeats()

    def wait_for(self, keys: list[str], timeout_s: float | None, what: Callable[[list[str]], str],
                 watch: bool = True) -> None:
        """Until every key exists; watching for an abort and for silent hosts meanwhile."""
        deadline = None if timeout_s is None else time.monotonic() + timeout_s
        while True:
            missing = [key for key in keys if not self.has(key)]
            if not missing:
                return
            if watch:
                self.check()
            if deadline is not None and time.monotonic() > deadline:
                raise HostError(what(missing))
            time.sleep(POLL_S)

    def summary(self, wait_s: float, about: Callable[[int, dict[str, Any]], dict[str, object]],
                posted: dict[str, str]) -> dict[int, dict[str, object]]:
        """Per member: `about(rank, hello)` and, for each `posted` key prefix, the JSON the
        member posted there (None if it posted none), once every member still beating has
        posted `restored/` (waiting at most `wait_s`: a dead agent never answers)."""
        deadline = time.monotonic() + wait_s
        with contextlib.suppress(HostError):
            while time.monotonic() < deadline:
                gone = set(self.silent())
                if all(self.has(f"restored/{rank}") for rank in range(self.options.nnodes)
                       if rank not in gone):
                    break
                time.sleep(POLL_S)
        summary: dict[int, dict[str, object]] = {}
        for rank, hello in sorted(self.hellos.items()):
            entry = about(rank, hello)
            for prefix, field in posted.items():
                with contextlib.suppress(HostError):
                    key = f"{prefix}/{rank}"
                    entry[field] = self.get_json(key) if self.has(key) else None
            summary[rank] = entry
        return summary

    # -- one clock for the job ---------------------------------------------------------------

    def serve_clock(self) -> None:
        """Node 0: answer every other node's clock requests (store.wait wakes at once)."""
        for rank in range(1, self.options.nnodes):
            for round_ in range(CLOCK_ROUNDS):
                key = f"clock/{rank}/{round_}"
                self._call(f"waiting for {self.describe(rank)}'s clock request",
                           self.store.wait, [f"{PREFIX}{key}/ask"],
                           timedelta(seconds=self.options.join_timeout_s))
                self.set(f"{key}/answer", repr(time.monotonic()))

    def offset_to_node0(self) -> tuple[float, float]:
        """Other nodes: (seconds to add to this host's CLOCK_MONOTONIC to get node 0's, the
        error bound)."""
        rounds = iter(range(CLOCK_ROUNDS))

        def exchange() -> float:
            key = f"clock/{self.options.node_rank}/{next(rounds)}"
            self.set(f"{key}/ask", "")
            self._call("waiting for node 0's clock", self.store.wait,
                       [f"{PREFIX}{key}/answer"], timedelta(seconds=self.options.join_timeout_s))
            return float(self.get(f"{key}/answer"))

        return estimate_offset(exchange, CLOCK_ROUNDS)

    def close(self) -> None:
        self._stop.set()
        if self._beater is not None:
            self._beater.join(timeout=5)


def constant_message(message: str) -> Callable[[list[str]], str]:
    """A `missing` formatter for Control.wait_for that says `message` whoever is missing."""
    return lambda _missing: message


def rank_of_key(key: str) -> int:
    """The member rank a store key ends in (`.../3` -> 3)."""
    return int(key.rsplit("/", 1)[1])
