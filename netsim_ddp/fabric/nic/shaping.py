"""Shape a real host's NIC to a scenario's link, and put it back exactly as it was.

`ShapedNic` is what `netsim-ddp host` wraps its run in. Before anything changes it records the
NIC's root qdisc tree (every qdisc and class: kind, handle, parent, and the kernel's own encoding
of its parameters) and its ingress qdisc in a state file under /run/netsim-ddp/, and holds an
flock on it while it lives. Then it shapes:

- egress: a tbf at the root (netem above it when the link has delay, jitter or loss; refused
  where the kernel has no netem), replacing the root in one netlink call, so there is no
  unshaped instant;
- ingress, where the kernel has ifb and no other software owns the NIC's ingress hook: an
  `ingress` qdisc whose match-all u32 filter redirects every received packet to an ifb device,
  shaped by the same tbf.

Restoring (on exit, exception and the signals the agent turns into exceptions; `netsim-ddp
clean` for an agent that was SIGKILLed) removes the ifb and the ingress qdisc it added and puts
the recorded root back: a default root (handle 0, the kernel's choice) by deleting ours, which
makes the kernel attach its default again; anything else by sending the recorded messages back
to the kernel. Then the NIC is dumped again and compared with the record: a difference is an
error that names it, and the state file stays for `netsim-ddp clean`.
"""

from __future__ import annotations

import contextlib
import errno
import json
import os
import socket
import time
from collections.abc import Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from pyroute2 import IPRoute
from pyroute2.netlink.exceptions import NetlinkError
from pyroute2.netlink.rtnl import TC_H_ROOT

from netsim_ddp.fabric import naming
from netsim_ddp.fabric.nic.checks import (
    NicError,
    NicInfo,
    check_may_shape,
    check_nic,
    ifb_available,
    inspect_nic,
    netem_available_here,
)
from netsim_ddp.fabric.nic.job_plan import (
    EGRESS_CHILD_HANDLE,
    EGRESS_HANDLE,
    EGRESS_NETEM_HANDLE,
    ETH_P_IP,
    NicPlan,
    NicPlanError,
    egress_plan,
    ingress_filters,
)
from netsim_ddp.fabric.nic.tc_tree import (
    TC_H_INGRESS,
    NicSnapshot,
    TreeError,
    describe_handle,
    rehearse,
    replay,
    root_filters,
    snapshot,
)
from netsim_ddp.fabric.plan import tbf
from netsim_ddp.fabric.teardown_signals import signals_deferred
from netsim_ddp.scenario.spec import EffectiveLink

# The tree's record lives in tc_tree.py, the plan in job_plan.py, the checks before shaping in
# checks.py, cleaning up after killed agents in cleanup.py.

STATE_VERSION = 2  # 2: the record names its namespace (cookie) and NIC (MAC) beyond the inode
INGRESS_HANDLE = 0xFFFF0000
FILTER_PRIO = 49152  # our redirect filter's priority on the ingress qdisc we add
ETH_P_ALL = 0x0003
SO_NETNS_COOKIE = 71  # Linux >= 5.14: a namespace's id, never reused while the host is up
STATE_PREFIX = "nic-"
JOB_ENV = "NETSIM_DDP_HOST_JOB"  # marks every process an agent starts, for `clean`
# Signals that must not cut a restore short (a scheduler's second SIGTERM, a second Ctrl-C).


class NicRestoreError(NicError):
    """The NIC did not come back as recorded; its state file is kept for `netsim-ddp clean`."""


_handle = describe_handle


# -- the NIC itself --------------------------------------------------------------------------


def netns_inode() -> int:
    return os.stat("/proc/thread-self/ns/net").st_ino


def netns_cookie() -> int | None:
    """This network namespace's cookie: unlike its inode, never given to another namespace
    while the host is up (None before Linux 5.14)."""
    try:
        with socket.socket(socket.AF_INET, socket.SOCK_DGRAM) as sock:
            return int.from_bytes(sock.getsockopt(socket.SOL_SOCKET, SO_NETNS_COOKIE, 8),
                                  "little")
    except OSError:
        return None


# -- the plan --------------------------------------------------------------------------------


def ifb_name(index: int) -> str:
    return f"{naming.PREFIX}ifb{index}"[: 15]


