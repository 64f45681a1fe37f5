"""netsim-ddp: does a data-parallel training job still scale on this network?

Scenario files describe a cluster network; `Fabric` builds it from network namespaces on one
Linux host and shapes every link with tc; `run_scenario` trains every mode on it and judges the
result; `load_document` reads a results file back; `step()` marks where a user's training
script's step ends, when netsim-ddp runs it (docs/scripts.md). The wings, in the order of the
flow (a wing imports only the wings before it): common, precision, scenario, fabric, workload,
measure, verdicts, projection, report, run; `cli` and `plugin` are the two front ends.
"""

from netsim_ddp.common.version import __version__
from netsim_ddp.scenario import Scenario, ScenarioError

# Loaded when first asked for: the fabric pulls in pyroute2 and the runner torch, so `validate`
# and `schema` stay light.
_LAZY = {
    "Fabric": "netsim_ddp.fabric",
    "FabricError": "netsim_ddp.fabric",
    "run_scenario": "netsim_ddp.run.runner",
    "step": "netsim_ddp.workload.contract.steps",
    "load_document": "netsim_ddp.measure.document",
}


def __getattr__(name: str):
    if name in _LAZY:
        import importlib

        return getattr(importlib.import_module(_LAZY[name]), name)
    raise AttributeError(name)


__all__ = ["Fabric", "FabricError", "Scenario", "ScenarioError", "__version__", "load_document",
           "run_scenario", "step"]
