"""A NIC's qdisc tree as the kernel dumps it, and how to put it back exactly.

`snapshot` records every qdisc and class of an interface's root tree (kind, handle, parent and
the kernel's own bytes of their options) and its ingress qdisc. `replay` sends a recorded tree
back to the kernel in an order that works: a class after the qdisc and class it hangs from, a
qdisc after the class it is attached to. Classes that a qdisc makes by itself (mq, mqprio,
prio, multiq, taprio make one per queue or band) are never re-created (that is EEXIST); the
qdiscs attached to them replace the kernel's defaults there. Qdiscs of handle 0 are defaults the
kernel attaches by itself and come back with their parent.

`rehearse` replays a tree on a scratch ifb device with the NIC's number of queues and queue
length, and compares what the kernel then reports with the record: what does not come back
exactly there is refused before the real NIC changes.
"""

from __future__ import annotations

import contextlib
import secrets
import socket
import struct
from dataclasses import asdict, dataclass
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

from netsim_ddp.fabric import naming

TC_H_INGRESS = 0xFFFFFFF1  # where ingress and clsact qdiscs hang
# Qdiscs that create their classes themselves, one per queue or band.
AUTO_CLASS_KINDS = frozenset({"mq", "mqprio", "prio", "multiq", "taprio"})
TCA_OPTIONS, TCA_STAB = 2, 8
_NLMSG_AND_TCMSG = 16 + 20  # struct nlmsghdr + struct tcmsg


class TreeError(RuntimeError):
    """A recorded tree cannot be sent back as it was; the message names the part."""


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


def describe_handle(value: int) -> str:
    if value == TC_H_ROOT:
        return "root"
    return f"{value >> 16:x}:{value & 0xFFFF:x}"


@dataclass(frozen=True)
class TcRecord:
    """One qdisc or class as the kernel dumped it; options are TCA_OPTIONS' payload, in hex."""

    kind: str
    handle: int
    parent: int
    options: str | None = None
    stab: str | None = None

    def describe(self) -> str:
        return (f"{self.kind} {describe_handle(self.handle)} parent "
                f"{describe_handle(self.parent)}"
                + (f" options {self.options}" if self.options else ""))


def _raw_attrs(msg: Any) -> dict[int, bytes]:
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


def _record(msg: Any) -> TcRecord:
    raw = _raw_attrs(msg)
    options, stab = raw.get(TCA_OPTIONS), raw.get(TCA_STAB)
    return TcRecord(kind=msg.get_attr("TCA_KIND"), handle=msg["handle"], parent=msg["parent"],
                    options=options.hex() if options else None, stab=stab.hex() if stab else None)


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

    @property
    def explicit(self) -> bool:
        """Anything beyond a root the kernel attached by itself with its own defaults?"""
        return (not self.default_root or any(q.handle for q in self.root[1:])
                or any(not _auto_class(self, c) for c in self.classes))

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


def root_filters(ipr: IPRoute, index: int, tree: tuple[TcRecord, ...]) -> list[str]:
    """Filters hanging in the root tree: restoring those exactly is beyond what tc allows
    (u32 handles are the kernel's), so a NIC that has them is refused before it changes."""
    found = []
    for qdisc in tree:
        if qdisc.handle:
            with contextlib.suppress(NetlinkError):  # a classless qdisc takes no filters
                found += [f"{f.get_attr('TCA_KIND')} on {describe_handle(qdisc.handle)}"
                          for f in ipr.get_filters(index=index, parent=qdisc.handle)]
    return sorted(set(found))


# -- sending a tree back ---------------------------------------------------------------------


def send_raw(ipr: IPRoute, msg_type: int, index: int, record: TcRecord, flags: int) -> None:
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


def _major(handle: int) -> int:
    return handle & 0xFFFF0000


def _auto_class(tree: NicSnapshot, tc_class: TcRecord) -> bool:
    """A class its qdisc made by itself (one of mq's per-queue classes, say)."""
    return any(q.kind in AUTO_CLASS_KINDS and _major(q.handle) == _major(tc_class.handle)
               for q in tree.root)


