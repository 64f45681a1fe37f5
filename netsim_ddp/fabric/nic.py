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
import fcntl
import json
import os
import socket
import struct
import time
from collections.abc import Iterator
from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import Any

from pyroute2 import IPRoute
from pyroute2.netlink import (
    NLM_F_ACK,
    NLM_F_CREATE,
    NLM_F_EXCL,
    NLM_F_REPLACE,
    NLM_F_REQUEST,
    nlmsg,
)
from pyroute2.netlink.exceptions import NetlinkError
from pyroute2.netlink.rtnl import RTM_NEWQDISC, RTM_NEWTCLASS, TC_H_ROOT

from netsim_ddp.scenario.spec import EffectiveLink

from . import naming, netns, privilege
from .errors import FabricError
from .plan import QdiscPlan, netem, tbf

STATE_VERSION = 1
TC_H_INGRESS = 0xFFFFFFF1  # where ingress and clsact qdiscs hang
INGRESS_HANDLE = 0xFFFF0000
# Our qdiscs' handles ("NS", "NT"): chosen so they cannot be mistaken for the NIC's own.
EGRESS_HANDLE = 0x4E530000
EGRESS_CHILD_HANDLE = 0x4E540000
FILTER_PRIO = 49152  # our redirect filter's priority on the ingress qdisc we add
ETH_P_ALL = 0x0003
IFF_UP = 0x1
IFF_LOOPBACK = 0x8
STATE_PREFIX = "nic-"
JOB_ENV = "NETSIM_DDP_HOST_JOB"  # marks every process an agent starts, for `clean`


class NicError(FabricError):
    """This NIC cannot be shaped (or restored) as asked; the message says why and what to do."""


class NicRestoreError(NicError):
    """The NIC did not come back as recorded; its state file is kept for `netsim-ddp clean`."""


# -- what the kernel reports ----------------------------------------------------------------


class _RawTc(nlmsg):
    """A tcmsg whose options travel as the kernel's own bytes, so a recorded qdisc or class
    is sent back exactly as it was dumped (pyroute2's per-kind encoders rebuild them from
    keywords, which can drop what they do not know)."""

    prefix = "TCA_"
    fields = (("family", "B"), ("pad1", "B"), ("pad2", "H"), ("index", "i"),
              ("handle", "I"), ("parent", "I"), ("info", "I"))
    nla_map = (("TCA_UNSPEC", "none"), ("TCA_KIND", "asciiz"), ("TCA_OPTIONS", "cdata"),
               ("TCA_STATS", "none"), ("TCA_XSTATS", "none"), ("TCA_RATE", "cdata"),
               ("TCA_FCNT", "none"), ("TCA_STATS2", "none"), ("TCA_STAB", "cdata"))


@dataclass(frozen=True)
class TcRecord:
    """One qdisc or class as the kernel dumped it; options are TCA_OPTIONS' payload, in hex."""

    kind: str
    handle: int
    parent: int
    options: str | None = None
    stab: str | None = None

    def describe(self) -> str:
        return (f"{self.kind} {_handle(self.handle)} parent {_handle(self.parent)}"
                + (f" options {self.options}" if self.options else ""))


TCA_OPTIONS, TCA_STAB = 2, 8
_NLMSG_AND_TCMSG = 16 + 20  # struct nlmsghdr + struct tcmsg


def _raw_attrs(msg) -> dict[int, bytes]:
    """A tcmsg's top-level attributes as the kernel sent them, by type (pyroute2 decodes
    options only for the kinds it knows, and a decoded value cannot be sent back as it was)."""
    buffer = bytes(msg.data[msg.offset:msg.offset + msg["header"]["length"]])
    attrs, position = {}, _NLMSG_AND_TCMSG
    while position + 4 <= len(buffer):
        length, kind = struct.unpack_from("<HH", buffer, position)
        if length < 4:
            break
        attrs[kind & 0x3FFF] = buffer[position + 4:position + length]
        position += (length + 3) & ~3
    return attrs


def _record(msg) -> TcRecord:
    raw = _raw_attrs(msg)
    options, stab = raw.get(TCA_OPTIONS), raw.get(TCA_STAB)
    return TcRecord(kind=msg.get_attr("TCA_KIND"), handle=msg["handle"], parent=msg["parent"],
                    options=options.hex() if options else None, stab=stab.hex() if stab else None)


