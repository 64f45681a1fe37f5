"""How far a run can be trusted, without a network: the all-reduce probe's attempts (launch is
replaced by canned results, so the retry rule itself is tested; the real probe runs in
tests/ddp), and what the summary says about the probe and the host."""

from types import SimpleNamespace

import pytest

from netsim_ddp import Scenario
from netsim_ddp.common.metrics import bus_bandwidth
from netsim_ddp.fabric.fidelity import slowest_link_goodput
from netsim_ddp.measure.probe import CollectiveFidelity
from netsim_ddp.run import emulated_site, probing
from netsim_ddp.workload.ranks.collective import VERDICT_FILE, AllreduceResult

SIZE = 8 * 2**20


def scenario(attempts=3, modes=("fp32",)):
    return Scenario.from_dict({
        "name": "probe", "topology": {"nodes": 2}, "link": {"rate": "1gbit"},
        "fidelity": {"attempts": attempts},
        "workload": {"params": "2M", "modes": list(modes)}})


def seconds_for(fraction, expected_bps):
    """All-reduce time whose bus bandwidth is `fraction` of expected (2 ranks: busbw = algbw)."""
    return SIZE * 8 / (fraction * expected_bps)


@pytest.fixture
def canned(monkeypatch):
    """Attempts reach the given fractions of the link, in order; returns the launch count."""
    launched = []

    def install(*fractions, float16=None):
        """Each attempt's float32 fraction; `float16` adds that dtype at these fractions."""
        _, expected = slowest_link_goodput(scenario())
        load = {"busy": 0.97, "steal": 0.25, "softirq": 0.1}

        def result(dtype, fraction):
            size = SIZE if dtype == "float32" else SIZE // 2
            return AllreduceResult(dtype=dtype, size_bytes=size, world_size=2,
                                   seconds=[seconds_for(fraction, expected) * size / SIZE] * 5,
                                   host_load=load)

        results = iter([result("float32", f)] + ([result("float16", float16[i])] if float16 else [])
                       for i, f in enumerate(fractions))
        monkeypatch.setattr(emulated_site, "launch", lambda *args, **kwargs: launched.append(args))
        monkeypatch.setattr(probing, "read_probe", lambda out: next(results))
        return launched

    return install


def probe(sc, tmp_path, messages=None):
    def on_two_nodes(spec, out_dir, timeout_s, **options):  # as run_scenario's launcher
        return emulated_site.launch(["n0", "n1"], spec, out_dir, timeout_s, **options)

    progress = (messages.append if messages is not None else lambda message: None)
    return probing.probe_collective(on_two_nodes, sc, tmp_path, None,
                                    progress)


def test_a_passing_stall_is_retried_and_the_best_attempt_counts(canned, tmp_path):
    launched = canned(0.70, 0.97, 0.50)
    messages = []
    fidelity = probe(scenario(), tmp_path, messages)
    assert len(launched) == 2  # stopped at the first attempt that reached min_fraction
    assert fidelity.trusted and fidelity.fraction == pytest.approx(0.97)
    assert "best of 2 attempts" in fidelity.reason
    assert messages == ["probe: all-reduce probe attempt 2 of 3 (so far 70% of the link)"]


def test_a_refusal_repeats_every_attempt_and_says_what_the_host_did(canned, tmp_path):
    launched = canned(0.44, 0.46, 0.45)
    fidelity = probe(scenario(), tmp_path)
    assert len(launched) == 3 and not fidelity.trusted
    assert fidelity.fraction == pytest.approx(0.46)
    assert "best of 3 attempts" in fidelity.reason
    assert "host CPUs 97% busy, 25% stolen by the hypervisor" in fidelity.reason
    document = fidelity.to_record().dump()
    assert len(document["attempts_bps"]) == 3 and document["host_load"]["steal"] == 0.25


def test_one_attempt_when_the_scenario_asks_for_one(canned, tmp_path):
    launched = canned(0.70, 0.99)
    fidelity = probe(scenario(attempts=1), tmp_path)
    assert len(launched) == 1 and not fidelity.trusted
    assert "attempts" not in fidelity.reason


def test_the_probe_times_every_wire_dtype_and_the_slowest_counts(canned, tmp_path):
    # A host that moves float32 at the link's rate, but gloo's float16 sum at half of it (as a
    # 2-core EPYC did at 10 Gbit/s): amp-fp16's run would measure the CPU.
    launched = canned(0.99, 0.99, 0.98, float16=(0.50, 0.52, 0.49))
    fidelity = probe(scenario(modes=("fp32", "amp", "amp-fp16")), tmp_path)
    spec = launched[0][1]
    assert spec.allreduce_probe.dtypes == ["float32", "float16"]  # amp sends float32 too
    assert len(launched) == 3 and not fidelity.trusted
    assert fidelity.fraction == pytest.approx(0.52)
    assert fidelity.best_by_dtype["float32"] / fidelity.expected_bps == pytest.approx(0.99)
    assert "the slowest, float16, reached" in fidelity.reason
    assert "(float32 99%: gloo sums 16-bit floats on the CPU, slower)" in fidelity.reason
    assert "float32 8 MiB, float16 4 MiB" in fidelity.reason
    assert fidelity.to_record().dump()["dtype_bps"][1]["float16"] == fidelity.busbw_bps