# -- state files -----------------------------------------------------------------------------


def state_path(ifname: str, inode: int | None = None) -> Path:
    """One per NIC and network namespace (hosts simulated as namespaces share /run)."""
    inode = netns_inode() if inode is None else inode
    return naming.lock_dir() / f"{STATE_PREFIX}{inode}-{ifname}.json"


@dataclass
class NicState:
    ifname: str
    index: int
    netns_inode: int
    job: str
    pid: int
    before: NicSnapshot
    egress_handles: list[int] = field(default_factory=list)
    ifb: str | None = None  # the ifb device made for ingress shaping
    added_ingress: bool = False  # the ingress qdisc is ours (no other software had one)
    netns_cookie: int | None = None  # None: recorded where the kernel gives no cookie
    mac: str | None = None

    def write(self, path: Path) -> None:
        data = {"version": STATE_VERSION, "ifname": self.ifname, "index": self.index,
                "netns_inode": self.netns_inode, "netns_cookie": self.netns_cookie,
                "mac": self.mac, "job": self.job, "pid": self.pid,
                "recorded_at": time.time(), "before": self.before.as_dict(),
                "egress_handles": self.egress_handles, "ifb": self.ifb,
                "added_ingress": self.added_ingress}
        tmp = path.with_suffix(".tmp")
        with open(tmp, "w") as handle:
            json.dump(data, handle, indent=1)
            handle.flush()
            os.fsync(handle.fileno())
        tmp.replace(path)  # whole or absent, never half-written

    @classmethod
    def read(cls, path: Path) -> NicState:
        data = json.loads(path.read_text())
        if data.get("version") not in (1, STATE_VERSION):  # 1: without cookie and MAC
            raise NicError(f"{path}: state version {data.get('version')}, expected "
                           f"{STATE_VERSION}; restore this NIC by hand, then "
                           f"`netsim-ddp clean --forget-nic {data.get('ifname')}`")
        return cls(ifname=data["ifname"], index=data["index"], netns_inode=data["netns_inode"],
                   job=data["job"], pid=data["pid"],
                   before=NicSnapshot.from_dict(data["before"]),
                   egress_handles=data["egress_handles"], ifb=data["ifb"],
                   added_ingress=data["added_ingress"],
                   netns_cookie=data.get("netns_cookie"), mac=data.get("mac"))

    def stranger(self) -> str | None:
        """Why this record is not of the NIC it names in the namespace we are in (its
        namespace is gone and another got its inode, or its NIC is gone and another got its
        name); None if it is that NIC's."""
        if self.netns_inode != netns_inode():
            return "its network namespace is gone"
        cookie = netns_cookie()
        if None not in (cookie, self.netns_cookie) and cookie != self.netns_cookie:
            return ("its network namespace is gone (another namespace has its inode now, "
                    "a different cookie)")
        with IPRoute() as ipr:
            links = ipr.link_lookup(ifname=self.ifname)
            link = ipr.get_links(links[0])[0] if links else None
        if link is None:
            return f"{self.ifname} is gone"
        if link["index"] != self.index or (self.mac is not None
                                           and link.get_attr("IFLA_ADDRESS") != self.mac):
            return (f"{self.ifname} is another NIC now (index {link['index']}, MAC "
                    f"{link.get_attr('IFLA_ADDRESS')}; recorded: index {self.index}, MAC "
                    f"{self.mac})")
        return None


def lock_state(path: Path, wait: bool) -> int | None:
    """An flock on the state's lock file: held while an agent shapes the NIC. Re-checked to
    still be the file at the path once held (naming.flock_current): a lock file its holder
    unlinked meanwhile proves nothing."""
    path.parent.mkdir(parents=True, exist_ok=True)
    return naming.flock_current(path.with_suffix(".lock"), os.O_RDWR | os.O_CREAT, wait)


def unlock_state(path: Path, fd: int) -> None:
    """Release lock_state's flock, its lock file removed first so no later comer locks it."""
    with contextlib.suppress(FileNotFoundError):
        path.with_suffix(".lock").unlink()
    os.close(fd)


# -- shaping and restoring -------------------------------------------------------------------


