# Root conftest: the benchmarks are run on purpose (`pytest bench/`), not with the tests.
import pytest

collect_ignore = ["build", "dist"]

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
