"""The pytest plugin for real: scenario files collected and run as tests, verdicts, baselines,
reports. Each test runs pytest in a subprocess on scenario files in a temporary folder."""

import json
import textwrap
import xml.etree.ElementTree as ET

import pytest

pytestmark = [pytest.mark.netns, pytest.mark.ddp, pytest.mark.usefixtures("needs_fabric")]


def scenario_toml(name="tiny", rate="500mbit", modes=("fp32", "amp-fp16"), expect="",
                  probe=True, attempts=3):
    """A small scenario; `probe=False` skips the fidelity probe (a launch of its own) where a
    test judges something else."""
    return textwrap.dedent(f"""
        name = "{name}"
        [topology]
        nodes = 2
        [link]
        rate = "{rate}"
        [workload]
        params = "1M"
        batch_size = 8
        iterations = 6
        warmup = 1
        modes = {json.dumps(list(modes))}
        [fidelity]
        enabled = {json.dumps(probe)}
        attempts = {attempts}
    """) + textwrap.dedent(expect)


def write(pytester, name, text):
    folder = pytester.path / "scenarios"
    folder.mkdir(exist_ok=True)
    (folder / f"{name}.toml").write_text(text)


def test_scenario_files_are_tests_with_verdicts_and_reports(pytester):
    # Three files in one session (a pytest start-up each would cost seconds): one that passes,
    # one whose claim is false, and a sweep this host cannot drive.
    write(pytester, "tiny", scenario_toml())
    claim = """
        [[expect]]
        metric = "comm_s.median"
        mode = "amp"
        vs = "fp32"
        max_ratio = 0.8
    """
    write(pytester, "false-claim", scenario_toml("false-claim", modes=("fp32", "amp"),
                                                 expect=claim, probe=False))
    # The 2-node point is untrusted (its probe refused): gloo tops out near 5 Gbit/s here,
    # and 30 Gbit/s (near the largest rate tbf takes) is beyond any host's; the 1-node point
    # has no network to probe and runs.
    write(pytester, "too-fast", scenario_toml("too-fast", rate="30gbit", modes=("fp32",),
                                              attempts=1) + textwrap.dedent("""
        [sweep]
        nodes = [1, 2]
    """))
    # --netsim-out: the false claim's failed run keeps its folder, here rather than in /tmp.
    result = pytester.runpytest_subprocess("scenarios", "-rs", "--junitxml=junit.xml",
                                           "--netsim-json=results.json", "-m", "netsim",
                                           "--netsim-out=runs")
    document = json.loads((pytester.path / "results.json").read_text())
    assert document["sweeps"][0]["status"] == "untrusted"
    result.assert_outcomes(passed=1, failed=1, skipped=1)
    # the passing file: its table and verdict, in the JSON and the JUnit properties
    result.stdout.fnmatch_lines(["*netsim-ddp scenarios*",
                                 "*tiny: PASSED, all-reduce probe *% of the link*",
                                 "*amp-fp16*iteration*comm*wire*MB/it*"])
    scenarios = {entry["name"]: entry for entry in document["scenarios"]}
    assert scenarios["tiny"]["passed"] is True
    properties = {p.get("name"): p.get("value")
                  for case in ET.parse(pytester.path / "junit.xml").iter("testcase")
                  if case.get("name") == "tiny" for p in case.iter("property")}
    assert properties["netsim.status"] == "passed"
    assert float(properties["netsim.amp-fp16.wire_bytes_per_iteration"]) > 0
    # the false claim fails, saying which check and why
    assert scenarios["false-claim"]["passed"] is False
    result.stdout.fnmatch_lines(["*FAILED expect:comm_s.median:amp/fp32*needs <= 0.8 x*"])
    # the sweep the host cannot drive is skipped, with the reason
    result.stdout.fnmatch_lines(["*too-fast: sweep UNTRUSTED, 2 points*",
                                 "*too-fast: untrusted on this host: point 2 nodes: an all-*"])


def test_a_baseline_taken_at_twice_the_bandwidth_fails_the_gate(pytester):
    # fp32 alone, no probe: the gate compares each mode with its own baseline
    write(pytester, "gated", scenario_toml("gated", rate="1gbit", modes=("fp32",), probe=False))
    saved = pytester.runpytest_subprocess("scenarios", "--netsim-save-baseline=base.json")
    saved.assert_outcomes(passed=1)
    assert json.loads((pytester.path / "base.json").read_text())["benchmarks"]
    write(pytester, "gated", scenario_toml("gated", rate="500mbit", modes=("fp32",),
                                           probe=False))
    gated = pytester.runpytest_subprocess("scenarios", "--netsim-baseline=base.json",
                                          "--netsim-tolerance=median:10%")
    gated.assert_outcomes(failed=1)
    gated.stdout.fnmatch_lines(["*FAILED baseline:fp32:iteration_s.median*REGRESSION*baseline*"
                                "current*threshold*Mann-Whitney p*"])


def test_bad_input_is_a_clear_error(pytester):
    write(pytester, "broken", scenario_toml("broken").replace('rate = "500mbit"',
                                                              'rate = "fast"'))
    result = pytester.runpytest_subprocess("scenarios")
    result.stdout.fnmatch_lines(["*broken.toml: link.rate: cannot read 'fast' as a rate*"])
    assert result.ret != 0
    missing = pytester.runpytest_subprocess("scenarios", "--netsim-baseline=nope.json")
    missing.stderr.fnmatch_lines(["*nope.json: no such baseline file*"])
    assert missing.ret == pytest.ExitCode.USAGE_ERROR


def test_fixtures_give_a_test_its_scenario_and_network(pytester):
    pytester.makepyfile(test_mine="""
        import pytest

        @pytest.mark.netsim_scenario({"name": "mine", "topology": {"nodes": 2},
                                      "link": {"rate": "100mbit"}})
        def test_nodes_talk(fabric, scenario):
            assert scenario.name == "mine"
            a, b = fabric.nodes
            with b.socket() as server:
                server.bind((b.address, 0))
                server.listen()
                with a.socket() as client:
                    client.connect(server.getsockname())
            assert fabric.counters()[a.name].sent_bytes > 0
    """)
    pytester.runpytest_subprocess("test_mine.py").assert_outcomes(passed=1)
