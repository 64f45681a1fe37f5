"""Verdicts on noisy samples: they must fail when they should and pass when they should."""

import json
import random
import subprocess
import sys
from pathlib import Path

import pytest

from netsim_ddp import Scenario, ScenarioError
from netsim_ddp.measure.mode_report import ModeReport
from netsim_ddp.scenario.expectations import Expectation
from netsim_ddp.verdicts.baseline import Baseline, BaselineError, save
from netsim_ddp.verdicts.gate import (
    Metric,
    Tolerance,
    default_expectations,
    evaluate,
    regression_verdict,
)
from netsim_ddp.verdicts.scenario_report import ScenarioReport
from netsim_ddp.workload.contract.mode_result import ModeResult

SCENARIO = {"name": "gate", "topology": {"nodes": 2}, "link": {"rate": "1gbit"},
            "workload": {"params": "1M", "modes": ["fp32", "amp", "amp-fp16"]}}


def mode(name, compute=0.1, comm=0.5, noise=0.05, n=20, seed=0, wire=8e6, spread=1.0,
         backend="gloo"):
    draw = random.Random(seed)
    compute_s = [compute + draw.gauss(0, 0.005) for _ in range(n)]
    comm_s = [max(comm + draw.gauss(0, noise * spread), 0.0) for _ in range(n)]
    iteration_s = [c + m for c, m in zip(compute_s, comm_s, strict=True)]
    result = ModeResult.model_construct(
        mode=name, iteration_s=iteration_s, compute_s=compute_s, comm_s=comm_s,
        sent_bytes_per_iteration=int(wire / 2), world_size=2, iterations=n, params=1_000_000,
        ranks=[], profiler_allreduce_s=None, backend=backend)
    return ModeReport(result, wire, 0.0, 1e9)


def test_metric_grammar():
    assert Metric.parse("comm_s") == Metric("comm_s", "median")
    assert Metric.parse("comm_s.std").is_spread
    assert Metric.parse("wire_bytes_per_iteration").stat is None
    for bad in ("comm.median", "comm_s.p98", "wire_bytes_per_iteration.median"):
        with pytest.raises(ValueError, match="unknown"):
            Metric.parse(bad)


def test_compressing_mode_passes_and_plain_amp_fails_the_comm_claim():
    modes = {"fp32": mode("fp32", seed=1), "amp": mode("amp", seed=2),
             "amp-fp16": mode("amp-fp16", comm=0.27, seed=3, spread=0.3, wire=4e6)}
    claims = default_expectations(list(modes))
    assert [c.name for c in claims] == ["expect:comm_s.median:amp-fp16/fp32"]
    spread = Expectation(metric="comm_s.std", mode="amp-fp16", vs="fp32", max_ratio=1.0)
    assert all(evaluate(claim, modes).passed for claim in [*claims, spread])
    amp = Expectation(metric="comm_s.median", mode="amp", vs="fp32", max_ratio=0.8)
    verdict = evaluate(amp, modes)
    assert not verdict.passed
    assert "needs <= 0.8 x" in verdict.detail and "Mann-Whitney p" in verdict.detail


def test_a_difference_within_the_noise_does_not_pass():
    # 3% lower on average with 10% noise over 8 samples: on the right side, not significant.
    modes = {"fp32": mode("fp32", noise=0.05, n=8, seed=4),
             "amp-fp16": mode("amp-fp16", comm=0.485, noise=0.05, n=8, seed=5)}
    claim = Expectation(metric="comm_s.median", mode="amp-fp16", vs="fp32", max_ratio=1.0)
    verdict = evaluate(claim, modes)
    if "not significant" not in verdict.detail:
        pytest.fail(f"noise passed as an effect: {verdict.detail}")
    assert not verdict.passed


def test_wire_bytes_are_exact_counts_and_absolute_bounds_are_tested():
    modes = {"fp32": mode("fp32", wire=8e6), "amp-fp16": mode("amp-fp16", wire=4.1e6)}
    half = Expectation(metric="wire_bytes_per_iteration", mode="amp-fp16", vs="fp32",
                       max_ratio=0.5)
    assert not evaluate(half, modes).passed  # 0.5125 > 0.5, no test can excuse it
    efficient = Expectation(metric="scaling_efficiency.median", mode="fp32", min=0.1)
    assert evaluate(efficient, modes).passed  # 0.1 / 0.6 ~ 0.17 on every iteration
    too_much = Expectation(metric="scaling_efficiency.median", mode="fp32", min=0.5)
    assert not evaluate(too_much, modes).passed


