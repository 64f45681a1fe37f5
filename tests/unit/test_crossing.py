"""The crossed-the-network guard's arithmetic: what an all-reduce sends between nodes."""

import pytest

from netsim_ddp import Scenario
from netsim_ddp.scenario.units import header_factor
from netsim_ddp.verdicts.crossing import (
    MIN_FRACTION,
    CrossingVerdict,
    expected_cross_node,
)

S = 10_000_000  # gradient bytes per rank and step


def payload(backend, nodes, ranks):
    return expected_cross_node(backend, nodes, ranks, S, 1500).payload_bytes


def test_one_rank_per_node_is_the_ring_bound_for_both_backends():
    # 2(n-1)/n x S per node, n nodes: 2(n-1) x S in all
    for nodes in (2, 3, 4, 8):
        assert payload("gloo", nodes, 1) == pytest.approx(2 * (nodes - 1) * S)
        assert payload("nccl", nodes, 1) == pytest.approx(2 * (nodes - 1) * S)


def test_gloo_flat_ring_crosses_each_node_boundary_once_per_ring():
    # 2 nodes x 2 ranks: ring 0->1->2->3->0 crosses at 1->2 and 3->0, each hop 2(W-1)/W x S
    assert payload("gloo", 2, 2) == pytest.approx(2 * 2 * 3 / 4 * S)
    assert payload("gloo", 4, 2) == pytest.approx(4 * 2 * 7 / 8 * S)


def test_nccl_expects_the_lower_of_ring_and_tree():
    # tree: 2(N-1) x S, below the ring's N x 2(W-1)/W x S once a node holds several ranks
    expectation = expected_cross_node("nccl", 2, 4, S, 1500)
    assert expectation.payload_bytes == pytest.approx(2 * S)
    assert "tree" in expectation.algorithm
    assert payload("gloo", 2, 4) == pytest.approx(2 * 2 * 7 / 8 * S)


def test_one_node_sends_nothing_across():
    assert payload("gloo", 1, 4) == 0


def test_headers_are_those_tc_counts():
    assert header_factor(1500) == pytest.approx(1514 / 1448)
    assert header_factor(9000) == pytest.approx(9014 / 8948)
    wire = expected_cross_node("gloo", 2, 1, S, 9000).wire_bytes
    assert wire == pytest.approx(2 * S * 9014 / 8948)


def test_a_bypass_fails_with_expected_and_counted_bytes():
    expectation = expected_cross_node("gloo", 2, 1, S, 1500)
    verdict = CrossingVerdict("fp32", expectation, counted_bytes=0.05e6)
    assert not verdict.passed
    assert "did not cross the emulated network" in verdict.detail
    assert f"expected {expectation.wire_bytes / 1e6:.2f} MB" in verdict.detail
    assert "counted 0.05 MB" in verdict.detail
    assert "NCCL_HOSTID" in verdict.detail  # the likely causes are named


def test_full_traffic_passes_and_the_threshold_is_the_boundary():
    expectation = expected_cross_node("gloo", 2, 1, S, 1500)
    assert CrossingVerdict("fp32", expectation, expectation.wire_bytes * 1.02).passed
    assert CrossingVerdict("fp32", expectation,
                           expectation.wire_bytes * (MIN_FRACTION + 0.001)).passed
    assert not CrossingVerdict("fp32", expectation,
                               expectation.wire_bytes * (MIN_FRACTION - 0.01)).passed


def test_runner_checks_every_mode_with_its_backend():
    from types import SimpleNamespace

    from netsim_ddp.verdicts.run_checks import crossing_checks

    scenario = Scenario.from_dict({"name": "x", "topology": {"nodes": 2, "ranks_per_node": 2},
                                   "link": {"rate": "1gbit"}, "workload": {"params": "1M"}})
    wire = 3 * S * header_factor(1500)  # gloo, 2 x 2: 3 S of payload
    modes = {
        "fp32": SimpleNamespace(result=SimpleNamespace(backend="gloo", sent_bytes_per_iteration=S),
                                wire_bytes_per_iteration=wire),
        "amp-fp16": SimpleNamespace(result=SimpleNamespace(backend="gloo",
                                                           sent_bytes_per_iteration=S // 2),
                                    wire_bytes_per_iteration=0.1 * wire / 2),
    }
    checks = {c.name: c for c in crossing_checks(scenario, modes)}
    assert checks["crossed:fp32"].passed
    assert not checks["crossed:amp-fp16"].passed
    one_node = scenario.model_copy(update={"topology": scenario.topology.model_copy(
        update={"nodes": 1})})
    assert crossing_checks(one_node, modes) == []
