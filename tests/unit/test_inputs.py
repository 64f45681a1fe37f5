"""Bad input never crashes the harness: one line naming file, field and reason, exit 2, before
anything is built. One test per defect found in review (issue 9, items 8-10)."""

import json
import math
import time
import tomllib

import pytest
from click.testing import CliRunner

from netsim_ddp import Scenario, ScenarioError
from netsim_ddp.cli import main
from netsim_ddp.scenario import units
from netsim_ddp.verdicts.baseline import Baseline, BaselineError

BASE = '[topology]\nnodes = 2\n[link]\nrate = "1gbit"\n'
TRAIN = '[workload]\nparams = "1M"\n'

# (file text, field the error must name): each passed validation or crashed before.
BAD_SCENARIOS = {
    "queue_limit-1e999": (BASE + 'queue_limit = "1e999"\n', "link.queue_limit"),
    "queue_limit-true": (BASE + "queue_limit = true\n", "link.queue_limit"),
    "params-1e999": (BASE + '[workload]\nparams = "1e999"\n', "workload.params"),
    "deep-array": ('name = "x"\nx = ' + "[" * 5000 + "]" * 5000 + "\n", "(toml)"),
    "delay-1e999s": (BASE + 'delay = "1e999s"\n', "link.delay"),
    "rate-0.5bit": (BASE.replace('"1gbit"', '"0.5bit"'), "link.rate"),
    "node-named-br": (BASE.replace("nodes = 2", 'nodes = 2\nnames = ["br", "b"]'),
                      "topology.names"),
    "sweep-300-nodes": (BASE + TRAIN + "[sweep]\nnodes = [2, 300]\n", "sweep.points"),
    "name-escapes-out": ('name = "../../x"\n' + BASE, "name"),
    "nodes-true": (BASE.replace("nodes = 2", "nodes = true"), "topology.nodes"),
    "mtu-float": (BASE + "mtu = 1500.0\n", "link.mtu"),
    "batch-true": (BASE + TRAIN + "batch_size = true\n", "workload.batch_size"),
    "expect-nan": (BASE + TRAIN + '[[expect]]\nmetric = "comm_s.median"\nmode = "fp32"\n'
                   "max = nan\n", "expect.0.max"),
}


@pytest.mark.parametrize("case", list(BAD_SCENARIOS))
def test_bad_scenario_is_one_line_naming_file_and_field_exit_2(tmp_path, case):
    text, field = BAD_SCENARIOS[case]
    path = tmp_path / "bad.toml"
    path.write_text(text)
    result = CliRunner().invoke(main, ["validate", str(path)])
    assert result.exit_code == 2, result.output
    assert not isinstance(result.exception, SystemExit) or result.exception.code == 2
    lines = result.output.strip().splitlines()
    assert len(lines) == 1, result.output
    assert lines[0].startswith(f"error: {path}: {field}: "), lines[0]


def test_every_sweep_point_is_validated_and_named():
    text = BASE + TRAIN + "[sweep]\nnodes = [2, 300]\n"
    with pytest.raises(ScenarioError) as info:
        Scenario.from_dict(tomllib.loads(text) | {"name": "s"}, "s.toml")
    assert info.value.field == "sweep.points"
    assert "300 nodes" in info.value.reason and "do not fit" in info.value.reason


def test_too_many_sweep_points_refused():
    data = {"name": "s", "topology": {"nodes": 2}, "link": {"rate": "1gbit"},
            "workload": {"params": "1M"},
            "sweep": {"rate": [f"{r}mbit" for r in range(100, 111)],
                      "params": [f"{p}M" for p in range(1, 11)]}}
    with pytest.raises(ScenarioError, match="110 points; at most 100"):
        Scenario.from_dict(data, "s.toml")


@pytest.mark.parametrize("name", ["../../x", "..", ".hidden", "a/b", "a\\b", "x\n", "-rf", " x"])
def test_names_that_would_leave_out_are_refused(name):
    with pytest.raises(ScenarioError) as info:
        Scenario.from_dict({"name": name, "topology": {"nodes": 2}, "link": {"rate": "1gbit"}})
    assert info.value.field == "name"


