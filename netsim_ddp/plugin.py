"""pytest plugin (registered by entry point): scenario files as tests, fixtures to test against
an emulated network, baselines to gate releases on.

    pytest scenarios/                                  # each scenario file is a test
    pytest scenarios/ --netsim-save-baseline base.json
    pytest scenarios/ --netsim-baseline base.json --netsim-tolerance median:10%
    pytest scenarios/ --netsim-history history/        # judged against every earlier run

Hooks stay thin; the work lives in the library (runner, gate, baseline, report).
"""

from __future__ import annotations

import os
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import TYPE_CHECKING, Any, NoReturn

import pytest

from netsim_ddp.scenario.spec import Scenario, ScenarioError

if TYPE_CHECKING:
    from _pytest._code.code import TerminalRepr

    from netsim_ddp.run.session import NetsimSession

XDIST_GROUP = "netsim-ddp"
_SESSION: pytest.StashKey[NetsimSession] = pytest.StashKey()
UNTRUSTED_ENV = "NETSIM_DDP_UNTRUSTED"
UNTRUSTED_CHOICES = ("skip", "fail")
# Runs that tests made through `netsim_run` of a scenario exactly as loaded (no overrides), by
# the scenario's JSON: that file's own item reports such a run rather than measure it again.
_RUNS: pytest.StashKey[dict[str, Any]] = pytest.StashKey()


def pytest_addoption(parser: pytest.Parser) -> None:
    from netsim_ddp.common.options import SESSION_OPTIONS

    group = parser.getgroup("netsim-ddp", "emulated-network DDP scenarios")
    for option in SESSION_OPTIONS.values():
        text = option.help.replace("%", "%%")  # argparse formats help with %
        if option.default is not None and option.kind != "flag":
            text += f" (default {option.default})"
        extra: dict[str, Any] = (
            {"action": "store_true"} if option.kind == "flag" else
            {"action": "append", "default": None} if option.kind == "list" else
            {"type": _positive_int} if option.kind == "count" else
            {"type": float, "default": option.default} if option.kind == "fraction" else {})
        if option.metavar:
            extra["metavar"] = option.metavar
        group.addoption(option.pytest_flag, dest=option.pytest_dest, help=text, **extra)
    group.addoption(
        "--netsim-untrusted", dest="netsim_untrusted", choices=UNTRUSTED_CHOICES,
        default=os.environ.get(UNTRUSTED_ENV) or "skip",
        help="a scenario this host could not emulate faithfully: 'skip' it with its reason "
             "(default), or 'fail' it, for CI that must measure or go red (also "
             f"{UNTRUSTED_ENV}=fail)")
    parser.addini("netsim_scenario_dirs", type="args", default=["scenarios"],
                  help="folders whose *.toml files are scenarios (default: scenarios)")
    parser.addini("netsim_rootless", type="bool", default=True,
                  help="without root, move a session that may select netns tests into a user "
                       "namespace at its start (default: true)")


def _positive_int(text: str) -> int:
    value = int(text)
    if value < 1:
        raise ValueError(f"{value} is not a positive count")
    return value


# Test tiers: a test that builds a network is `netns`; one that trains is `ddp` as well, so
# `pytest -m "not netns and not ddp"` selects the tests that need neither privileges nor time.
TIER_MARKERS = {
    "netns": "needs root or user namespaces to build a real emulated network",
    "ddp": "runs real DDP training (slower)",
}
# The plugin's fixtures, and the tiers a test that uses one belongs to.
FIXTURE_TIERS = {"fabric": ("netns",), "make_fabric": ("netns",), "netsim_run": ("netns", "ddp")}


@pytest.hookimpl(tryfirst=True)
def pytest_load_initial_conftests(early_config: pytest.Config) -> None:
    _enter_rootless(early_config)  # before conftests and test modules import numpy or torch


def _enter_rootless(config: pytest.Config) -> None:
    """Without root, the session enters its user namespace now, before anything starts a
    thread, or is started again inside it (fabric/namespaces/privilege.py): later, a test
    module's numpy would have made that impossible. Only where the session may build a network."""
    from netsim_ddp.fabric.namespaces.userns import ENV

    if os.geteuid() == 0 and ENV not in os.environ:
        return  # root (the common case): nothing to enter, nothing to import
    from netsim_ddp.fabric.namespaces import privilege

    if privilege.mode() is not None or not may_build_networks(config):
        return
    capture = config.pluginmanager.getplugin("capturemanager")
    if capture is not None:  # a restarted session must write to the real stdout and stderr
        capture.suspend_global_capture(in_=True)
    try:
        privilege.prepare(restart=True)  # a refusal is reported by the tests that need it
    finally:
        if capture is not None:
            capture.resume_global_capture()


