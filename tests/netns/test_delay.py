"""Delay, jitter and loss on the emulated links, by whichever backend applies them: netem where
the kernel has it, the userspace delay line where it doesn't (and on request)."""

import math
import statistics

import pytest

from netsim_ddp import Scenario
from netsim_ddp.fabric import Fabric, FabricError
from netsim_ddp.fabric.delayline.probes import ProbePath, echo_samples, tcp_bulk, udp_blast
from netsim_ddp.fabric.fidelity import expected_goodput

pytestmark = [pytest.mark.netns, pytest.mark.usefixtures("needs_fabric")]


@pytest.fixture(params=["delay-line", "netem"])
def backend(request, capabilities):
    if request.param == "netem" and not capabilities.netem:
        pytest.skip("this kernel has no netem (sch_netem): only the delay line can run here")
    return request.param


def scenario(backend, **link):
    return Scenario.from_dict({"name": "delay", "topology": {"nodes": 2},
                               "link": {"rate": "500mbit", "delay_backend": backend, **link}})


def median_rtt_us(fabric) -> float:
    path = ProbePath.between(fabric.nodes[0], fabric.nodes[1])
    # Busy-polling for the reply keeps an idle vCPU's wake-up out of each round trip.
    return statistics.median(s.rtt_ns for s in echo_samples(path, 300, busy_poll=True)) / 1e3


@pytest.fixture(scope="module")
def base_rtt_us():
    """Round trip over the same kind of fabric without delay: what the host itself adds."""
    with Fabric(scenario("auto")) as fabric:
        return median_rtt_us(fabric)


@pytest.mark.parametrize("one_way", ["1ms", "5ms"])
def test_round_trip_carries_both_one_way_delays(backend, base_rtt_us, one_way, measure_until):
    delay_us = float(one_way.removesuffix("ms")) * 1000
    tolerance_us = 150 + 0.02 * 2 * delay_us
    with Fabric(scenario(backend, delay=one_way)) as fabric:
        assert set(fabric.delay_backends.values()) == {backend}
        rtt = measure_until(lambda: median_rtt_us(fabric),
                            lambda us: abs(us - base_rtt_us - 2 * delay_us) <= tolerance_us)
    # Each node delays what it sends: a round trip crosses two delays.
    assert abs(rtt - base_rtt_us - 2 * delay_us) <= tolerance_us


def test_goodput_still_matches_the_cap_with_delay(backend, measure_until):
    expected = expected_goodput(500e6, 1500)
    with Fabric(scenario(backend, delay="2ms")) as fabric:
        path = ProbePath.between(fabric.nodes[0], fabric.nodes[1])
        result = measure_until(lambda: tcp_bulk(path, seconds=2.5),
                               lambda r: r.goodput_bps >= 0.93 * expected)
    assert result.goodput_bps >= 0.93 * expected


def test_loss_drops_the_configured_fraction(backend):
    count, p = 20_000, 0.05
    lossy = Scenario.from_dict({
        "name": "loss", "topology": {"nodes": 2},
        "link": {"rate": "500mbit", "delay_backend": backend,
                 "override": [{"node": "n0", "delay": "100us", "loss": "5%"}]}})
    with Fabric(lossy) as fabric:
        assert fabric.delay_backends == {"n0": backend, "n1": None}
        arrived = udp_blast(ProbePath.between(fabric.nodes[0], fabric.nodes[1]), count, 1400)
    lost = (count - len(set(arrived))) / count
    assert abs(lost - p) <= 4 * math.sqrt(p * (1 - p) / count)  # 4 binomial sigmas


def test_delay_line_reports_its_counters_at_teardown():
    with Fabric(scenario("delay-line", delay="1ms")) as fabric:
        tcp_bulk(ProbePath.between(fabric.nodes[0], fabric.nodes[1]), seconds=0.5)
    stats = fabric.delay_line_stats["n0"]
    assert stats["forwarded"] > 1000 and stats["dropped_queue_full"] == 0
    assert {"late_p50_us", "late_p99_us"} <= set(stats)


def test_netem_backend_is_refused_where_the_kernel_has_none(capabilities):
    if capabilities.netem:
        pytest.skip("this kernel has netem")
    with pytest.raises(FabricError, match="no netem qdisc"):
        with Fabric(scenario("netem", delay="1ms")):
            pass
