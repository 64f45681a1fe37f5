"""The four outcomes: passed, failed (the code under test), bad input, untrusted (this host
could not emulate the scenario). Every check says which kind it is; the status, the exit code
and the pytest outcome follow from it."""

import json

import pytest

from netsim_ddp import Scenario
from netsim_ddp.cli.app import EXIT_FAILED, EXIT_OK, EXIT_UNTRUSTED, exit_code
from netsim_ddp.hostfacts.hostload import CpuLoad
from netsim_ddp.measure.document import parse_document
from netsim_ddp.verdicts.gate import Verdict, host_verdict
from netsim_ddp.verdicts.scenario_report import ScenarioReport, results_document

SCENARIO = Scenario.from_dict({"name": "outcomes", "topology": {"nodes": 2},
                               "link": {"rate": "1gbit"}})
CLAIM_OK = Verdict("amp-fp16 vs fp32", True, "faster")
CLAIM_FAILED = Verdict("amp-fp16 vs fp32", False, "not faster")
LATE_FRAMES = host_verdict("delay-line:fp32", False, "7.6% of frames left > 500 us late")


@pytest.mark.parametrize(("checks", "refused", "status"), [
    ([CLAIM_OK], None, "passed"),
    ([CLAIM_FAILED], None, "failed"),
    ([CLAIM_OK, LATE_FRAMES], None, "untrusted"),  # the host's miss is not a regression
    ([CLAIM_FAILED, LATE_FRAMES], None, "failed"),  # ...nor does it hide one
    ([], "the probe reached 52% of the link", "untrusted"),
])
def test_a_failed_check_of_the_host_makes_a_run_untrusted_never_failed(checks, refused, status):
    report = ScenarioReport(SCENARIO, checks=list(checks), refused=refused)
    assert report.status == status
    assert report.passed is (status == "passed")
    (entry,) = json.loads(results_document([report]).to_json())["scenarios"]
    assert entry["status"] == status
    kinds = {check["name"]: check.get("kind", "code") for check in entry["checks"]}
    assert all(kinds[c.name] == c.kind for c in checks)


def test_an_untrusted_run_says_what_the_host_did_and_what_to_try():
    report = ScenarioReport(SCENARIO, checks=[CLAIM_OK, LATE_FRAMES],
                            host_load=CpuLoad(busy=0.97, steal=0.13, softirq=0.02))
    reason = report.untrusted_reason
    assert "delay-line:fp32: 7.6% of frames left > 500 us late" in reason
    assert "13% stolen by the hypervisor" in reason and "try a quieter host" in reason
    assert report.untrusted_checks == ["delay-line:fp32"]
    assert ScenarioReport(SCENARIO, checks=[CLAIM_OK]).untrusted_reason is None


def test_one_exit_code_for_a_command_failed_outweighs_untrusted():
    assert exit_code(["passed", "passed"]) == EXIT_OK
    assert exit_code(["passed", "untrusted"]) == EXIT_UNTRUSTED == 3
    assert exit_code(["untrusted", "failed"]) == EXIT_FAILED
    assert exit_code(["untrusted", "error"]) == EXIT_FAILED  # a broken run is not a pass
    assert exit_code([]) == EXIT_OK


def test_results_saved_before_the_four_outcomes_read_refused_as_untrusted():
    old = {"version": 2, "scenarios": [{"name": "s", "status": "refused", "refused": "slow"}],
           "sweeps": []}
    (entry,) = parse_document(old).scenarios
    assert entry.status == "untrusted" and entry.refused == "slow"


@pytest.mark.parametrize(("first", "tries", "retried"), [
    (ScenarioReport(SCENARIO, checks=[CLAIM_OK, LATE_FRAMES]), 2, True),  # measured again
    (ScenarioReport(SCENARIO, refused="the probe reached 52%"), 1, False),  # the links: no
    (ScenarioReport(SCENARIO, checks=[CLAIM_FAILED, LATE_FRAMES]), 1, False),  # a verdict
    (ScenarioReport(SCENARIO, checks=[CLAIM_OK]), 1, False),
])
def test_an_untrusted_run_is_measured_once_more_and_says_so(monkeypatch, first, tries, retried):
    from netsim_ddp.run import runner

    calls = []

    def run_at(scenario, k, **options):
        calls.append(k)
        return first if len(calls) == 1 else ScenarioReport(SCENARIO, checks=[CLAIM_OK])

    monkeypatch.setattr(runner, "_run_at", run_at)
    report = runner.run_scenario(SCENARIO)
    assert len(calls) == tries
    assert (report.retried is not None) is retried
    if retried:
        assert report.status == "passed"
        assert report.retried == ("measured again: the first run was untrusted "
                                  "(delay-line:fp32)")
        assert json.loads(results_document([report]).to_json())["scenarios"][0]["retried"]


def test_a_bad_untrusted_setting_is_bad_input_naming_the_variable(pytester, monkeypatch):
    monkeypatch.setenv("NETSIM_DDP_UNTRUSTED", "warn")
    result = pytester.runpytest_subprocess("-p", "no:cacheprovider")
    assert result.ret == pytest.ExitCode.USAGE_ERROR
    result.stderr.fnmatch_lines(["*NETSIM_DDP_UNTRUSTED='warn': use one of skip, fail*"])