def test_busbw_of_the_canned_results_is_what_the_fraction_says():
    _, expected = slowest_link_goodput(scenario())
    assert bus_bandwidth(SIZE, seconds_for(0.5, expected), 2) == pytest.approx(0.5 * expected)


def test_the_summary_line_says_how_far_runs_can_be_trusted():
    from netsim_ddp.run.session import probe_summary

    def report(*attempts):
        return SimpleNamespace(fidelity=CollectiveFidelity(SIZE, 2, list(attempts), 1e9, 0.9))

    assert probe_summary([report(1e9)]) == ", all-reduce probe 100% of the link"
    assert (probe_summary([report(0.7e9, 0.97e9), report(1e9), SimpleNamespace(fidelity=None)])
            == ", all-reduce probe 97%-100% of the link (1 retried)")
    assert probe_summary([SimpleNamespace(fidelity=None)]) == ""


def test_steal_while_training_is_a_warning_above_five_percent():
    from netsim_ddp.hostfacts.hostload import CpuLoad
    from netsim_ddp.run.session import steal_warning

    def report(steal):
        return SimpleNamespace(host_load=CpuLoad(busy=0.6, steal=steal, softirq=0.05))

    assert steal_warning([report(0.01), SimpleNamespace(host_load=None)]) is None
    warning = steal_warning([report(0.01), report(0.25)])
    assert warning is not None and "the hypervisor took 25% of this host's CPU" in warning


def test_a_probe_faster_than_the_link_is_refused_as_traffic_that_went_around_it(canned,
                                                                                tmp_path):
    launched = canned(6.8)
    fidelity = probe(scenario(), tmp_path)
    assert len(launched) == 1 and not fidelity.trusted  # retrying cannot slow a bypass down
    assert "faster than the emulated link can carry" in fidelity.reason
    assert "went around the shaped links" in fidelity.reason
    assert "this host cannot move" not in fidelity.reason
    within_burst = CollectiveFidelity(SIZE, 2, [1.04e9], 1e9, 0.9)
    assert within_burst.trusted  # a few percent over the cap is the bucket's burst


def gate_for(sc, tmp_path, messages, trained):
    attempts = probing.ProbeAttempts(sc, sc.workload)
    return probing.ProbeGate(attempts, tmp_path, allow_untrusted=False,
                             progress=messages.append, on_train=lambda: trained.append(True))


def attempt_finished(tmp_path, attempt):
    """What rank 0 leaves when an attempt is done (its results; read_probe is canned)."""
    folder = probing.attempt_dir(tmp_path, attempt)
    folder.mkdir(parents=True)
    (folder / probing.PROBE_RESULT_FILE).write_text("[]")
    return folder


def test_the_probe_inside_the_training_launch_is_judged_attempt_by_attempt(canned, tmp_path):
    """The gated probe (one launch for probe and modes): the ranks wait after each attempt
    for a verdict file; the gate writes 'again' below min_fraction, 'train' once reached."""
    canned(0.70, 0.97)
    messages, trained = [], []
    gate = gate_for(scenario(), tmp_path, messages, trained)
    gate()  # nothing finished yet: no verdict, nothing read
    assert not list(tmp_path.iterdir()) and not trained
    first = attempt_finished(tmp_path, 0)
    gate()
    assert (first / VERDICT_FILE).read_text() == probing.AGAIN and not trained
    assert messages == ["probe: all-reduce probe attempt 2 of 3 (so far 70% of the link)"]
    second = attempt_finished(tmp_path, 1)
    gate()
    assert (second / VERDICT_FILE).read_text() == probing.TRAIN and trained == [True]
    assert gate.probing.fidelity.trusted and gate.probing.fidelity.fraction == pytest.approx(0.97)
    gate()  # decided: later calls change nothing
    assert trained == [True] and not probing.attempt_dir(tmp_path, 2).exists()


def test_a_gated_probe_that_falls_short_ends_the_launch_without_a_verdict(canned, tmp_path):
    canned(0.44)
    trained = []
    gate = gate_for(scenario(attempts=1), tmp_path, [], trained)
    folder = attempt_finished(tmp_path, 0)
    with pytest.raises(probing.ProbeRefused, match="cannot move the workload's traffic"):
        gate()
    assert not (folder / VERDICT_FILE).exists() and not trained