def may_build_networks(config: pytest.Config) -> bool:
    """False for sessions that cannot run a netns test: --help, --collect-only, a -m that
    deselects the tier (the unit tier), or `netsim_rootless = false`."""
    options = config.known_args_namespace
    if any(getattr(options, name, False) for name in ("help", "version", "collectonly")):
        return False
    if not config.getini("netsim_rootless"):
        return False
    markexpr = getattr(options, "markexpr", "")
    if not markexpr:
        return True
    try:
        from _pytest.mark.expression import Expression

        expression = Expression.compile(markexpr)
        return any(expression.evaluate(_marked(marks)) for marks in ({"netns"}, {"netns", "ddp"}))
    except Exception:  # pytest's private API moved: assume the session may need it
        return True


def _marked(marks: set[str]) -> Callable[..., bool]:
    """A -m expression's matcher for an item that carries `marks`."""

    def matcher(name: str, /, **_: object) -> bool:
        return name in marks

    return matcher


def pytest_configure(config: pytest.Config) -> None:
    _enter_rootless(config)  # a plugin registered too late for pytest_load_initial_conftests
    config.addinivalue_line("markers", "netsim: a netsim-ddp scenario run")
    registered = {line.split(":")[0].split("(")[0].strip() for line in config.getini("markers")}
    for name, description in TIER_MARKERS.items():
        if name not in registered:  # a project may describe its tiers itself
            config.addinivalue_line("markers", f"{name}: {description}")
    config.addinivalue_line(
        "markers", "netsim_scenario(source): the scenario (file, dict or Scenario) that the "
        "`scenario`, `fabric` and `netsim_run` fixtures of a test use")
    from netsim_ddp.run.session import NetsimSession, SessionOptionError

    config.stash[_RUNS] = {}
    if config.getoption("netsim_untrusted") not in UNTRUSTED_CHOICES:  # the variable's value
        raise pytest.UsageError(f"{UNTRUSTED_ENV}={config.getoption('netsim_untrusted')!r}: "
                                f"use one of {', '.join(UNTRUSTED_CHOICES)}")
    try:
        config.stash[_SESSION] = NetsimSession.from_config(config)
    except SessionOptionError as exc:
        raise pytest.UsageError(str(exc)) from None


def pytest_report_header(config: pytest.Config) -> list[str]:
    lines = [f"netsim-ddp: {warning}" for warning in config.stash[_SESSION].warnings]
    if getattr(config.option, "numprocesses", None):
        lines.append(f"netsim-ddp: scenario runs carry xdist_group({XDIST_GROUP!r}); with "
                     "--dist loadgroup they run one at a time, since concurrent runs contend "
                     "for this host's CPU and would distort each other's timings (their names "
                     "never collide)")
    return lines


def pytest_collect_file(file_path: Path, parent: pytest.Collector) -> pytest.Collector | None:
    session = parent.config.stash[_SESSION]
    if file_path.suffix == ".toml" and session.is_scenario_file(file_path):
        return ScenarioFile.from_parent(parent, path=file_path)
    return None


def pytest_itemcollected(item: pytest.Item) -> None:
    """Tests using the network fixtures join their tier, as scenario files do, so that
    `-m "not netns and not ddp"` never selects a test that builds a network or trains."""
    for fixture in getattr(item, "fixturenames", ()):
        for name in FIXTURE_TIERS.get(fixture, ()):
            if item.get_closest_marker(name) is None:
                item.add_marker(name)


def pytest_sessionfinish(session: pytest.Session) -> None:
    session.config.stash[_SESSION].finish()


def pytest_terminal_summary(terminalreporter, config: pytest.Config) -> None:
    for line in config.stash[_SESSION].summary_lines():
        terminalreporter.write_line(line)


class ScenarioFile(pytest.File):
    def collect(self) -> Iterator[pytest.Item]:
        try:
            scenario = Scenario.load(self.path)
        except ScenarioError as exc:
            raise self.CollectError(str(exc)) from None
        if scenario.workload is not None:  # a network without training has nothing to judge
            yield ScenarioItem.from_parent(self, name=scenario.name, scenario=scenario)


class ScenarioFailure(Exception):
    """A scenario run whose checks failed, or that broke."""