@pytest.mark.parametrize("bad, reason", [
    ({"metric": "comm_s.median", "mode": "fp32"}, "give a bound"),
    ({"metric": "comm_s.median", "mode": "amp", "max_ratio": 0.8}, "set vs"),
    ({"metric": "comm_s.median", "mode": "amp", "vs": "fp32", "max_ratio": 0}, "greater than 0"),
    ({"metric": "latency", "mode": "amp", "vs": "fp32", "max_ratio": 1}, "unknown metric"),
    ({"metric": "comm_s.median", "mode": "amp-bf16", "vs": "fp32", "max_ratio": 1},
     "not run by this scenario"),
])
def test_broken_expectations_are_scenario_errors(bad, reason):
    with pytest.raises(ScenarioError, match=reason) as info:
        Scenario.from_dict(SCENARIO | {"expect": [bad]}, "s.toml")
    assert info.value.field.startswith("expect.0")


def report_with(modes, name="gate"):
    report = ScenarioReport(Scenario.from_dict(SCENARIO | {"name": name}))
    report.modes = modes
    return report


def test_baseline_round_trip_and_the_gate(tmp_path):
    base = report_with({"fp32": mode("fp32", seed=1)})
    path = save([base], tmp_path / "base.json")
    baseline = Baseline(path)
    tolerances = [Tolerance.parse("median:10%"), Tolerance.parse("comm_s.p95:15%")]
    same = report_with({"fp32": mode("fp32", seed=2)})  # a rerun: different noise
    verdicts = baseline.compare(same, tolerances, 0.05)
    assert len(verdicts) == len(tolerances) and all(v.passed for v in verdicts)
    slower = report_with({"fp32": mode("fp32", comm=0.75, seed=3)})  # half the bandwidth
    verdicts = baseline.compare(slower, tolerances, 0.05)
    assert not any(v.passed for v in verdicts)
    text = verdicts[0].detail
    for word in ("REGRESSION", "iteration_s.median", "baseline", "current", "threshold",
                 "Mann-Whitney p"):
        assert word in text


def test_a_baseline_on_gloo_is_never_compared_with_a_run_on_nccl(tmp_path):
    """backend = 'auto' runs gloo on a CPU host and NCCL on a GPU host: the numbers of one
    are no baseline for the other, and the gate says so instead of comparing them."""
    baseline = Baseline(save([report_with({"fp32": mode("fp32", seed=1)})],
                             tmp_path / "base.json"))
    tolerances = [Tolerance.parse("median:10%")]
    on_nccl = report_with({"fp32": mode("fp32", seed=2, backend="nccl")})
    (verdict,) = baseline.compare(on_nccl, tolerances, 0.05)
    assert not verdict.passed
    assert "the baseline ran on gloo, this run on nccl: not compared" in verdict.detail
    assert all(v.passed for v in baseline.compare(
        report_with({"fp32": mode("fp32", seed=2)}), tolerances, 0.05))


def test_over_the_tolerance_but_not_significant_is_not_a_regression():
    current = mode("fp32", comm=0.5, noise=0.2, n=4, seed=9)
    base_samples = [0.62, 0.35, 0.9, 0.4]
    verdict = regression_verdict("gate", "fp32", Tolerance.parse("median:1%"), current,
                                 0.5, base_samples)
    assert verdict.passed and verdict.p_value > 0.05


def test_unusable_baselines_are_clear_errors(tmp_path):
    with pytest.raises(BaselineError, match="no such baseline file"):
        Baseline(tmp_path / "missing.json")
    (tmp_path / "plain.json").write_text(json.dumps({"benchmarks": []}))
    with pytest.raises(BaselineError, match="not a netsim-ddp baseline"):
        Baseline(tmp_path / "plain.json")
    path = save([report_with({"fp32": mode("fp32")})], tmp_path / "b.json")
    data = json.loads(path.read_text())
    data["netsim_ddp"]["format"] = 99
    (tmp_path / "future.json").write_text(json.dumps(data))
    with pytest.raises(BaselineError, match="format 99"):
        Baseline(tmp_path / "future.json")
    other = report_with({"fp32": mode("fp32")}, name="another")
    with pytest.raises(BaselineError, match="has no scenario 'another'"):
        Baseline(path).compare(other, [Tolerance.parse("median:10%")], 0.05)


def test_tolerance_grammar():
    assert str(Tolerance.parse("median:10%")) == "iteration_s.median:10%"
    assert Tolerance.parse("comm_s.p95:15%").fraction == 0.15
    with pytest.raises(ValueError, match="METRIC:PERCENT"):
        Tolerance.parse("median 10")


def test_pytest_benchmark_compare_reads_the_baseline(tmp_path):
    path = save([report_with({"fp32": mode("fp32"), "amp": mode("amp")})], tmp_path / "b.json")
    result = subprocess.run([sys.executable, "-m", "pytest_benchmark", "compare", str(path)],
                            capture_output=True, text=True, timeout=60)
    assert result.returncode == 0, result.stderr
    assert "gate[fp32]" in result.stdout and "gate[amp]" in result.stdout


