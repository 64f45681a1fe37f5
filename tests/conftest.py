import sys

import pytest
from bounded_run import run_bounded


@pytest.fixture(scope="session")
def lacks_fabric():
    """lacks_fabric(reason): this host cannot give a test the network it needs; a skip, saying
    why, or a failure under NETSIM_DDP_REQUIRE_FABRIC, which `.ci/run` sets: there a regression
    in the capability probe cannot skip the netns and ddp tiers green (the plugin's own)."""
    from netsim_ddp.plugin import lacks_fabric

    return lacks_fabric


@pytest.fixture(scope="session")
def capabilities():
    from netsim_ddp.fabric.capabilities import probe_capabilities

    return probe_capabilities()


@pytest.fixture
def needs_fabric(capabilities, lacks_fabric):
    if not capabilities.can_build:
        missing = [name for name in ("namespaces", "veth", "bridge", "tbf")
                   if not getattr(capabilities, name)]
        lacks_fabric("this host cannot build namespaces and shaped veths: "
                     f"{capabilities.error or 'the probe found no ' + ', '.join(missing)}")
    return capabilities


@pytest.fixture(scope="session")
def unprivileged():
    """Commands run as an unprivileged user (`nobody`) with a venv it can run: see
    tests/unprivileged.py. Skips where this session is not root; where root cannot drop to such
    a user, lacks_fabric: a skip, or a failure under NETSIM_DDP_REQUIRE_FABRIC."""
    from unprivileged import unprivileged_user

    with unprivileged_user() as user:
        yield user


# tier_guard: a unit-tier test that builds a namespace or trains fails, naming its marker.
pytest_plugins = ["pytester", "tier_guard"]


@pytest.fixture
def measure_until():
    """Timing measured on a shared 2-core VM, for tests of what the emulated network allows.

    A stall (the hypervisor, another process) only ever makes such a measurement worse than the
    network allows: less goodput, later packets, never more or earlier. So a measurement that
    misses is taken again, up to `attempts` times, and the test checks the last one as strictly
    as before: a real fault misses every attempt, a stall does not repeat."""

    def measure_until(measure, good, attempts=3):
        for _ in range(attempts):
            result = measure()
            if good(result):
                break
        return result

    return measure_until


@pytest.fixture
def run_cli():
    """`netsim-ddp ARGS...` in a subprocess, output captured. Past `timeout` it is stopped with
    SIGTERM, as Ctrl-C would stop it, so it removes its network and ranks, and the test fails:
    subprocess.run's SIGKILL would leave the ranks training and loading the host for the tests
    that follow (a CI run here once lost a delay-line test and 15 minutes that way)."""

    def run(*args, timeout=300):
        argv = [sys.executable, "-m", "netsim_ddp.cli", *map(str, args)]
        return run_bounded(argv, timeout, f"netsim-ddp {' '.join(map(str, args))}")

    return run