def test_sweep_point_names_are_safe_folder_names():
    scenario = Scenario.load("scenarios/sweep.toml")
    assert scenario.sweep is not None
    for values in scenario.sweep.points():
        point = scenario.at_sweep_point(values)
        assert "/" not in point.name and not point.name.startswith(".")


def test_reserved_node_names_match_what_the_fabric_names_its_objects():
    from netsim_ddp.fabric import naming
    from netsim_ddp.scenario.spec import RESERVED_NODE_NAMES

    assert naming.switch_port("br") == naming.BRIDGE
    assert naming.SWITCH_ROLE in RESERVED_NODE_NAMES
    assert naming.BRIDGE.removeprefix("nsd-") in RESERVED_NODE_NAMES


@pytest.mark.parametrize("parse, text", [
    (units.parse_rate, "1e999bit"), (units.parse_duration, "1e999s"),
    (units.parse_size, "1e999"), (units.parse_size, "1e30TiB"), (units.parse_count, "1e999"),
    (units.parse_count, "1e300B"), (units.parse_percent, "1e999%"),
    (units.parse_size, 10**400), (units.parse_count, 2**70), (units.parse_duration, math.inf),
    (units.parse_size, True), (units.parse_count, False), (units.parse_size, -1500),
    (units.parse_percent, math.nan),
])
def test_units_are_finite_and_in_range(parse, text):
    with pytest.raises(ValueError):
        parse(text)


def test_baseline_without_extra_info_is_a_baseline_error(tmp_path):
    path = tmp_path / "b.json"
    path.write_text(json.dumps({"netsim_ddp": {"format": 1}, "benchmarks": [{"name": "x"}]}))
    with pytest.raises(BaselineError, match=r"benchmarks\.0\.extra_info"):
        Baseline(path)


@pytest.mark.parametrize("document", [
    {"netsim_ddp": {"format": 1}, "benchmarks": "no"},
    {"netsim_ddp": {"format": 1}, "benchmarks": [{"extra_info": {"netsim_ddp": {
        "scenario": "s", "mode": "fp32", "digest": "d", "iteration_s": [0.1, 0.2],
        "comm_s": [0.1], "compute_s": [0.1, 0.1], "wire_bytes_per_iteration": 1.0}}}]},
    {"netsim_ddp": {"format": 1}, "benchmarks": [{"extra_info": {"netsim_ddp": {
        "scenario": "s", "mode": "fp32", "digest": "d", "iteration_s": [0.0],
        "comm_s": [0.0], "compute_s": [0.1], "wire_bytes_per_iteration": 1.0}}}]},
])
def test_malformed_baselines_are_baseline_errors(tmp_path, document):
    path = tmp_path / "b.json"
    path.write_text(json.dumps(document))
    with pytest.raises(BaselineError):
        Baseline(path)


def test_report_of_a_malformed_results_file_is_one_line_exit_2(tmp_path):
    path = tmp_path / "results.json"
    path.write_text(json.dumps({"scenarios": [{"name": "x", "status": "passed",
                                               "modes": {"fp32": "fast"}}]}))
    result = CliRunner().invoke(main, ["report", str(path), "--out", str(tmp_path / "r")])
    assert result.exit_code == 2, result.output
    lines = result.output.strip().splitlines()
    assert len(lines) == 1 and "scenarios.0.modes.fp32" in lines[0], result.output
    from netsim_ddp.measure.document import load_document
    from netsim_ddp.measure.record import DocumentError

    with pytest.raises(DocumentError):
        load_document(path)


@pytest.mark.parametrize("value", ["nan", "inf", "-1", "0"])
def test_timeout_must_be_a_finite_positive_number(tmp_path, value):
    # A file that does not exist: without the check, nothing could start training.
    result = CliRunner().invoke(main, ["run", "--timeout", value, str(tmp_path / "none.toml")])
    assert result.exit_code == 2
    assert "--timeout" in result.output


def small_host():
    from netsim_ddp.scenario.limits import HostResources

    return HostResources(memory_bytes=4 * 2**30, max_processes=1000, max_net_namespaces=500)