def replay(ipr: IPRoute, index: int, tree: NicSnapshot, *, keep_root: bool) -> None:
    """Send `tree` to interface `index`. `keep_root`: its root is in place already (the
    kernel's default, attached again); only what hangs below it is sent. NetlinkError as the
    kernel raised it; TreeError for a part whose parent never came back."""
    root, *children = tree.root
    if not keep_root:
        send_raw(ipr, RTM_NEWQDISC, index, root, NLM_F_CREATE | NLM_F_REPLACE)
    qdiscs = {_major(root.handle)}  # majors of the qdiscs in place
    classes = {c.handle for c in tree.classes if _auto_class(tree, c)}
    pending = [(True, c) for c in tree.classes if c.handle not in classes]
    pending += [(False, q) for q in children if q.handle]  # handle 0: the kernel's default
    while pending:
        ready = [(is_class, r) for is_class, r in pending
                 if _parent_in_place(r, is_class, qdiscs, classes)]
        if not ready:
            raise TreeError("cannot put back " + "; ".join(r.describe() for _, r in pending)
                            + ": what they hang from did not come back")
        for is_class, record in ready:
            pending.remove((is_class, record))
            if is_class:
                send_raw(ipr, RTM_NEWTCLASS, index, record, NLM_F_CREATE | NLM_F_EXCL)
                classes.add(record.handle)
            else:  # replaces the default the kernel attached there
                send_raw(ipr, RTM_NEWQDISC, index, record, NLM_F_CREATE | NLM_F_REPLACE)
                qdiscs.add(_major(record.handle))
                classes |= {c.handle for c in tree.classes if _auto_class(tree, c)
                            and _major(c.handle) == _major(record.handle)}


def _parent_in_place(record: TcRecord, is_class: bool, qdiscs: set[int],
                     classes: set[int]) -> bool:
    if is_class:  # its own qdisc, and the class it hangs from
        return _major(record.handle) in qdiscs and (
            record.parent in (TC_H_ROOT, _major(record.handle)) or record.parent in classes)
    return record.parent in classes  # a qdisc hangs from a class


# -- the rehearsal ---------------------------------------------------------------------------


def scratch_name(role: str) -> str:
    """A device name of our own for a moment (probes, rehearsals): never one another agent
    or a leftover could hold."""
    return f"{naming.PREFIX}{role}{secrets.token_hex(4)}"[:15]


@contextlib.contextmanager
def scratch_ifb(ipr: IPRoute, role: str, **link: Any):
    """An ifb device made for the block and removed after it; NetlinkError if none can be."""
    name = scratch_name(role)
    ipr.link("add", ifname=name, kind="ifb", **link)
    try:
        (index,) = ipr.link_lookup(ifname=name)
        yield index
    finally:
        with contextlib.suppress(NetlinkError, ValueError):
            ipr.link("del", index=ipr.link_lookup(ifname=name)[0])


def rehearse(ipr: IPRoute, tree: NicSnapshot, *, tx_queues: int, txqlen: int, mtu: int
             ) -> list[str]:
    """Replay `tree` on a scratch ifb shaped like the NIC (queues, queue length, MTU) as the
    restore would, from the kernel's default; what then differs from the record (empty: it
    comes back exactly). NetlinkError if no scratch device can be made."""
    with scratch_ifb(ipr, "rh", num_tx_queues=tx_queues, num_rx_queues=tx_queues,
                     txqlen=txqlen, mtu=mtu) as index:
        ipr.link("set", index=index, state="up")  # the kernel attaches its default root now
        try:
            replay(ipr, index, tree, keep_root=tree.default_root)
        except (NetlinkError, TreeError) as exc:
            return [f"the kernel refused it: {exc}"]
        found = snapshot(ipr, index)
    return tree.differences(NicSnapshot(found.root, found.classes, tree.ingress))
