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