def _handle(value: int) -> str:
    if value == TC_H_ROOT:
        return "root"
    return f"{value >> 16:x}:{value & 0xFFFF:x}"


@dataclass(frozen=True)
class NicSnapshot:
    """A NIC's root qdisc tree and its ingress qdisc."""

    root: tuple[TcRecord, ...]  # root first, then the rest in the order the kernel dumps them
    classes: tuple[TcRecord, ...]
    ingress: TcRecord | None

    @property
    def default_root(self) -> bool:
        """The kernel's own default (noqueue, pfifo_fast, mq...): handle 0."""
        return not self.root or self.root[0].handle == 0

    def differences(self, other: NicSnapshot) -> list[str]:
        found = []
        for what, mine, theirs in (("qdiscs", self.root, other.root),
                                   ("classes", self.classes, other.classes),
                                   ("ingress", (self.ingress,), (other.ingress,))):
            if sorted(map(repr, mine)) != sorted(map(repr, theirs)):
                found.append(f"{what}: recorded "
                             + ("; ".join(r.describe() for r in mine if r) or "none")
                             + ", now " + ("; ".join(r.describe() for r in theirs if r) or "none"))
        return found

    def as_dict(self) -> dict[str, Any]:
        return {"root": [asdict(r) for r in self.root],
                "classes": [asdict(r) for r in self.classes],
                "ingress": asdict(self.ingress) if self.ingress else None}

    @classmethod
    def from_dict(cls, data: dict[str, Any]) -> NicSnapshot:
        return cls(root=tuple(TcRecord(**r) for r in data["root"]),
                   classes=tuple(TcRecord(**r) for r in data["classes"]),
                   ingress=TcRecord(**data["ingress"]) if data["ingress"] else None)


def snapshot(ipr: IPRoute, index: int) -> NicSnapshot:
    qdiscs = list(ipr.get_qdiscs(index=index))
    ingress = [_record(m) for m in qdiscs if m["parent"] == TC_H_INGRESS]
    tree = [_record(m) for m in qdiscs if m["parent"] != TC_H_INGRESS]
    tree.sort(key=lambda r: r.parent != TC_H_ROOT)  # the root first
    classes = [_record(m) for m in ipr.get_classes(index=index)]
    return NicSnapshot(tuple(tree), tuple(classes), ingress[0] if ingress else None)


def _root_filters(ipr: IPRoute, index: int, tree: tuple[TcRecord, ...]) -> list[str]:
    """Filters hanging in the root tree: restoring those exactly is beyond what tc allows
    (u32 handles are the kernel's), so a NIC that has them is refused before it changes."""
    found = []
    for qdisc in tree:
        if qdisc.handle:
            with contextlib.suppress(NetlinkError):  # a classless qdisc takes no filters
                found += [f"{f.get_attr('TCA_KIND')} on {_handle(qdisc.handle)}"
                          for f in ipr.get_filters(index=index, parent=qdisc.handle)]
    return sorted(set(found))


# -- the NIC itself --------------------------------------------------------------------------


@dataclass(frozen=True)
class NicInfo:
    ifname: str
    index: int
    up: bool
    loopback: bool
    mtu: int
    addresses: tuple[str, ...]  # IPv4
    default_route: bool  # carries this namespace's IPv4 default route


def inspect_nic(ifname: str) -> NicInfo:
    """What this namespace's NIC is; NicError if there is none by that name."""
    with IPRoute() as ipr:
        found = ipr.link_lookup(ifname=ifname)
        if not found:
            names = sorted(link.get_attr("IFLA_IFNAME") for link in ipr.get_links())
            raise NicError(f"--nic {ifname}: no such interface on this host; it has "
                           + ", ".join(names))
        (link,) = ipr.get_links(found[0])
        addresses = tuple(a.get_attr("IFA_ADDRESS")
                          for a in ipr.get_addr(family=socket.AF_INET, index=found[0]))
        default = any(route.get_attr("RTA_OIF") == found[0] and route["dst_len"] == 0
                      for route in ipr.get_routes(family=socket.AF_INET, table=254))
    return NicInfo(ifname=ifname, index=found[0], up=bool(link["flags"] & IFF_UP),
                   loopback=bool(link["flags"] & IFF_LOOPBACK) or ifname == "lo",
                   mtu=link.get_attr("IFLA_MTU"), addresses=addresses, default_route=default)


