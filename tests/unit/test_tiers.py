"""The test tiers: which tier each kind of test lands in, the guard that keeps a test that builds
a network or trains out of the unit tier, and a tier that selects nothing passing.

The inner pytest sessions run in this process and only collect, or are refused before anything
starts: nothing here builds a network or trains."""

import textwrap
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[2]
UNIT, NETNS, DDP = "not netns and not ddp", "netns and not ddp", "ddp"

SCENARIO = """
    [topology]
    nodes = 2
    [link]
    rate = "1gbit"
    [workload]
    params = "1M"
"""


def collected(pytester, markexpr):
    result = pytester.runpytest("--collect-only", "-q", "-m", markexpr)
    return sorted(line.split("::")[-1] for line in result.outlines if "::" in line)


def test_scenario_files_and_the_plugins_network_fixtures_join_their_tiers(pytester):
    (pytester.path / "scenarios").mkdir()
    (pytester.path / "scenarios" / "tiny.toml").write_text(textwrap.dedent(SCENARIO))
    pytester.makepyfile(test_fixtures="""
        def test_plain():
            pass

        def test_builds(make_fabric):
            pass

        def test_network(fabric):
            pass

        def test_trains(netsim_run):
            pass
    """)
    assert collected(pytester, UNIT) == ["test_plain"]
    assert collected(pytester, NETNS) == ["test_builds", "test_network"]
    assert collected(pytester, DDP) == ["test_trains", "tiny"]


def test_an_unmarked_test_that_trains_or_builds_a_namespace_fails_naming_its_marker(pytester):
    # Each "training" command line is a harmless `python -c pass ...` that only looks like one:
    # were the guard broken, nothing heavy would start.
    pytester.makepyfile(test_slips="""
        import subprocess
        import sys

        import pytest

        from netsim_ddp.fabric.namespaces import netns

        TORCHRUN = [sys.executable, "-c", "pass", "-m", "torch.distributed.run"]
        CLI_RUN = [sys.executable, "-c", "pass", "netsim_ddp.cli", "run", "x.toml"]
        CLI_VALIDATE = [sys.executable, "-c", "pass", "netsim_ddp.cli", "validate", "x.toml"]

        def test_torchrun_unmarked():
            try:  # an `except Exception` does not hide the slip
                subprocess.run(TORCHRUN, check=True)
            except Exception:
                pass

        def test_cli_run_unmarked():
            subprocess.run(CLI_RUN, check=True)

        def test_namespace_unmarked():
            netns.libc.setns  # looked up only: the guard refuses before any call

        def test_cli_validate_is_a_unit_test():
            subprocess.run(CLI_VALIDATE, check=True)

        @pytest.mark.ddp
        def test_torchrun_marked():
            subprocess.run(TORCHRUN, check=True)

        @pytest.mark.netns
        def test_namespace_marked():
            assert callable(netns.libc.setns)
    """)
    result = pytester.runpytest("-p", "tier_guard")
    result.assert_outcomes(passed=3, failed=3)
    result.stdout.fnmatch_lines_random([
        "*test_torchrun_unmarked starts a DDP training process, but has no `ddp` marker*",
        "*test_cli_run_unmarked runs `netsim-ddp run`, but has no `ddp` marker*",
        "*test_namespace_unmarked creates or enters a network namespace, but has no `netns` "
        "marker*",
    ])


@pytest.mark.parametrize(("markexpr", "exit_code"), [
    (NETNS, 0), (DDP, 0), (UNIT, 0),  # a tier with nothing here: fine
    ("netns", 5),                      # any other selection of nothing: pytest's usual code
])
def test_an_empty_tier_passes(pytester, markexpr, exit_code):
    pytester.makeconftest((ROOT / "conftest.py").read_text())
    pytester.makepyfile(test_one="""
        import pytest

        @pytest.mark.ddp
        def test_trains():
            pass
    """)
    args = ["-m", markexpr] if markexpr != UNIT else ["-m", markexpr, "-k", "nothing"]
    assert pytester.runpytest(*args).ret == exit_code


@pytest.mark.parametrize(("required", "outcome"), [("", "skipped"), ("1", "errors")])
def test_a_host_without_the_fabric_skips_but_fails_where_it_is_required(
        pytester, monkeypatch, required, outcome):
    # .ci/run sets NETSIM_DDP_REQUIRE_FABRIC=1: there a probe that finds nothing (or a
    # regression in the probe) fails the netns and ddp tiers instead of skipping them green.
    pytester.makeconftest((ROOT / "tests" / "conftest.py").read_text())
    pytester.makepyfile(test_one="""
        import pytest
        from netsim_ddp.fabric.capabilities import Capabilities

        @pytest.fixture(scope="session")
        def capabilities():
            return Capabilities.unavailable("none", "no namespaces on this host")

        def test_in_the_fabric(needs_fabric):
            pass
    """)
    monkeypatch.setenv("NETSIM_DDP_REQUIRE_FABRIC", required)
    result = pytester.runpytest("-rs")
    result.assert_outcomes(**{outcome: 1})
    result.stdout.fnmatch_lines(["*cannot build namespaces and shaped veths: no namespaces on "
                                 "this host*"])


def test_every_test_module_has_a_basename_of_its_own():
    """Test folders have no __init__.py, so pytest imports each module by its basename: two
    test_x.py in different folders make the whole collection fail ("import file mismatch")
    in CI's tier that holds both, while a run of either folder alone passes (it has happened
    twice)."""
    seen: dict[str, Path] = {}
    for path in sorted((ROOT / "tests").rglob("test_*.py")):
        assert path.name not in seen, f"{path} and {seen[path.name]}: rename one"
        seen[path.name] = path
