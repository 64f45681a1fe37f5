"""The harness's verdict on a run whose timing this host decides: a test of an emulation's
timing asserts it (passed, or untrusted for a reason this host's noise can cause), not a raw
bound that a busy host breaks."""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any


def passed_or_untrusted(run: Any, may_miss: Sequence[str]) -> bool:
    """True when `run` (a ScenarioReport, or a results JSON entry) passed; False when it is
    untrusted only for checks of this host's emulation that start with one of `may_miss`
    (the caller then leaves out the numbers the host decided). Anything else fails the test
    naming the checks: an error, a failed check of the code, a host check not expected here."""
    if isinstance(run, dict):
        status, error, refused = run["status"], run.get("error"), run.get("refused")
        failed = [(c["name"], c.get("kind", "code"), c["detail"]) for c in run["checks"]
                  if not c["passed"]]
    else:
        status, error, refused = run.status, run.error, run.refused
        failed = [(c.name, c.kind, c.detail) for c in run.checks if not c.passed]
    if status == "passed":
        return True
    assert status == "untrusted" and not error and not refused, (status, error, refused, failed)
    unexpected = [f for f in failed if f[1] != "host" or not f[0].startswith(tuple(may_miss))]
    assert not unexpected, f"untrusted for more than {list(may_miss)}: {unexpected}"
    return False
