"""The host a run or baseline was measured on (pytest-benchmark's machine_info), and the
stable digests and timestamps the documents carry."""

from __future__ import annotations

import datetime
import hashlib
import json
import os
import platform
import socket
from collections.abc import Mapping
from pathlib import Path
from typing import Any, ClassVar

from netsim_ddp.measure.record import Record


class CpuInfo(Record):
    brand_raw: str | None = None  # pytest-benchmark's (py-cpuinfo's) name for the model
    count: int | None = None


class MachineInfo(Record):
    """The host a run or baseline was measured on, in pytest-benchmark's `machine_info` keys
    (its `compare` reads them), plus the torch version the ranks trained with."""

    node: str | None = None  # hostname
    machine: str | None = None
    system: str | None = None
    release: str | None = None  # the kernel
    python_implementation: str | None = None
    python_version: str | None = None
    cpu: CpuInfo | None = None
    torch_version: str | None = None

    @classmethod
    def of_this_host(cls) -> MachineInfo:
        return cls(node=socket.gethostname(), machine=platform.machine(),
                   system=platform.system(), release=platform.release(),
                   python_implementation=platform.python_implementation(),
                   python_version=platform.python_version(),
                   cpu=CpuInfo(brand_raw=_cpu_model(), count=os.cpu_count()),
                   torch_version=_torch_version())

    # Not compared: a hostname says which machine, not what kind (CI runners get a new one
    # each job, and the same kind of host times the same).
    IDENTITY: ClassVar[frozenset[str]] = frozenset({"node"})

    def differences(self, other: MachineInfo) -> list[str]:
        """'field: mine != other's' for each field both record and that differs (a field one
        of them lacks, e.g. from an older file, is not a difference)."""
        mine, theirs = _flat(self.dump()), _flat(other.dump())
        return [f"{key}: {mine[key]!r} != {theirs[key]!r}" for key in mine
                if key not in self.IDENTITY and key in theirs and mine[key] is not None
                and theirs[key] is not None and mine[key] != theirs[key]]


def machine_warning(saved: MachineInfo | None, current: MachineInfo, source: str) -> str | None:
    """A line when `source` (a baseline) was measured on another kind of host than this one:
    absolute times move with the CPU, kernel and torch, so a regression may be the host's."""
    if saved is None:
        return None
    differences = saved.differences(current)
    if not differences:
        return None
    return (f"warning: {source} was measured on a different machine (saved != current): "
            + "; ".join(differences))


def _flat(data: Mapping[str, Any], prefix: str = "") -> dict[str, Any]:
    flat: dict[str, Any] = {}
    for key, value in data.items():
        if isinstance(value, Mapping):
            flat |= _flat(value, f"{prefix}{key}.")
        else:
            flat[f"{prefix}{key}"] = value
    return flat


def _cpu_model() -> str | None:
    try:
        for line in Path("/proc/cpuinfo").read_text().splitlines():
            key, _, value = line.partition(":")
            if key.strip() == "model name":
                return value.strip()
    except OSError:
        pass
    return platform.processor() or None


def _torch_version() -> str | None:
    """From the installed package's metadata: importing torch takes seconds."""
    from importlib.metadata import PackageNotFoundError, version

    try:
        return version("torch")
    except PackageNotFoundError:
        return None


def content_digest(data: Any) -> str:
    """A stable hash of JSON-able content (key order does not matter)."""
    return hashlib.sha256(json.dumps(data, sort_keys=True).encode()).hexdigest()[:16]


def utc_now() -> str:
    return datetime.datetime.now(datetime.UTC).isoformat()