def _restore_root(ipr: IPRoute, index: int, state: NicState) -> None:
    roots = [m for m in ipr.get_qdiscs(index=index) if m["parent"] == TC_H_ROOT]
    current = roots[0]["handle"] if roots else 0
    if current not in state.egress_handles:
        return  # never shaped, or already restored
    before = state.before
    if before.default_root:
        ipr.tc("del", index=index, handle=current, parent=TC_H_ROOT)  # the kernel's default
        if not before.explicit:
            return
    replay(ipr, index, before, keep_root=before.default_root)


def restore_nic(ipr: IPRoute, state: NicState) -> None:
    """Undo what `state` says was done, step by step (each a no-op when not needed), every
    step tried; then the NIC is compared with the record. Any failure is a NicRestoreError
    naming every step that failed and every difference left."""
    problems: list[str] = []
    if state.ifb:
        try:
            found = ipr.link_lookup(ifname=state.ifb)
            if found:
                ipr.link("del", index=found[0])
        except NetlinkError as exc:
            problems.append(f"removing {state.ifb}: {exc}")
    if state.added_ingress:
        try:
            ipr.tc("del", "ingress", index=state.index, handle=INGRESS_HANDLE,
                   parent=TC_H_INGRESS)
        except NetlinkError as exc:
            if exc.code not in (errno.ENOENT, errno.EINVAL):  # never added, or gone
                problems.append(f"removing the ingress qdisc: {exc}")
    try:
        _restore_root(ipr, state.index, state)
    except (NetlinkError, TreeError) as exc:
        problems.append(f"putting the root tree back: {exc}")
    now = snapshot(ipr, state.index)
    problems += state.before.differences(now)
    if problems:
        raise NicRestoreError(f"{state.ifname} did not come back as recorded: "
                              + " | ".join(problems))


