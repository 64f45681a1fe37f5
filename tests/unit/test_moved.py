"""0.1's flat import paths still work for one release, warn, and give the moved module itself."""

from __future__ import annotations

import importlib
import subprocess
import sys

import pytest

from netsim_ddp._moved import MOVED


@pytest.mark.parametrize("old", sorted(MOVED))
def test_an_old_path_is_the_new_module_and_warns(old):
    # A fresh interpreter: in this one the old name may be imported (and warned about) already.
    code = ("import warnings, importlib, sys\n"
            "with warnings.catch_warnings(record=True) as caught:\n"
            "    warnings.simplefilter('always')\n"
            f"    old = importlib.import_module({old!r})\n"
            f"new = importlib.import_module({MOVED[old]!r})\n"
            "assert old is new, (old, new)\n"
            "print([str(w.message) for w in caught if w.category is DeprecationWarning])\n")
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True)
    assert out.returncode == 0, out.stderr
    assert f"{old} has moved to {MOVED[old]}" in out.stdout


def test_every_new_path_exists():
    for new in MOVED.values():
        importlib.import_module(new)


def test_the_readme_api_is_at_the_top():
    import netsim_ddp
    from netsim_ddp.measure.document import load_document
    from netsim_ddp.run.runner import run_scenario

    assert netsim_ddp.run_scenario is run_scenario
    assert netsim_ddp.load_document is load_document
    assert netsim_ddp.Fabric.__module__.startswith("netsim_ddp.fabric")


def test_the_old_scenario_module_names_warn_and_resolve():
    import netsim_ddp.scenario
    from netsim_ddp.scenario.spec import queue_limit_bytes

    with pytest.warns(DeprecationWarning, match="scenario.spec.queue_limit_bytes"):
        assert netsim_ddp.scenario.queue_limit_bytes is queue_limit_bytes
    with pytest.raises(AttributeError):
        netsim_ddp.scenario.no_such_name  # noqa: B018
