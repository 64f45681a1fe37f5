"""netsim-ddp: does a data-parallel training job still scale on this network?

Scenario files describe a cluster network; `Fabric` builds it from network namespaces on one
Linux host and shapes every link with tc.
"""

from .scenario import Scenario, ScenarioError

__version__ = "0.1.0"


def __getattr__(name: str):
    # The fabric pulls in pyroute2; load it only when asked, so `validate` and `schema` stay light.
    if name in ("Fabric", "FabricError"):
        from . import fabric

        return getattr(fabric, name)
    raise AttributeError(name)


__all__ = ["Fabric", "FabricError", "Scenario", "ScenarioError", "__version__"]