@pytest.mark.parametrize("changes, field, asked", [
    ({"workload": {"params": "2B"}}, "workload.params", "2,000,000,000-parameter"),
    ({"topology": {"nodes": 8, "ranks_per_node": 4}}, "topology.ranks_per_node", "8 nodes x 4"),
    ({"topology": {"nodes": 250, "subnet": "10.9.0.0/16"}}, "topology.nodes", "250 nodes"),
    ({"link": {"rate": "1gbit", "queue_limit": "1GiB"}}, "link.queue_limit", "2 links"),
])
def test_more_than_the_host_holds_is_refused_with_both_numbers(changes, field, asked):
    data = {"name": "big", "topology": {"nodes": 2}, "link": {"rate": "1gbit"},
            "workload": {"params": "1M"}}
    for key, value in changes.items():
        data[key] = data[key] | value
    scenario = Scenario.from_dict(data, "big.toml")
    from netsim_ddp.scenario.limits import check_host

    with pytest.raises(ScenarioError) as info:
        check_host(scenario, small_host())
    assert info.value.field == field
    assert asked in info.value.reason and "this host" in info.value.reason


def test_host_limits_check_every_sweep_point():
    data = {"name": "s", "topology": {"nodes": 2}, "link": {"rate": "1gbit"},
            "workload": {"params": "1M"}, "sweep": {"params": ["1M", "500M"]}}
    from netsim_ddp.scenario.limits import check_host

    with pytest.raises(ScenarioError) as info:
        check_host(Scenario.from_dict(data, "s.toml"), small_host())
    assert info.value.field == "sweep.points"
    assert "500M" in info.value.reason and "workload.params" in info.value.reason


def test_validation_is_linear_in_nodes():
    """It was cubic with per-node overrides: 1000 nodes took 3.9 s, 2000 nodes 45 s. A limit on
    one size's time cannot tell linear from quadratic (1000 nodes take 1.5 ms here), so two sizes
    10 x apart are timed, best of 5 each: linear costs 10 x the time, quadratic 100 x; the bound
    sits between them (their geometric mean), far enough from both that a loaded host's noise
    cannot cross it (a 4 x step with a 2 x bound failed under load)."""
    def data(n):
        return {"name": "big", "topology": {"nodes": n, "names": [f"h{i}" for i in range(n)],
                                            "subnet": "10.0.0.0/16"},
                "link": {"rate": "1gbit", "delay": "1ms",
                         "override": [{"node": f"h{i}", "rate": "100mbit"}
                                      for i in range(0, n, 10)]}}

    def best_of_5(n):
        best = math.inf
        for _ in range(5):
            given = data(n)
            started = time.perf_counter()
            scenario = Scenario.from_dict(given)
            links = [scenario.link_for(i) for i in range(n)]  # as planning the fabric asks
            best = min(best, time.perf_counter() - started)
        assert links[10].rate == 100e6 and links[11].rate == 1e9
        return best

    small, large = 100, 1000  # a bridge holds at most 1023 nodes
    ratio = best_of_5(large) / best_of_5(small)
    # Linear: 10 x (less here: a fixed cost shared); quadratic: 100 x.
    bound = math.sqrt(large / small * (large / small) ** 2)
    assert ratio < bound, f"{large} nodes took {ratio:.1f} x the time of {small} (< {bound:.0f})"


def test_links_follow_a_copy_that_replaces_the_link():
    scenario = Scenario.from_dict({"name": "x", "topology": {"nodes": 2},
                                   "link": {"rate": "1gbit"}})
    assert scenario.link_for(0).rate == 1e9
    slower = scenario.model_copy(update={"link": scenario.link.model_copy(update={"rate": 5e8})})
    assert slower.link_for(0).rate == 5e8 and scenario.link_for(0).rate == 1e9


def test_the_run_folder_never_leaves_out_even_for_an_unvalidated_name(tmp_path):
    from netsim_ddp.run.session import scenario_folder

    good = Scenario.from_dict({"name": "ok [2 nodes]", "topology": {"nodes": 2},
                               "link": {"rate": "1gbit"}})
    assert scenario_folder(tmp_path, good) == tmp_path / "ok [2 nodes]"
    sneaky = good.model_construct(**(dict(good) | {"name": "../x"}))  # skips validation
    with pytest.raises(ValueError, match="inside"):
        scenario_folder(tmp_path, sneaky)
