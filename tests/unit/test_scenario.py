import json
import subprocess
import sys
from pathlib import Path

import pytest

from netsim_ddp import Scenario, ScenarioError
from netsim_ddp.scenario.spec import MAX_RATE_BPS

ROOT = Path(__file__).resolve().parents[2]
SHIPPED = sorted((ROOT / "scenarios").glob("*.toml"))

GOOD = """
name = "t"
[topology]
nodes = 3
[link]
rate = "1gbit"
"""


def write(tmp_path, text, name="s.toml"):
    path = tmp_path / name
    path.write_text(text)
    return path


@pytest.mark.parametrize("path", SHIPPED, ids=lambda p: p.name)
def test_shipped_scenarios_load(path):
    scenario = Scenario.load(path)
    assert scenario.path == path
    assert all(scenario.link_for(i).rate > 0 for i in range(scenario.topology.nodes))


def test_defaults_and_names(tmp_path):
    scenario = Scenario.load(write(tmp_path, GOOD))
    assert scenario.topology.node_names == ["n0", "n1", "n2"]
    link = scenario.link_for(1)
    assert (link.rate, link.delay, link.loss, link.mtu) == (1e9, 0.0, 0.0, 1500)
    assert link.queue_limit_bytes == 1000 * 1514
    assert not link.impaired


def test_name_defaults_to_file_stem(tmp_path):
    scenario = Scenario.load(write(tmp_path, GOOD.replace('name = "t"', ""), "my-net.toml"))
    assert scenario.name == "my-net"


def test_override_changes_one_node(tmp_path):
    text = GOOD + '[[link.override]]\nnode = "n2"\nrate = "250mbit"\ndelay = "1ms"\n' \
                  'queue_limit = "256KiB"\n'
    scenario = Scenario.load(write(tmp_path, text))
    assert scenario.link_for(0).rate == 1e9
    slow = scenario.link_for("n2")
    assert (slow.rate, slow.delay, slow.queue_limit_bytes) == (250e6, 1e-3, 256 * 1024)
    assert slow.impaired


BAD = [
    # (replacement text, field named, words in the reason)
    (GOOD + "colour = 'blue'\n", "link.colour", "unknown key"),
    (GOOD.replace("[topology]", "[topology]\nspeed = 1"), "topology.speed", "unknown key"),
    (GOOD.replace('"1gbit"', '"0gbit"'), "link.rate", "outside what tbf can shape"),
    (GOOD.replace('"1gbit"', '"-5mbit"'), "link.rate", "cannot read"),
    (GOOD.replace('"1gbit"', '"40gbit"'), "link.rate", "outside what tbf can shape"),
    (GOOD.replace('"1gbit"', '"100mbps"'), "link.rate", "ambiguous"),
    (GOOD + 'loss = "150%"\n', "link.loss", "less than or equal to 100"),
    (GOOD + 'jitter = "1ms"\n', "link.jitter", "without a delay"),
    (GOOD.replace("nodes = 3", "nodes = 300"), "topology", "do not fit"),
    (GOOD.replace("nodes = 3", 'nodes = 2\nnames = ["a", "much-too-long-name"]'),
     "topology.names", "at most 11"),
    (GOOD.replace("nodes = 3", 'nodes = 2\nnames = ["a", "a"]'), "topology.names", "unique"),
    (GOOD + '[[link.override]]\nnode = "n9"\nrate = "1mbit"\n', "link.override.0.node",
     "no node named"),
    (GOOD + '[[link.override]]\nnode = 0\nmtu = 9000\n', "link.override.0.mtu", "unknown key"),
    (GOOD + 'queue_limit = 0\n', "link.queue_limit", "positive"),
    (GOOD.replace('[link]\nrate = "1gbit"\n', ""), "link", "required"),
    (GOOD + "mtu = 20\n", "link.mtu", "greater than or equal to 68"),
]


@pytest.mark.parametrize("text, field, reason", BAD, ids=[b[1] + ":" + b[2] for b in BAD])
def test_bad_scenarios_name_file_field_reason(tmp_path, text, field, reason):
    path = write(tmp_path, text)
    with pytest.raises(ScenarioError) as info:
        Scenario.load(path)
    error = info.value
    assert isinstance(error, ValueError)
    assert error.path == str(path)
    assert error.field == field
    assert reason in error.reason
    assert str(error).startswith(f"{path}: {field}: ")


def test_missing_file_and_bad_toml(tmp_path):
    with pytest.raises(ScenarioError, match="no such file"):
        Scenario.load(tmp_path / "nope.toml")
    with pytest.raises(ScenarioError, match=r"\(toml\): not valid TOML"):
        Scenario.load(write(tmp_path, "name = \n"))


def test_rate_cap_matches_tbf_field():
    # tbf's rate is 32-bit bytes/s; above it the kernel would silently wrap.
    assert MAX_RATE_BPS == 34_359_738_360


def run_cli(*args):
    return subprocess.run([sys.executable, "-m", "netsim_ddp.cli", *args],
                          capture_output=True, text=True, timeout=120)


def test_cli_validate_bad_file_is_one_line_exit_2(tmp_path):
    path = write(tmp_path, GOOD + 'loss = "101%"\n')
    result = run_cli("validate", str(path))
    assert result.returncode == 2
    assert "Traceback" not in result.stderr
    lines = [line for line in result.stderr.splitlines() if line.strip()]
    assert len(lines) == 1 and f"{path}: link.loss:" in lines[0]


def test_cli_validate_good_files():
    result = run_cli("validate", *map(str, SHIPPED))
    assert result.returncode == 0, result.stderr
    assert result.stdout.count("ok:") == len(SHIPPED)


def test_cli_schema_is_json_schema_of_the_model():
    result = run_cli("schema")
    assert result.returncode == 0
    schema = json.loads(result.stdout)
    assert schema["additionalProperties"] is False
    link = schema["$defs"]["LinkConfig"]["properties"]
    assert "examples" in link["rate"] and "string" in link["rate"]["type"]


def test_background_schedule_is_seeded_and_validated(tmp_path):
    import itertools

    from netsim_ddp.fabric.background import on_periods

    text = GOOD + '[[background]]\nsource = "n0"\ndestination = 2\non = "200ms"\noff = "100ms"\n'
    flow = Scenario.load(write(tmp_path, text)).background[0]
    first = list(itertools.islice(on_periods(flow), 20))
    assert first == list(itertools.islice(on_periods(flow), 20))  # same for every mode
    assert all(0 <= begin < end for begin, end in first)
    assert all(a[1] <= b[0] for a, b in itertools.pairwise(first))  # off-periods in between
    other = flow.model_copy(update={"seed": 1})
    assert list(itertools.islice(on_periods(other), 20)) != first
    with pytest.raises(ScenarioError, match="background.0.destination"):
        Scenario.load(write(tmp_path, text.replace("destination = 2", 'destination = "n0"')))


def test_scenario_round_trips_through_json(tmp_path):
    text = GOOD + 'delay = "100us"\nloss = "0.5%"\n[[background]]\nsource = 0\ndestination = 1\n'
    scenario = Scenario.load(write(tmp_path, text))
    again = Scenario.model_validate_json(scenario.model_dump_json())
    assert again.model_dump() == scenario.model_dump()
