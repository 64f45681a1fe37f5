"""Property-based: whatever a loader is fed, it returns a valid object or raises the project's
own error type, never anything else (a traceback from OverflowError, RecursionError, KeyError,
AttributeError is what these found before).

Deterministic and bounded so that CI runs them in seconds: derandomized, no example database,
50 examples per property. HYPOTHESIS_PROFILE=thorough draws 2000 random ones (minutes).
"""

import json
import math
import os
import tomllib
from pathlib import Path

import pytest
from hypothesis import HealthCheck, example, given, settings
from hypothesis import strategies as st

from netsim_ddp import Scenario, ScenarioError
from netsim_ddp.measure.document import load_document
from netsim_ddp.measure.record import DocumentError
from netsim_ddp.scenario import units
from netsim_ddp.scenario.limits import HostResources, check_host
from netsim_ddp.verdicts.baseline import Baseline, BaselineError

ROOT = Path(__file__).resolve().parents[2]
SHIPPED = sorted((ROOT / "scenarios").glob("*.toml"))

_QUIET = [HealthCheck.too_slow, HealthCheck.filter_too_much, HealthCheck.function_scoped_fixture]
settings.register_profile("ci", max_examples=50, deadline=None, derandomize=True, database=None,
                          suppress_health_check=_QUIET)
settings.register_profile("thorough", max_examples=2000, deadline=None, database=None,
                          suppress_health_check=_QUIET)
FUZZ = settings.get_profile(os.environ.get("HYPOTHESIS_PROFILE", "ci"))

# Scalars as TOML and JSON can hold them, with the edges that broke parsers before.
numbers = st.one_of(
    st.integers(min_value=-(2**70), max_value=2**70), st.floats(allow_nan=True),
    st.sampled_from([0, 1, -1, 2**31, 2**63, 10**400, 1e308, math.inf, -math.inf, math.nan]),
)
unit_strings = st.builds(
    lambda sign, num, space, unit: f"{sign}{num}{space}{unit}",
    st.sampled_from(["", "-", "+"]),
    st.one_of(st.sampled_from(["0", "1", "0.5", "1e999", "1e-999", "1e308", ".5", "5.",
                               "9" * 400, "1e30", "nan", "inf"]),
              st.floats(allow_nan=False, allow_infinity=False).map(repr)),
    st.sampled_from(["", " "]),
    st.sampled_from(["", "bit", "gbit", "Gbit/s", "mbps", "B", "b", "GB/s", "s", "ms", "us",
                     "µs", "ns", "min", "%", "k", "M", "B", "KiB", "MiB", "TiB", "bytes", "x"]),
)
scalars = st.one_of(st.none(), st.booleans(), numbers, unit_strings, st.text(max_size=12))
json_values = st.recursive(
    scalars, lambda inner: st.one_of(st.lists(inner, max_size=4),
                                     st.dictionaries(st.text(max_size=8), inner, max_size=4)),
    max_leaves=20)


@FUZZ
@given(value=st.one_of(scalars, st.lists(scalars, max_size=2)))
@example(value="-1gbit")  # a sign in every parser's text, whatever the draw holds
@example(value="-5ms")
@example(value="-0.5%")
@example(value="-1MiB")
@example(value=-1)
def test_unit_parsers_return_finite_numbers_or_value_error(value):
    for parse in (units.parse_rate, units.parse_duration, units.parse_size, units.parse_count,
                  units.parse_percent):
        try:
            result = parse(value)
        except ValueError:
            continue
        assert not isinstance(result, bool)
        assert math.isfinite(result) and result >= 0, (parse.__name__, value, result)
        if parse in (units.parse_size, units.parse_count):
            assert isinstance(result, int) and 0 <= result <= units.MAX_INTEGER


def _shipped_data() -> list[dict]:
    return [tomllib.loads(path.read_text()) | {"name": path.stem} for path in SHIPPED]


def _paths(data, prefix=()):
    """Every (path, value) in a nested document, so a mutation can land anywhere."""
    yield prefix, data
    if isinstance(data, dict):
        for key, value in data.items():
            yield from _paths(value, (*prefix, key))
    elif isinstance(data, list):
        for index, value in enumerate(data):
            yield from _paths(value, (*prefix, index))


def _mutate(data, path, value, delete):
    if not path:
        return value
    head, *rest = path
    copy = dict(data) if isinstance(data, dict) else list(data)
    if delete and not rest:
        del copy[head]
    else:
        copy[head] = _mutate(copy[head], rest, value, delete)
    return copy


def _valid_or_own_error(data):
    try:
        scenario = Scenario.from_dict(data, "fuzz.toml")
    except ScenarioError as exc:
        assert str(exc).startswith("fuzz.toml: ")
        return None
    # What a valid scenario promises everything downstream.
    assert Scenario.from_dict(json.loads(json.dumps(scenario.model_dump(mode="json"))))
    for index in range(scenario.topology.nodes):
        link = scenario.link_for(index)
        assert math.isfinite(link.rate) and link.rate >= 8000
        assert 0 <= link.delay <= 10 and 0 < link.queue_limit_bytes < 2**32
    try:
        check_host(scenario, HostResources(2**34, 10_000, 10_000))
    except ScenarioError:
        pass
    return scenario