def check_nic(info: NicInfo) -> list[str]:
    """Refuse what cannot be a cluster NIC; return warnings for what should be looked at."""
    if info.loopback:
        raise NicError(f"--nic {info.ifname}: a loopback interface carries no traffic between "
                       "hosts; name the NIC the hosts reach each other through")
    if not info.up:
        raise NicError(f"--nic {info.ifname}: the interface is down; bring it up or name "
                       "the NIC the hosts reach each other through")
    if not info.addresses:
        raise NicError(f"--nic {info.ifname}: the interface has no IPv4 address, so the "
                       "training cannot be pinned to it")
    if info.default_route:
        return [f"{info.ifname} carries this host's default route: everything the host sends "
                "that way (ssh, storage, monitoring) is shaped too while the run lasts, and "
                "counted in the wire bytes"]
    return []


def check_may_shape(ifname: str) -> None:
    """Refuse, before any agent waits on us, a process that cannot change this host's qdiscs."""
    if not privilege.has_net_admin():
        raise NicError(f"--nic {ifname}: shaping this host's NIC needs root (CAP_NET_ADMIN in "
                       "its network namespace), and a user namespace cannot give that for a real "
                       "NIC: run the agent as root (sudo netsim-ddp host ...)")


def netns_inode() -> int:
    return os.stat("/proc/thread-self/ns/net").st_ino


# -- the plan --------------------------------------------------------------------------------


