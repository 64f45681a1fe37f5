"""What `netsim-ddp host` refuses before anything on a host changes (no network needed)."""

from pathlib import Path

import pytest

from netsim_ddp import Scenario
from netsim_ddp.fabric.nic import NicError, NicInfo, check_nic
from netsim_ddp.run.host_agent import HostConfigError, HostOptions, validate


def options(nnodes=2, node_rank=0, **scenario):
    data = {"name": "h", "topology": {"nodes": 2}, "link": {"rate": "1gbit"},
            "workload": {"params": "1M"}} | scenario
    return HostOptions(scenario=Scenario.from_dict(data), node_rank=node_rank, nnodes=nnodes,
                       master_addr="10.0.0.1", master_port=29500, nic="eth1", out_dir=Path("."))


def test_nodes_must_be_the_hosts():
    validate(options())
    with pytest.raises(HostConfigError, match="topology.nodes is 2 but --nnodes is 3"):
        validate(options(nnodes=3))
    with pytest.raises(HostConfigError, match="--node-rank 2 is outside 0..1"):
        validate(options(node_rank=2))


def test_what_multi_host_does_not_run_yet_is_refused_by_name():
    validate(options(background=[{"source": "n0", "destination": "n1"}]))  # runs: by name
    with pytest.raises(HostConfigError, match="link.schedule"):
        validate(options(link={"rate": "1gbit", "schedule": [
            {"at": "1s", "node": "n1", "rate": "100mbit"}]}))
    with pytest.raises(HostConfigError, match="workload: required"):
        validate(options(workload=None))


def test_every_host_must_be_given_the_same_run():
    assert options().digest() == options().digest()
    assert options().digest() != options(link={"rate": "500mbit"}).digest()


def nic(**changes):
    return NicInfo(**({"ifname": "eth1", "index": 3, "up": True, "loopback": False, "mtu": 1500,
                       "addresses": ("10.0.0.2",), "default_route": False} | changes))


def test_loopback_down_and_addressless_nics_are_refused_default_route_warned():
    assert check_nic(nic()) == []
    with pytest.raises(NicError, match="loopback"):
        check_nic(nic(ifname="lo", loopback=True))
    with pytest.raises(NicError, match="down"):
        check_nic(nic(up=False))
    with pytest.raises(NicError, match="no IPv4 address"):
        check_nic(nic(addresses=()))
    (warning,) = check_nic(nic(default_route=True))
    assert "default route" in warning