class ScenarioItem(pytest.Item):
    def __init__(self, *, scenario: Scenario, **kwargs: Any):
        super().__init__(**kwargs)
        self.scenario = scenario
        self.add_marker(pytest.mark.netsim)
        for name in TIER_MARKERS:  # it builds its network and trains in it
            self.add_marker(name)
        self.add_marker(pytest.mark.xdist_group(XDIST_GROUP))

    def runtest(self) -> None:
        session = self.config.stash[_SESSION]
        measured = self.config.stash[_RUNS].get(self.scenario.model_dump_json())
        if self.scenario.sweep is not None:
            sweep = session.run_sweep(self.scenario) if measured is None else measured
            if sweep.status == "untrusted":
                self._untrusted("; ".join(sweep.refusals))
            if not sweep.passed:
                raise ScenarioFailure(session.sweep_failure_text(sweep))
            return
        report = session.run(self.scenario) if measured is None else measured
        self.user_properties.extend(session.properties(report))
        if report.status == "untrusted":
            self._untrusted(report.untrusted_reason or "")
        if report.status != "passed":
            raise ScenarioFailure(session.failure_text(report))

    def _untrusted(self, reason: str) -> NoReturn:
        """Skipped with the reason by default: nothing was judged. Failed under
        --netsim-untrusted fail, for CI that must measure or go red."""
        if self.config.getoption("netsim_untrusted") == "fail":
            raise ScenarioFailure(f"{self.scenario.name}: UNTRUSTED (--netsim-untrusted fail): "
                                  f"{reason}")
        # raise, not pytest.skip(): NoReturn for mypy also where pytest's types are absent
        raise pytest.skip.Exception(f"{self.scenario.name}: untrusted on this host: {reason}")

    def repr_failure(self, excinfo: pytest.ExceptionInfo[BaseException],
                     style=None) -> str | TerminalRepr:
        if isinstance(excinfo.value, ScenarioFailure):
            return str(excinfo.value)
        return super().repr_failure(excinfo, style=style)

    def reportinfo(self) -> tuple[Path, int | None, str]:
        return self.path, None, f"scenario {self.scenario.name}"


# -- fixtures for tests written in Python --------------------------------------------------------

def _as_scenario(source: Scenario | str | Path | dict[str, Any]) -> Scenario:
    if isinstance(source, Scenario):
        return source
    if isinstance(source, dict):
        return Scenario.from_dict(source)
    return Scenario.load(source)


# Set (to anything but "" or "0") on a host known to build every network, as a CI machine is:
# a fixture that cannot build one then fails instead of skipping, so a broken capability probe
# cannot turn a suite green by skipping it.
REQUIRE_FABRIC_ENV = "NETSIM_DDP_REQUIRE_FABRIC"


def lacks_fabric(reason: str) -> None:
    """This host cannot give a test the network it needs: a skip, saying why, or a failure
    where the host must build every network (REQUIRE_FABRIC_ENV)."""
    if os.environ.get(REQUIRE_FABRIC_ENV, "") not in ("", "0"):
        pytest.fail(f"{REQUIRE_FABRIC_ENV} is set, but {reason}", pytrace=False)
    pytest.skip(reason)


def _skip_unless_buildable() -> None:
    from netsim_ddp.fabric.capabilities import probe_capabilities

    capabilities = probe_capabilities()
    if not capabilities.can_build:
        lacks_fabric("this host cannot build an emulated network: "
                     f"{capabilities.error or capabilities}")


@pytest.fixture
def scenario(request: pytest.FixtureRequest) -> Scenario:
    """The scenario named by the test's `netsim_scenario` marker (a file, dict or Scenario),
    or by indirect parametrization."""
    marker = request.node.get_closest_marker("netsim_scenario")
    source = getattr(request, "param", None) or (marker.args[0] if marker else None)
    if source is None:
        raise pytest.UsageError(
            f"{request.node.nodeid}: the scenario fixture needs "
            "@pytest.mark.netsim_scenario('scenarios/x.toml') or indirect parametrization")
    return _as_scenario(source)


@pytest.fixture
def fabric(scenario: Scenario) -> Iterator[Any]:
    """The scenario's network, built for the test and removed after it."""
    from netsim_ddp.fabric import Fabric

    _skip_unless_buildable()
    with Fabric(scenario) as built:
        yield built


@pytest.fixture(scope="session")
def netsim_run(request: pytest.FixtureRequest) -> Callable[..., Any]:
    """Run a scenario's training (its file, dict or Scenario) with this session's options;
    returns the ScenarioReport (modes, checks, status), or for a scenario with a [sweep] the
    SweepReport (its points, fit, held-out check). A run without overrides is the one its scenario
    file's item would make: that item reports it rather than measure it again."""
    session = request.config.stash[_SESSION]

    def run(source: Scenario | str | Path | dict[str, Any], **kwargs: Any) -> Any:
        _skip_unless_buildable()
        scenario = _as_scenario(source)
        if scenario.sweep is not None:
            report = session.run_sweep(scenario, **kwargs)
        else:
            report = session.run(scenario, **kwargs)
        if not kwargs:
            request.config.stash[_RUNS][scenario.model_dump_json()] = report
        return report

    return run


@pytest.fixture
def make_fabric() -> Iterator[Callable[..., Any]]:
    """Build emulated networks for a test; every one is removed when the test ends.

        def test_link(make_fabric):
            fabric = make_fabric("scenarios/default.toml")
            a, b = fabric.nodes

    Skips the test, saying why, where this host can build no network at all.
    """
    from netsim_ddp.fabric import Fabric

    _skip_unless_buildable()
    built: list[Fabric] = []

    def build(source: Scenario | str | Path | dict[str, Any], **kwargs: Any) -> Fabric:
        fabric = Fabric(_as_scenario(source), **kwargs)
        fabric.__enter__()
        built.append(fabric)
        return fabric

    yield build
    for fabric in reversed(built):
        fabric.close()
