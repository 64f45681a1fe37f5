"""What this host can do, found by trying it in a throwaway namespace rather than assumed.

Kernels differ (this project's CI kernel has no netem and cannot load modules), so every kernel
feature is probed by creating the object for real, once per process.
"""

from __future__ import annotations

import contextlib
import dataclasses
import functools
import importlib.util
import os
from dataclasses import asdict, dataclass

from pyroute2 import IPRoute
from pyroute2.netlink.exceptions import NetlinkError

from netsim_ddp.fabric import delayline, naming
from netsim_ddp.fabric.namespaces import netns, privilege


@dataclass(frozen=True)
class Capabilities:
    privilege: str  # "root", "rootless" or "none"
    namespaces: bool
    veth: bool
    bridge: bool
    tbf: bool
    htb: bool
    netem: bool
    ifb: bool
    clsact: bool
    delay_line: bool = False  # the userspace stand-in for netem could be built
    error: str | None = None  # why namespaces cannot be made, if they cannot
    delay_line_error: str | None = None

    @classmethod
    def unavailable(cls, privilege: str, error: str) -> Capabilities:
        """Nothing can be probed: every feature reads as missing, with the reason."""
        return cls(privilege, namespaces=False, veth=False, bridge=False, tbf=False, htb=False,
                   netem=False, ifb=False, clsact=False, error=error)

    @property
    def can_build(self) -> bool:
        """Enough for a shaped fabric: namespaces, veths, a bridge and tbf."""
        return self.namespaces and self.veth and self.bridge and self.tbf

    def as_dict(self) -> dict[str, object]:
        return asdict(self) | {"can_build": self.can_build}


def _try(action) -> bool:
    try:
        action()
    except (NetlinkError, OSError):  # gVisor and kin answer some netlink calls with OSError
        return False
    return True


@functools.lru_cache(maxsize=1)
def probe_capabilities() -> Capabilities:
    try:
        mode = privilege.ensure_network_privilege()
    except privilege.PrivilegeError as exc:
        return Capabilities.unavailable("none", str(exc))
    except OSError as exc:  # a kernel that half-supports user namespaces (gVisor)
        return Capabilities.unavailable("none", f"cannot set up a user namespace: {exc}")
    run_id = naming.new_run_id()
    name = naming.netns_name(run_id, "probe")
    lock = naming.RunLock(run_id)
    lock.acquire()
    try:
        netns.create(name)
    except OSError as exc:
        lock.release()
        return Capabilities.unavailable(mode, str(exc))
    try:
        with netns.entered(name), IPRoute() as ipr:
            kernel = _probe_kernel(ipr, mode)
    except OSError as exc:  # no netlink to speak of (gVisor): reported, not a traceback
        kernel = Capabilities.unavailable(mode, f"netlink in a network namespace failed: {exc}")
    finally:
        with contextlib.suppress(OSError):
            netns.remove(name)
        lock.release()
    if not kernel.namespaces:
        return kernel
    try:
        delayline.build_binary()
    except delayline.DelayLineBuildError as exc:
        return dataclasses.replace(kernel, delay_line_error=str(exc))
    return dataclasses.replace(kernel, delay_line=True)


def _probe_kernel(ipr: IPRoute, mode: str) -> Capabilities:
    veth = _try(lambda: ipr.link("add", ifname="nsd-pa", kind="veth", peer={"ifname": "nsd-pb"}))
    bridge = _try(lambda: ipr.link("add", ifname="nsd-pbr", kind="bridge"))
    ifb = _try(lambda: ipr.link("add", ifname="nsd-pifb", kind="ifb"))
    index = ipr.link_lookup(ifname="nsd-pa")[0] if veth else ipr.link_lookup(ifname="lo")[0]

    handles = iter(range(0x10000, 0x100000, 0x10000))

    def qdisc(kind: str, **params) -> bool:
        # "replace" with a fresh handle swaps whatever root qdisc the previous probe left
        # (with the same handle the kernel would try to change it in place, across kinds).
        return _try(lambda: ipr.tc("replace", kind, index=index, handle=next(handles), **params))

    return Capabilities(
        privilege=mode,
        namespaces=True,
        veth=veth,
        bridge=bridge,
        tbf=qdisc("tbf", rate="1000000bit", burst=4000, limit=30000),
        htb=qdisc("htb", default=0x10),
        netem=qdisc("netem", delay=1000),
        ifb=ifb,
        clsact=_try(lambda: ipr.tc("add", "clsact", index=index)),
    )


def torch_status() -> dict[str, object]:
    """torch and its distributed backends, without importing torch unless it is there."""
    if importlib.util.find_spec("torch") is None:
        return {"torch": None, "gloo": False, "nccl": False, "cuda_devices": 0}
    import torch
    import torch.distributed as dist

    available = dist.is_available()
    return {
        "torch": torch.__version__,
        "gloo": available and dist.is_gloo_available(),
        "nccl": available and dist.is_nccl_available() and torch.cuda.is_available(),
        "cuda_devices": torch.cuda.device_count(),
        "cpus": os.cpu_count(),
    }
