"""What `netsim-ddp host` refuses before anything on a host changes (no network needed)."""

import dataclasses
from pathlib import Path

import pytest

from netsim_ddp import Scenario
from netsim_ddp.fabric.nic.checks import NicError, NicInfo, check_nic
from netsim_ddp.hostfacts.gpus import GPUS_ENV, GpuInventory
from netsim_ddp.hostfacts.nccl import verify_transport
from netsim_ddp.run.hosts.host_agent import HostAgent
from netsim_ddp.run.hosts.host_options import HostConfigError, HostOptions, host_placement, validate


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
    with pytest.raises(HostConfigError, match="link.tcp: sets the emulated nodes' TCP"):
        validate(options(link={"rate": "1gbit", "tcp": {"rto_min": "5ms"}}))
    with pytest.raises(HostConfigError, match="link.busbw_from: shapes the emulated links"):
        validate(options(link={"rate": "1gbit", "busbw_from": "cluster.txt"}))


def test_a_time_dilated_scale_model_is_refused_and_replay_alone_runs():
    # Real NICs run in real time: a dilation k would make every time the agent reports k x
    # too long (and the cluster's rates k x too high); compute replay needs no dilation.
    replay = {"layout": "resnet50", "compute": "120ms"}
    validate(options(workload=replay))
    with pytest.raises(HostConfigError, match=r"emulation\.dilation: a time-dilated scale "
                       r"model runs on one host \(`netsim-ddp run`\)"):
        validate(options(workload=replay, emulation={"dilation": 20}))
    with pytest.raises(HostConfigError, match=r"emulation\.dilation"):
        validate(options(emulation={"dilation": "auto"}))


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


EIGHT_GPUS = GpuInventory(8, ("H100",) * 8, "2.11.0", "12.8", "2.27.7")


def gpu_agent(backend="auto", environ=None, nic="ens5"):
    """An agent of an 8-GPU host with 8 ranks per node, its backend resolved as `host` does."""
    opts = options(topology={"nodes": 2, "ranks_per_node": 8},
                   workload={"params": "1M", "backend": backend})
    opts = dataclasses.replace(opts, nic=nic)
    agent = HostAgent(opts, progress=lambda message: None)
    agent.placement = host_placement(opts, EIGHT_GPUS, environ={} if environ is None else environ)
    agent.job = "job123"
    return agent


def test_an_eight_gpu_host_confines_nccl_to_its_nic():
    """'auto' on a GPU host is NCCL, and NCCL is pinned to --nic: sockets only, InfiniBand,
    RoCE and multi-node NVLink off, its INIT/NET lines logged for the transport check."""
    agent = gpu_agent()
    assert agent.placement.backend == "nccl"
    env = agent.phase_env({})
    assert env["NCCL_SOCKET_IFNAME"] == "=ens5" and env["GLOO_SOCKET_IFNAME"] == "ens5"
    assert env["NCCL_IB_DISABLE"] == "1" and env["NCCL_NET"] == "Socket"
    assert env["NCCL_MNNVL_ENABLE"] == "0"
    assert env["NCCL_DEBUG"] == "INFO" and {"INIT", "NET"} <= set(
        env["NCCL_DEBUG_SUBSYS"].split(","))
    assert env[GPUS_ENV] == "0,1,2,3,4,5,6,7"  # this host's 8 ranks, one GPU each
    assert "NCCL_SOCKET_IFNAME" not in gpu_agent(backend="gloo").phase_env({})


@pytest.mark.parametrize("name, value", [("NCCL_IB_DISABLE", "0"), ("NCCL_SOCKET_IFNAME", "ib0"),
                                         ("NCCL_MNNVL_ENABLE", "1"), ("NCCL_NET", "IB")])
def test_a_users_nccl_setting_that_takes_traffic_off_the_nic_refuses_the_host(name, value):
    with pytest.raises(HostConfigError, match=f"{name}={value}"):
        gpu_agent(environ={name: value})


def test_the_transport_is_checked_on_the_hosts_nics():
    lines = ["h0:1:1 [0] NCCL INFO NET/Socket : Using [0]ens5:10.0.0.9<0>",
             "h1:1:1 [0] NCCL INFO NET/Socket : Using [0]eth1:10.0.0.10<0>",
             "h0:1:1 [0] NCCL INFO Channel 00/0 : 0[0] -> 1[0] [send] via NET/Socket/0"]
    assert verify_transport(lines, 2, 1, "ens5,eth1").ok
    assert not verify_transport(lines, 2, 1, "ens5").ok  # eth1 is not a NIC of the job
