"""Fixtures: simulated hosts (see simhosts.py)."""

import pytest
from simhosts import simulated_hosts


@pytest.fixture
def two_hosts(needs_fabric):
    with simulated_hosts(2) as hosts:
        yield hosts


@pytest.fixture
def three_hosts(needs_fabric):
    with simulated_hosts(3) as hosts:
        yield hosts


@pytest.fixture
def one_host(needs_fabric):
    with simulated_hosts(1) as hosts:
        yield hosts[0]


@pytest.fixture
def production_hosts(needs_fabric):
    """Two job hosts as production ones look: NICs with four queues, addresses that do not
    sort in node order as strings (.9, .10: torchrun's c10d makes node 1 its group 0), and a
    third host on the same switch that is not part of the job."""
    with simulated_hosts(2, queues=4, last_octets=[9, 10, 11], outsiders=1) as hosts:
        yield hosts


@pytest.fixture
def mq_host(needs_fabric):
    """One host whose NIC has four transmit queues, so an `mq` root applies to it."""
    with simulated_hosts(1, queues=4) as hosts:
        yield hosts[0]


@pytest.fixture
def job_and_outsider(needs_fabric):
    """Two hosts of a job and a third on the same switch that is not part of it (storage,
    another job), at addresses that do not sort in host order."""
    with simulated_hosts(2, outsiders=1, last_octets=[9, 10, 11]) as hosts:
        yield hosts
