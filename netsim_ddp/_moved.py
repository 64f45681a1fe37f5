"""Import paths from before the package was split into wings, kept for one release.

`from netsim_ddp.runner import run_scenario` still works and warns (DeprecationWarning) with the
new path. The old name is bound to the new module object itself, so patching either patches the
same module and nothing is imported twice.
"""

from __future__ import annotations

import importlib
import importlib.abc
import importlib.machinery
import importlib.util
import sys
import warnings
from collections.abc import Sequence
from types import ModuleType

MOVED = {
    f"netsim_ddp.{old}": f"netsim_ddp.{new}" for old, new in {
        "files": "common.files", "clock": "common.clock", "signals": "common.signals",
        "options": "common.options", "metrics": "common.metrics",
        "workload.modes": "precision.modes", "workload.hooks": "precision.hooks",
        "workload.config": "scenario.workload", "units": "scenario.units",
        "limits": "scenario.limits", "sweepconfig": "scenario.sweep",
        "gpus": "hostfacts.gpus", "hostload": "hostfacts.hostload",
        "placement": "hostfacts.placement",
        "document": "measure.document", "mode_report": "measure.mode_report",
        "gate": "verdicts.gate", "crossing": "verdicts.crossing",
        "schedule_checks": "verdicts.schedule_checks", "baseline": "verdicts.baseline",
        "history": "verdicts.history", "changepoint": "verdicts.changepoint",
        "costmodel": "projection.costmodel", "calibrate": "projection.calibrate",
        "cluster": "projection.cluster", "ncclparse": "projection.nccl_tests",
        "tables": "report.tables", "plots": "report.plots", "timeline": "report.timeline",
        "figures": "report.figures", "ci": "report.ci",
        "runner": "run.runner", "session": "run.session", "sweep": "run.sweep",
        "host": "run.host_agent",
    }.items()
}


class _Alias(importlib.abc.Loader):
    def __init__(self, new: str) -> None:
        self.new = new

    def create_module(self, spec: importlib.machinery.ModuleSpec) -> ModuleType:
        return importlib.import_module(self.new)

    def exec_module(self, module: ModuleType) -> None:
        pass  # the new module ran already


class _MovedFinder(importlib.abc.MetaPathFinder):
    def find_spec(self, fullname: str, path: Sequence[str] | None,
                  target: ModuleType | None = None) -> importlib.machinery.ModuleSpec | None:
        new = MOVED.get(fullname)
        if new is None:
            return None
        warnings.warn(f"{fullname} has moved to {new}; the old path goes away in the next "
                      "release", DeprecationWarning, stacklevel=2)
        return importlib.util.spec_from_loader(fullname, _Alias(new))


def install() -> None:
    if not any(isinstance(finder, _MovedFinder) for finder in sys.meta_path):
        sys.meta_path.append(_MovedFinder())