def test_too_few_samples_say_so():
    modes = {"fp32": mode("fp32", n=3, seed=1), "amp-fp16": mode("amp-fp16", comm=0.2, n=3)}
    claim = Expectation(metric="comm_s.median", mode="amp-fp16", vs="fp32", max_ratio=1.0)
    verdict = evaluate(claim, modes)
    assert not verdict.passed and "measure more iterations" in verdict.detail


def test_a_registered_mode_is_held_to_its_wire_dtype_and_joins_the_default_claim():
    from netsim_ddp.precision.modes import MODES, AmpMode, register_mode
    from netsim_ddp.verdicts.run_checks import wire_ratio_checks

    class Fp16Everywhere(AmpMode):
        name = "test-fp16-wire"
        wire_dtype = "float16"

    register_mode(Fp16Everywhere())
    try:
        modes = {"fp32": mode("fp32", wire=8e6), "amp": mode("amp", wire=8e6),
                 "test-fp16-wire": mode("test-fp16-wire", wire=6e6)}  # 0.75 x, not 0.5
        checks = {check.name: check for check in wire_ratio_checks(modes)}
        assert checks["wire-bytes:amp/fp32"].passed
        registered = checks["wire-bytes:test-fp16-wire/fp32"]
        assert not registered.passed and "expected 0.50" in registered.detail
        claims = [claim.mode for claim in default_expectations(list(modes))]
        assert claims == ["test-fp16-wire"]
    finally:
        del MODES["test-fp16-wire"]


def test_gating_on_a_baseline_from_another_machine_says_which_fields_differ(tmp_path):
    from netsim_ddp.measure.machine import MachineInfo
    from netsim_ddp.run.session import NetsimSession

    path = save([report_with({"fp32": mode("fp32", seed=1)})], tmp_path / "base.json")
    assert Baseline(path).machine_warning() is None  # saved here: the same machine
    assert NetsimSession.create(baseline=str(path)).warnings == []
    document = json.loads(path.read_text())
    document["machine_info"]["cpu"]["brand_raw"] = "Some Other CPU"
    document["machine_info"]["torch_version"] = "0.0.1"
    path.write_text(json.dumps(document))
    warning = Baseline(path).machine_warning()
    assert warning is not None and str(path) in warning
    assert "cpu.brand_raw: 'Some Other CPU' != " in warning
    assert "torch_version: '0.0.1' != " in warning and "release" not in warning
    session = NetsimSession.create(baseline=str(path))
    assert session.warnings == [warning]
    session.reports.append(report_with({"fp32": mode("fp32", seed=2)}))
    assert f"  {warning}" in session.summary_lines()
    current = MachineInfo.of_this_host()
    assert Baseline(path).machine_warning(current) == warning


def test_the_plugin_header_warns_of_a_baseline_from_another_machine(tmp_path):
    from types import SimpleNamespace

    from netsim_ddp import plugin
    from netsim_ddp.run.session import NetsimSession

    path = save([report_with({"fp32": mode("fp32", seed=1)})], tmp_path / "base.json")
    document = json.loads(path.read_text())
    document["machine_info"]["release"] = "0.0-other-kernel"
    path.write_text(json.dumps(document))
    config = SimpleNamespace(stash=pytest.Stash(), option=SimpleNamespace())
    config.stash[plugin._SESSION] = NetsimSession.create(baseline=str(path))
    (line,) = plugin.pytest_report_header(config)
    assert line.startswith(f"netsim-ddp: warning: baseline {path} was measured on a different "
                           "machine (saved != current): release: '0.0-other-kernel' != ")


def test_the_cli_warns_of_a_baseline_from_another_machine_before_it_runs(tmp_path, monkeypatch):
    from click.testing import CliRunner

    from netsim_ddp.cli import main
    from netsim_ddp.run.hosts import host_agent as host
    from netsim_ddp.run.hosts.host_options import HostConfigError

    path = save([report_with({"fp32": mode("fp32", seed=1)})], tmp_path / "base.json")
    document = json.loads(path.read_text())
    document["machine_info"]["cpu"]["count"] = 512
    path.write_text(json.dumps(document))

    def refuse(options, progress):  # stop where a run would start changing the host
        raise HostConfigError("stopped by the test")

    monkeypatch.setattr(host, "run_host", refuse)
    result = CliRunner().invoke(main, [
        "host", str(Path(__file__).resolve().parents[2] / "scenarios" / "default.toml"),
        "--node-rank", "0", "--nnodes", "2",
        "--master-addr", "127.0.0.1", "--master-port", "29500", "--nic", "eth9",
        "--out", str(tmp_path / "out"), "--baseline", str(path)])
    assert result.exit_code == 2, result.output
    assert "was measured on a different machine" in result.output
    assert "cpu.count: 512 != " in result.output and "stopped by the test" in result.output