@FUZZ
@given(base=st.sampled_from(_shipped_data()), data=st.data(), value=json_values,
       delete=st.booleans())
def test_mutated_scenarios_load_or_raise_scenario_error(base, data, value, delete):
    paths = list(_paths(base))
    path, _ = data.draw(st.sampled_from(paths))
    _valid_or_own_error(_mutate(base, path, value, delete and bool(path)))


@FUZZ
@given(document=st.dictionaries(
    st.sampled_from(["name", "topology", "link", "workload", "sweep", "background", "expect",
                     "fidelity", "description"]), json_values, max_size=6))
def test_generated_scenarios_load_or_raise_scenario_error(document):
    _valid_or_own_error(document)


# A file's bytes: text (st.text never draws a lone surrogate, so its UTF-8 is always valid)
# and raw bytes, alone or after a cut of a shipped file, so files that are not UTF-8 are fed too.
file_tails = st.one_of(st.text(max_size=20).map(str.encode), st.binary(max_size=20))


@FUZZ
@given(content=st.one_of(st.text(max_size=200).map(str.encode), st.binary(max_size=200),
                         st.builds(lambda base, cut, extra: base[:cut] + extra,
                                   st.sampled_from([path.read_bytes() for path in SHIPPED]),
                                   st.integers(min_value=0, max_value=2000), file_tails)))
@example(content=b"\xff")
@example(content=b'name = "caf\xc3"\n[topology]\nnodes = 2\n')  # a character cut short
@example(content=(ROOT / "scenarios" / "default.toml").read_bytes() + b"\n# \xed\xb3\xbf\n")
def test_scenario_files_load_or_raise_scenario_error(tmp_path, content):
    path = tmp_path / "fuzz.toml"
    path.write_bytes(content)
    try:
        content.decode("utf-8")
    except UnicodeDecodeError:  # not UTF-8 (a lone surrogate's bytes neither): refused as such
        with pytest.raises(ScenarioError) as info:
            Scenario.load(path)
        assert info.value.field == "(file)"
        return
    try:
        Scenario.load(path)
    except ScenarioError:
        pass


def _baseline_document():
    samples = [0.1, 0.11, 0.12]
    return {"netsim_ddp": {"format": 1, "version": "x"}, "benchmarks": [{"extra_info": {
        "netsim_ddp": {"scenario": "s", "mode": "fp32", "digest": "d", "iteration_s": samples,
                       "comm_s": samples, "compute_s": samples,
                       "wire_bytes_per_iteration": 1e6}}}]}


@FUZZ
@given(data=st.data(), value=json_values, delete=st.booleans())
def test_mutated_baselines_load_or_raise_baseline_error(tmp_path, data, value, delete):
    base = _baseline_document()
    path_in_doc, _ = data.draw(st.sampled_from(list(_paths(base))))
    document = _mutate(base, path_in_doc, value, delete and bool(path_in_doc))
    path = tmp_path / "baseline.json"
    path.write_text(json.dumps(document))
    try:
        baseline = Baseline(path)
    except BaselineError:
        return
    for entry in baseline.entries.values():
        assert all(math.isfinite(v) for series in entry.samples.values() for v in series)


def _results_document():
    summary = {"median": 0.1, "p95": 0.12, "std": 0.01}
    mode = {"iteration_s": [0.1, 0.12], "comm_s": [0.05, 0.06], "compute_s": [0.05, 0.05],
            "summary": {"iteration_s": summary, "comm_s": summary, "compute_s": summary},
            "scaling_efficiency": 0.5, "wire_bytes_per_iteration": 1e6}
    return {"netsim_ddp": "x", "scenarios": [{"name": "s", "status": "passed",
                                              "modes": {"fp32": mode}}], "sweeps": []}


@FUZZ
@given(data=st.data(), value=json_values, delete=st.booleans())
def test_mutated_results_load_or_raise_results_error(tmp_path, data, value, delete):
    base = _results_document()
    path_in_doc, _ = data.draw(st.sampled_from(list(_paths(base))))
    path = tmp_path / "results.json"
    path.write_text(json.dumps(_mutate(base, path_in_doc, value, delete and bool(path_in_doc))))
    try:
        load_document(path)
    except DocumentError:
        pass


@pytest.mark.parametrize("text", ["[" * 5000 + "]" * 5000, "{", "", "null", "\udcff"])
def test_unreadable_json_files_are_the_loaders_own_errors(tmp_path, text):
    path = tmp_path / "file.json"
    path.write_text(text, errors="surrogateescape")
    with pytest.raises(BaselineError):
        Baseline(path)
    with pytest.raises(DocumentError):
        load_document(path)