class ShapedNic:
    """Context manager: `ifname` shaped to `link` for the block, restored exactly after it."""

    def __init__(self, ifname: str, link: EffectiveLink, *, job: str, ingress: bool = True,
                 netem_available: bool | None = None, peers: Sequence[str] | None = None):
        """`peers`: the job's other hosts' IPv4 addresses: only traffic to and from them is
        shaped and counted (None: everything on the NIC). `netem_available`: None to probe
        this namespace's kernel when the link needs netem."""
        self.ifname = ifname
        self.peers = tuple(peers) if peers is not None else None
        self.link = link
        self.job = job
        self.want_ingress = ingress
        self.netem_available = netem_available
        self.info: NicInfo | None = None
        self.state: NicState | None = None
        self.ingress_shaped = False
        self.notes: list[str] = []  # what was not done, and why
        self.restored = False  # the NIC is back as recorded
        self.restore_error: str | None = None  # why it is not: its record stays for `clean`
        self._path: Path | None = None
        self._lock_fd: int | None = None

    def __enter__(self) -> ShapedNic:
        self.info = info = inspect_nic(self.ifname)
        self.notes += check_nic(info, peers_only=self.peers is not None)
        if self.peers is not None:
            self.notes.append(
                f"only traffic to and from the job's {len(self.peers)} other hosts is shaped "
                f"and counted; everything else {self.ifname} carries shares the link unshaped")
        if info.mtu != self.link.mtu:
            self.notes.append(f"{self.ifname} has MTU {info.mtu} and the scenario's link "
                              f"{self.link.mtu}: netsim-ddp never changes a real NIC's MTU")
        check_may_shape(self.ifname)
        if self.netem_available is None:
            self.netem_available = self.link.impaired and netem_available_here()
        try:
            egress = egress_plan(self.link, self.netem_available, self.peers)
        except NicPlanError as exc:
            raise NicError(str(exc)) from None
        self._path = path = state_path(self.ifname)
        fd = lock_state(path, wait=False)
        if fd is None:
            raise NicError(f"{self.ifname} is being shaped by another netsim-ddp agent "
                           f"(see {path}); one agent per NIC")
        try:
            if path.exists():
                self._forget_a_strangers_record(path)
            with IPRoute() as ipr:
                before = snapshot(ipr, info.index)
                self._refuse_unrestorable(ipr, info, before)
                state = NicState(ifname=self.ifname, index=info.index,
                                 netns_inode=netns_inode(), netns_cookie=netns_cookie(),
                                 mac=info.mac, job=self.job, pid=os.getpid(),
                                 before=before, egress_handles=[egress.root])
                ingress = self._ingress_possible(ipr, before)
                if ingress:
                    state.ifb, state.added_ingress = ifb_name(info.index), True
                state.write(path)  # before the first change
                self.state, self._lock_fd = state, fd
                self._apply(ipr, info.index, egress, state if ingress else None)
        except BaseException:
            if self.state is not None:
                self._close()  # undo what was applied; the lock goes with it
            elif path.exists():
                os.close(fd)  # a killed agent's state: `clean` needs it
            else:
                unlock_state(path, fd)
            raise
        return self

    def __exit__(self, *exc_info) -> None:
        self._close()

    @property
    def left_changed(self) -> bool:
        """Did a restore fail (the NIC is not as it was; its record stays for `clean`)?"""
        return self.restore_error is not None

    def _forget_a_strangers_record(self, path: Path) -> None:
        """A record at our path with its lock free: a killed agent's of this very NIC (refused:
        `clean` must restore it first), or one of a namespace or NIC that is gone (inodes and
        names are reused), which is litter: dropped, with a note."""
        try:
            recorded = NicState.read(path)
        except (OSError, ValueError, KeyError) as exc:
            raise NicError(f"{path} is unreadable ({exc}): check {self.ifname} by hand, then "
                           f"`netsim-ddp clean --forget-nic {self.ifname}`") from None
        why = recorded.stranger()
        if why is None:
            raise NicError(f"{self.ifname} is still shaped by an agent that was killed "
                           f"({path}); run `netsim-ddp clean` to restore it first")
        path.unlink()
        self.notes.append(f"dropped {path.name}, a record of agent pid {recorded.pid}: {why}")

    def _close(self) -> None:
        state, fd, self.state, self._lock_fd = self.state, self._lock_fd, None, None
        if state is None or fd is None:
            return
        assert self._path is not None
        with signals_deferred():
            try:
                with IPRoute() as ipr:
                    restore_nic(ipr, state)
            except BaseException as exc:
                os.close(fd)  # the state file stays: `netsim-ddp clean` can try again
                detail = (str(exc) if isinstance(exc, NicRestoreError) else
                          f"{self.ifname} could not be restored: {type(exc).__name__}: {exc}")
                self.restore_error = (f"{detail} (its record is kept for `netsim-ddp clean`: "
                                      f"{self._path})")
                raise NicRestoreError(self.restore_error) from exc
            self._path.unlink()
            unlock_state(self._path, fd)
        self.restored = True

    def _refuse_unrestorable(self, ipr: IPRoute, info: NicInfo, before: NicSnapshot) -> None:
        """What could not be put back exactly is refused here, before anything changes: our
        own qdiscs without a record, filters in the root tree, and any tree that does not come
        back exactly when rehearsed on a scratch device shaped like this NIC."""
        ours = {EGRESS_HANDLE, EGRESS_CHILD_HANDLE, EGRESS_NETEM_HANDLE}
        if any(record.handle in ours for record in before.root):
            raise NicError(f"{self.ifname} already carries netsim-ddp's qdiscs (handle "
                           f"{_handle(EGRESS_HANDLE)}) but has no state file; remove them by "
                           f"hand (tc qdisc del dev {self.ifname} root) and start again")
        filters = root_filters(ipr, info.index, before.root)
        if filters:
            raise NicError(f"{self.ifname} has tc filters under its root qdisc ("
                           + ", ".join(filters) + "); netsim-ddp could not put them back "
                           "exactly, so it leaves this NIC alone: shape another NIC, or remove "
                           "them for the run")
        if before.default_root and before.root and before.root[0].kind == "noqueue":
            return  # deleting our root gives noqueue back: nothing to rehearse
        try:
            differences = rehearse(ipr, before, tx_queues=info.tx_queues, txqlen=info.txqlen,
                                   mtu=info.mtu)
        except NetlinkError as exc:
            if not before.explicit:
                return  # the kernel's default: it attaches it again itself
            raise NicError(f"{self.ifname}'s qdisc tree could not be rehearsed on a scratch "
                           f"ifb device ({exc}), so netsim-ddp cannot tell that it would "
                           "come back exactly; it leaves this NIC alone") from None
        if differences:
            raise NicError(f"{self.ifname}'s qdisc tree would not come back exactly after the "
                           "run (rehearsed on a scratch device: " + " | ".join(differences)
                           + "); netsim-ddp leaves this NIC alone: shape another NIC, or "
                           "simplify its tree for the run")

    def _ingress_possible(self, ipr: IPRoute, before: NicSnapshot) -> bool:
        if not self.want_ingress:
            self.notes.append("ingress shaping off (--no-ingress): received traffic is capped "
                              "only by the senders' egress")
            return False
        if before.ingress is not None:
            self.notes.append(f"{self.ifname} already has an {before.ingress.kind} qdisc on "
                              "its ingress, which other software owns: netsim-ddp leaves it "
                              "alone, so received traffic is capped only by the senders' "
                              "egress")
            return False
        if not ifb_available(ipr):
            self.notes.append("this kernel has no ifb device, so received traffic is capped "
                              "only by the senders' egress")
            return False
        return True

    def _apply(self, ipr: IPRoute, index: int, egress: NicPlan,
               ingress: NicState | None) -> None:
        root, *below = egress.qdiscs
        # The root is replaced in one call: no instant without shaping (with peers, their
        # class is complete before the filter that sends them there).
        ipr.tc("replace", root.kind, index=index, handle=root.handle, **root.params)
        for tc_class in egress.classes:
            ipr.tc("add-class", "htb", index=index, handle=tc_class.handle,
                   parent=tc_class.parent, **tc_class.params)
        for qdisc in below:
            ipr.tc("add", qdisc.kind, index=index, handle=qdisc.handle, parent=qdisc.parent,
                   **qdisc.params)
        for match in egress.filters:
            ipr.tc("add-filter", "u32", index=index, parent=match.parent, prio=FILTER_PRIO,
                   protocol=ETH_P_IP, target=match.target, keys=match.keys)
        if ingress is None or ingress.ifb is None:
            return
        ipr.link("add", ifname=ingress.ifb, kind="ifb")
        (ifb,) = ipr.link_lookup(ifname=ingress.ifb)
        shaper = tbf(self.link, EGRESS_HANDLE, None)
        ipr.tc("add", shaper.kind, index=ifb, handle=shaper.handle, **shaper.params)
        ipr.link("set", index=ifb, state="up")
        ipr.tc("add", "ingress", index=index, handle=INGRESS_HANDLE)
        redirect = [{"kind": "mirred", "direction": "egress", "action": "redirect",
                     "ifindex": ifb}]
        peers = ingress_filters(INGRESS_HANDLE, self.peers)
        if peers is None:  # everything received
            ipr.tc("add-filter", "u32", index=index, parent=INGRESS_HANDLE, prio=FILTER_PRIO,
                   protocol=ETH_P_ALL, target=0x10000, keys=["0x0/0x0+0"], action=redirect)
        for match in peers or ():  # only what the peers send
            ipr.tc("add-filter", "u32", index=index, parent=INGRESS_HANDLE, prio=FILTER_PRIO,
                   protocol=ETH_P_IP, target=match.target, keys=match.keys, action=redirect)
        self.ingress_shaped = True

    def shaping(self) -> dict[str, Any]:
        """What the kernel now applies, read back from it (rates in bit/s)."""
        assert self.info is not None and self.state is not None
        with IPRoute() as ipr:
            egress = _tbf_rate(ipr, self.info.index)
            ifb = ipr.link_lookup(ifname=self.state.ifb) if self.state.ifb else []
            ingress = _tbf_rate(ipr, ifb[0]) if ifb and self.ingress_shaped else None
        return {"nic": self.ifname, "egress_bps": egress, "ingress_bps": ingress,
                "ifb": self.state.ifb if self.ingress_shaped else None,
                "peers": list(self.peers) if self.peers is not None else None,
                "notes": self.notes}


def _tbf_rate(ipr: IPRoute, index: int) -> float | None:
    for msg in ipr.get_qdiscs(index=index):
        if msg.get_attr("TCA_KIND") == "tbf":
            parms = msg.get_attr("TCA_OPTIONS").get_attr("TCA_TBF_PARMS")
            rate64 = msg.get_attr("TCA_OPTIONS").get_attr("TCA_TBF_RATE64")
            return float((rate64 or parms["rate"]) * 8)
    return None


# -- `netsim-ddp clean` ----------------------------------------------------------------------
