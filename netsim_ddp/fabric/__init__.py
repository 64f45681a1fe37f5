"""The emulated network: the only package that talks to the kernel (through pyroute2)."""

from netsim_ddp.fabric.capabilities import Capabilities, probe_capabilities
from netsim_ddp.fabric.emulated_network import Fabric, LinkCounters, Node
from netsim_ddp.fabric.errors import FabricError
from netsim_ddp.fabric.namespaces.privilege import PrivilegeError, ensure_network_privilege
from netsim_ddp.fabric.plan import FabricPlan, NodePlan, QdiscPlan, plan_fabric

__all__ = [
    "Capabilities", "Fabric", "FabricError", "FabricPlan", "LinkCounters", "Node", "NodePlan",
    "PrivilegeError", "QdiscPlan", "ensure_network_privilege", "plan_fabric",
    "probe_capabilities",
]
