import pytest


@pytest.fixture(scope="session")
def capabilities():
    from netsim_ddp.fabric.capabilities import probe_capabilities

    return probe_capabilities()


@pytest.fixture
def needs_fabric(capabilities):
    if not capabilities.can_build:
        pytest.skip(f"this host cannot build namespaces and shaped veths: {capabilities.error}")
    return capabilities


pytest_plugins = ["pytester"]
