"""Which nodes each machine of a spread scale model holds, what such a run refuses, and the
overlay's checks (scenario/machines.py, fabric/overlay.py): pure, no kernel."""

from __future__ import annotations

import pytest

from netsim_ddp.fabric.nic.checks import NicInfo
from netsim_ddp.fabric.overlay import OverlayError, check_underlay, vni_of
from netsim_ddp.scenario.machines import MachineConfigError, check_machines, machine_share
from netsim_ddp.scenario.spec import Scenario


@pytest.mark.parametrize(("nodes", "machines"), [(8, 2), (7, 3), (32, 5), (3, 3)])
def test_shares_cover_every_node_once_in_order_node0_on_machine0(nodes, machines):
    shares = [machine_share(nodes, machines, m) for m in range(machines)]
    assert [i for share in shares for i in share] == list(range(nodes))
    assert 0 in shares[0]
    assert max(map(len, shares)) - min(map(len, shares)) <= 1


def test_a_share_outside_the_job_is_refused():
    with pytest.raises(MachineConfigError, match="--machine-rank 2 is outside 0..1"):
        machine_share(8, 2, 2)
    with pytest.raises(MachineConfigError, match="--machines 3 is more than topology.nodes 2"):
        machine_share(2, 3, 0)


def _scenario(**changes) -> Scenario:
    data = {"name": "m", "topology": {"nodes": 4}, "link": {"rate": "1gbit"},
            "emulation": {"dilation": 4},
            "workload": {"layout": "generic", "params": "1M", "compute": "10ms"}}
    for table, values in changes.items():
        data[table] = {**data.get(table, {}), **values} if isinstance(values, dict) else values
    return Scenario.from_dict(data)


def test_a_plain_scale_model_is_accepted():
    check_machines(_scenario(), 2)


@pytest.mark.parametrize(("changes", "field"), [
    ({"emulation": {"dilation": "auto"}}, "emulation.dilation = 'auto'"),
    ({"link": {"delay": "1ms"}}, "link delay, jitter or loss"),
    ({"background": [{"source": 0, "destination": 1, "rate": "100mbit"}]}, "background"),
    ({"topology": {"nodes": 4, "racks": 2, "uplink": {"rate": "1gbit"}}}, "topology.racks"),
    ({"workload": {"backend": "nccl"}}, "workload.backend = 'nccl'"),
])
def test_what_is_not_built_across_machines_is_refused_naming_the_field(changes, field):
    with pytest.raises(MachineConfigError) as refused:
        check_machines(_scenario(**changes), 2)
    assert field in str(refused.value) and "m: " in str(refused.value)


def _nic(mtu: int, addresses=("10.0.0.1",)) -> NicInfo:
    return NicInfo(ifname="eth1", index=3, up=True, loopback=False, mtu=mtu,
                   addresses=addresses, default_route=False)


def test_the_underlay_must_carry_a_frame_plus_vxlan():
    check_underlay(_nic(1550), 1500)
    with pytest.raises(OverlayError, match="MTU 1549 .* at least 1550 .* at most 1499"):
        check_underlay(_nic(1549), 1500)
    with pytest.raises(OverlayError, match="no IPv4 address"):
        check_underlay(_nic(9000, ()), 1500)


def test_every_machine_derives_the_same_vni_from_the_job():
    assert vni_of("ab12cd") == vni_of("ab12cd")
    assert 0 < vni_of("ab12cd") < 2 ** 24
    assert vni_of("ab12cd") != vni_of("ab12ce")
