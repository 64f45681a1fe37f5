# Root conftest: the benchmarks are run on purpose (`pytest bench/`), not with the tests.
import pytest

# scenarios/scale/: scale models of 16-GPU clusters, minutes each: run with `netsim-ddp run`
# (bench/scale_model.py runs them), never in the test tiers (scenarios/10gbe.toml is the small
# scale model CI runs).
collect_ignore = ["build", "dist", "scenarios/scale"]

# The test tiers, fastest first (tox environments of the same names; .ci/run runs them in this
# order). Together they select every test once.
TIERS = {
    "unit": "not netns and not ddp",  # no privileges, no training: a minute
    "netns": "netns and not ddp",     # real namespaces and the delay line
    "ddp": "ddp",                     # real training: launches, runs, sweeps, scenario files
}


@pytest.hookimpl(trylast=True)
def pytest_sessionfinish(session, exitstatus):
    # A tier with nothing in it here (a path or -k that selects none of it) is not a failure:
    # pytest's exit code 5 would otherwise stop `.ci/run` and tox.
    markexpr = session.config.option.markexpr
    if exitstatus == pytest.ExitCode.NO_TESTS_COLLECTED and markexpr in TIERS.values():
        session.exitstatus = pytest.ExitCode.OK