def egress_plan(link: EffectiveLink, netem_available: bool) -> tuple[QdiscPlan, ...]:
    """tbf at the root; netem above it when the link has delay, jitter or loss."""
    if not link.impaired:
        return (tbf(link, EGRESS_HANDLE, None),)
    if not netem_available:
        raise NicError(
            "the scenario's link has delay, jitter or loss, which on a real NIC needs the "
            "kernel's netem qdisc (sch_netem, CONFIG_NET_SCH_NETEM), and this kernel has none: "
            "load sch_netem (modprobe sch_netem), or run the scenario without delay, jitter "
            "and loss (the userspace delay line only exists between emulated nodes)")
    if link.jitter_distribution != "uniform":
        raise NicError(f"link.jitter_distribution = {link.jitter_distribution!r} needs netem's "
                       "distribution tables, which pyroute2 cannot load; use 'uniform'")
    top = netem(link, EGRESS_HANDLE)
    return (top, tbf(link, EGRESS_CHILD_HANDLE, EGRESS_HANDLE | 1))


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

    def write(self, path: Path) -> None:
        data = {"version": STATE_VERSION, "ifname": self.ifname, "index": self.index,
                "netns_inode": self.netns_inode, "job": self.job, "pid": self.pid,
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
        if data.get("version") != STATE_VERSION:
            raise NicError(f"{path}: state version {data.get('version')}, expected "
                           f"{STATE_VERSION}; restore this NIC by hand")
        return cls(ifname=data["ifname"], index=data["index"], netns_inode=data["netns_inode"],
                   job=data["job"], pid=data["pid"],
                   before=NicSnapshot.from_dict(data["before"]),
                   egress_handles=data["egress_handles"], ifb=data["ifb"],
                   added_ingress=data["added_ingress"])


def _lock(path: Path, wait: bool) -> int | None:
    """An flock on the state's lock file: held while an agent shapes the NIC."""
    path.parent.mkdir(parents=True, exist_ok=True)
    fd = os.open(path.with_suffix(".lock"), os.O_RDWR | os.O_CREAT | os.O_CLOEXEC, 0o644)
    try:
        fcntl.flock(fd, fcntl.LOCK_EX | (0 if wait else fcntl.LOCK_NB))
    except BlockingIOError:
        os.close(fd)
        return None
    return fd


def _unlock(path: Path, fd: int) -> None:
    with contextlib.suppress(FileNotFoundError):
        path.with_suffix(".lock").unlink()
    os.close(fd)


# -- shaping and restoring -------------------------------------------------------------------


def _send_raw(ipr: IPRoute, msg_type: int, index: int, record: TcRecord, flags: int) -> None:
    msg = _RawTc()
    msg["family"] = socket.AF_UNSPEC
    msg["index"] = index
    msg["handle"] = record.handle
    msg["parent"] = record.parent
    attrs: list[tuple[str, object]] = [("TCA_KIND", record.kind)]
    if record.options is not None:
        attrs.append(("TCA_OPTIONS", _accepted_options(record)))
    if record.stab is not None:
        attrs.append(("TCA_STAB", bytes.fromhex(record.stab)))
    msg["attrs"] = attrs
    msg["header"]["type"] = msg_type
    msg["header"]["flags"] = NLM_F_REQUEST | NLM_F_ACK | flags
    ipr.nlm_request_batch([msg])


def _accepted_options(record: TcRecord) -> bytes:
    """The dumped options, fixed where the kernel dumps what it refuses to be given."""
    raw = bytearray.fromhex(record.options or "")
    if record.kind == "htb" and len(raw) >= 8 and struct.unpack_from("<H", raw, 2)[0] == 2:
        # TCA_HTB_INIT first: dumped with version 0x30011, accepted only as the major, 3.
        struct.pack_into("<I", raw, 4, struct.unpack_from("<I", raw, 4)[0] >> 16)
    return bytes(raw)


def _restore_root(ipr: IPRoute, index: int, state: NicState) -> None:
    roots = [m for m in ipr.get_qdiscs(index=index) if m["parent"] == TC_H_ROOT]
    current = roots[0]["handle"] if roots else 0
    if current not in state.egress_handles:
        return  # never shaped, or already restored
    before = state.before
    if before.default_root:
        ipr.tc("del", index=index, handle=current, parent=TC_H_ROOT)  # the kernel's default
        return
    root, *children = before.root
    _send_raw(ipr, RTM_NEWQDISC, index, root, NLM_F_CREATE | NLM_F_REPLACE)
    for tc_class in sorted(before.classes, key=lambda c: c.parent != root.handle):
        _send_raw(ipr, RTM_NEWTCLASS, index, tc_class, NLM_F_CREATE | NLM_F_EXCL)
    for child in children:
        if child.handle:  # handle 0: a default the kernel attached by itself again
            _send_raw(ipr, RTM_NEWQDISC, index, child, NLM_F_CREATE | NLM_F_EXCL)


def _restore(ipr: IPRoute, state: NicState) -> None:
    """Undo what `state` says was done, step by step; each step is a no-op when not needed."""
    if state.ifb:
        found = ipr.link_lookup(ifname=state.ifb)
        if found:
            ipr.link("del", index=found[0])
    if state.added_ingress:
        with contextlib.suppress(NetlinkError):  # ENOENT/EINVAL: never added
            ipr.tc("del", "ingress", index=state.index, handle=INGRESS_HANDLE,
                   parent=TC_H_INGRESS)
    _restore_root(ipr, state.index, state)
    now = snapshot(ipr, state.index)
    differences = state.before.differences(now)
    if differences:
        raise NicRestoreError(f"{state.ifname} did not come back as recorded: "
                              + " | ".join(differences))


class ShapedNic:
    """Context manager: `ifname` shaped to `link` for the block, restored exactly after it."""

    def __init__(self, ifname: str, link: EffectiveLink, *, job: str, ingress: bool = True,
                 netem_available: bool = False):
        self.ifname = ifname
        self.link = link
        self.job = job
        self.want_ingress = ingress
        self.netem_available = netem_available
        self.info: NicInfo | None = None
        self.state: NicState | None = None
        self.ingress_shaped = False
        self.notes: list[str] = []  # what was not done, and why
        self._path: Path | None = None
        self._lock_fd: int | None = None

    def __enter__(self) -> ShapedNic:
        self.info = info = inspect_nic(self.ifname)
        self.notes += check_nic(info)
        if info.mtu != self.link.mtu:
            self.notes.append(f"{self.ifname} has MTU {info.mtu} and the scenario's link "
                              f"{self.link.mtu}: netsim-ddp never changes a real NIC's MTU")
        egress = egress_plan(self.link, self.netem_available)
        self._path = path = state_path(self.ifname)
        fd = _lock(path, wait=False)
        if fd is None:
            raise NicError(f"{self.ifname} is being shaped by another netsim-ddp agent "
                           f"(see {path}); one agent per NIC")
        try:
            if path.exists():
                raise NicError(f"{self.ifname} is still shaped by an agent that was killed "
                               f"({path}); run `netsim-ddp clean` to restore it first")
            with IPRoute() as ipr:
                before = snapshot(ipr, info.index)
                self._refuse_unrestorable(ipr, info.index, before)
                state = NicState(ifname=self.ifname, index=info.index,
                                 netns_inode=netns_inode(), job=self.job, pid=os.getpid(),
                                 before=before, egress_handles=[q.handle for q in egress])
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
                _unlock(path, fd)
            raise
        return self

    def __exit__(self, *exc_info) -> None:
        self._close()

    def _close(self) -> None:
        state, fd, self.state, self._lock_fd = self.state, self._lock_fd, None, None
        if state is None or fd is None:
            return
        assert self._path is not None
        try:
            with IPRoute() as ipr:
                _restore(ipr, state)
        except BaseException:
            os.close(fd)  # the state file stays: `netsim-ddp clean` can try again
            raise
        self._path.unlink()
        _unlock(self._path, fd)

    def _refuse_unrestorable(self, ipr: IPRoute, index: int, before: NicSnapshot) -> None:
        ours = {EGRESS_HANDLE, EGRESS_CHILD_HANDLE}
        if any(record.handle in ours for record in before.root):
            raise NicError(f"{self.ifname} already carries netsim-ddp's qdiscs (handle "
                           f"{_handle(EGRESS_HANDLE)}) but has no state file; remove them by "
                           f"hand (tc qdisc del dev {self.ifname} root) and start again")
        filters = _root_filters(ipr, index, before.root)
        if filters:
            raise NicError(f"{self.ifname} has tc filters under its root qdisc ("
                           + ", ".join(filters) + "); netsim-ddp could not put them back "
                           "exactly, so it leaves this NIC alone: shape another NIC, or remove "
                           "them for the run")

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

    def _apply(self, ipr: IPRoute, index: int, egress: tuple[QdiscPlan, ...],
               ingress: NicState | None) -> None:
        for i, qdisc in enumerate(egress):
            # The root is replaced in one call: no instant without shaping.
            command = "replace" if i == 0 else "add"
            placement = {"parent": qdisc.parent} if qdisc.parent is not None else {}
            ipr.tc(command, qdisc.kind, index=index, handle=qdisc.handle, **placement,
                   **qdisc.params)
        if ingress is None or ingress.ifb is None:
            return
        ipr.link("add", ifname=ingress.ifb, kind="ifb")
        (ifb,) = ipr.link_lookup(ifname=ingress.ifb)
        shaper = tbf(self.link, EGRESS_HANDLE, None)
        ipr.tc("add", shaper.kind, index=ifb, handle=shaper.handle, **shaper.params)
        ipr.link("set", index=ifb, state="up")
        ipr.tc("add", "ingress", index=index, handle=INGRESS_HANDLE)
        ipr.tc("add-filter", "u32", index=index, parent=INGRESS_HANDLE, prio=FILTER_PRIO,
               protocol=ETH_P_ALL, target=0x10000, keys=["0x0/0x0+0"],
               action=[{"kind": "mirred", "direction": "egress", "action": "redirect",
                        "ifindex": ifb}])
        self.ingress_shaped = True

    def shaping(self) -> dict[str, Any]:
        """What the kernel now applies, read back from it (rates in bit/s)."""
        assert self.info is not None and self.state is not None
        with IPRoute() as ipr:
            egress = _tbf_rate(ipr, self.info.index)
            ifb = ipr.link_lookup(ifname=self.state.ifb) if self.state.ifb else []
            ingress = _tbf_rate(ipr, ifb[0]) if ifb and self.ingress_shaped else None
        return {"nic": self.ifname, "egress_bps": egress, "ingress_bps": ingress,
                "ifb": self.state.ifb if self.ingress_shaped else None, "notes": self.notes}


def ifb_available(ipr: IPRoute) -> bool:
    """Try to make an ifb device (and remove it): the only sure test."""
    name = f"{naming.PREFIX}ifbprobe"
    try:
        ipr.link("add", ifname=name, kind="ifb")
    except NetlinkError:
        return False
    with contextlib.suppress(NetlinkError):
        ipr.link("del", index=ipr.link_lookup(ifname=name)[0])
    return True


def _tbf_rate(ipr: IPRoute, index: int) -> float | None:
    for msg in ipr.get_qdiscs(index=index):
        if msg.get_attr("TCA_KIND") == "tbf":
            parms = msg.get_attr("TCA_OPTIONS").get_attr("TCA_TBF_PARMS")
            rate64 = msg.get_attr("TCA_OPTIONS").get_attr("TCA_TBF_RATE64")
            return float((rate64 or parms["rate"]) * 8)
    return None


# -- `netsim-ddp clean` ----------------------------------------------------------------------


@dataclass
class RestoredNic:
    ifname: str
    netns_inode: int
    pid: int
    done: bool  # False: found, but could not be restored (see error) or a dry run
    killed_processes: int = 0
    error: str | None = None


def _netns_by_inode(inode: int) -> Path | None:
    """A path that opens the namespace with this inode: ours, a named one, or init's."""
    candidates = [Path("/proc/thread-self/ns/net"), Path("/proc/1/ns/net")]
    candidates += [netns.path_of(name) for name in netns.list_names()]
    for path in candidates:
        with contextlib.suppress(OSError):
            if os.stat(path).st_ino == inode:
                return path
    return None


@contextlib.contextmanager
def _entered(path: Path) -> Iterator[None]:
    fd = os.open(path, os.O_RDONLY)
    home = os.open("/proc/thread-self/ns/net", os.O_RDONLY)
    try:
        netns._setns(fd, str(path))
        try:
            yield
        finally:
            netns._setns(home, "<home>")
    finally:
        os.close(fd)
        os.close(home)


def kill_job_processes(job: str, inode: int) -> int:
    """SIGKILL what a dead agent started (torchrun, ranks): they carry JOB_ENV=job."""
    marker = f"{JOB_ENV}={job}".encode()
    killed = 0
    for entry in os.scandir("/proc"):
        if not entry.name.isdigit() or int(entry.name) == os.getpid():
            continue
        try:
            if os.stat(f"/proc/{entry.name}/ns/net").st_ino != inode:
                continue
            environ = Path(f"/proc/{entry.name}/environ").read_bytes().split(b"\0")
        except OSError:
            continue
        if marker in environ:
            with contextlib.suppress(ProcessLookupError):
                os.kill(int(entry.name), 9)
                killed += 1
    return killed


def recorded_nics() -> list[Path]:
    """The state files of `host` agents' NICs, live or dead (root's: only root may restore)."""
    return sorted(naming.lock_dir().glob(f"{STATE_PREFIX}*.json"))


def restore_stale_nics(dry_run: bool = False) -> list[RestoredNic]:
    """Restore every NIC whose agent is gone (its lock is free), as its state file says."""
    results = []
    for path in recorded_nics():
        fd = _lock(path, wait=False)
        if fd is None:
            continue  # a live agent
        try:
            results.append(_restore_stale(path, dry_run))
        finally:
            if path.exists():
                os.close(fd)
            else:
                _unlock(path, fd)
    return results


def _restore_stale(path: Path, dry_run: bool) -> RestoredNic:
    try:
        state = NicState.read(path)
    except (OSError, ValueError, KeyError, NicError) as exc:
        return RestoredNic(path.name, 0, 0, done=False, error=f"{path}: unreadable: {exc}")
    found = RestoredNic(state.ifname, state.netns_inode, state.pid, done=False)
    where = _netns_by_inode(state.netns_inode)
    if where is None:
        found.error = "its network namespace is gone, and the NIC with it: nothing to restore"
        if not dry_run:
            path.unlink()
        return found
    if dry_run:
        return found
    try:
        with _entered(where):
            found.killed_processes = kill_job_processes(state.job, state.netns_inode)
            with IPRoute() as ipr:
                _restore(ipr, state)
    except (NicError, NetlinkError, OSError) as exc:
        found.error = str(exc)
        return found
    path.unlink()
    found.done = True
    return found
