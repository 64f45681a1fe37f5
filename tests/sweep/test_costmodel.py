"""The cost model on synthetic data with known parameters: the fit must recover them."""

import random

import pytest

from netsim_ddp.projection.costmodel import (
    PROJECTION_LABEL,
    CostModel,
    FitError,
    StepPoint,
    check_held_out,
    fit,
    project,
)

TRUE = CostModel(alpha_s=0.004, bandwidth_efficiency=0.9, overlap=0.3)
GBIT = 1e9


def synthetic(model=TRUE, noise=0.0, seed=0, worlds=(2, 3, 4), sizes=(4e6, 8e6, 16e6),
              modes=(("fp32", 1.0), ("amp-fp16", 0.5)), link=GBIT):
    """Points laid out like a sweep: world sizes x model sizes x modes; compute grows with the
    model; the measured step is the model's, times (1 + noise x N(0,1))."""
    rng = random.Random(seed)
    points = []
    for n in worlds:
        for params in sizes:
            buckets = max(1, round(params * 4 / 26e6 + 0.5))
            for mode, ratio in modes:
                compute = 0.02 + params / 2e8 * (0.8 if ratio < 1 else 1.0)
                point = StepPoint(mode, n, link, params * 4 * ratio, buckets, compute)
                step = model.step_s(point) * (1 + noise * rng.gauss(0, 1))
                points.append(StepPoint(mode, n, link, point.bytes_per_rank, buckets, compute,
                                        step, f"n={n} {params:g}"))
    return points


def test_recovers_known_parameters_exactly_without_noise():
    result = fit(synthetic())
    model = result.model
    assert model.alpha_s == pytest.approx(TRUE.alpha_s, rel=1e-4)
    assert model.bandwidth_efficiency == pytest.approx(TRUE.bandwidth_efficiency, rel=1e-4)
    assert model.overlap == pytest.approx(TRUE.overlap, abs=1e-4)
    assert result.rms_relative_error < 1e-6
    assert result.identifiable


@pytest.mark.parametrize("seed", [1, 2, 3])
def test_recovers_parameters_within_noise(seed):
    model = fit(synthetic(noise=0.02, seed=seed)).model
    assert model.alpha_s == pytest.approx(TRUE.alpha_s, rel=0.35)
    assert model.bandwidth_efficiency == pytest.approx(TRUE.bandwidth_efficiency, rel=0.08)
    assert model.overlap == pytest.approx(TRUE.overlap, abs=0.15)


def test_other_parameters_are_recovered_too():
    # Not just one lucky set: no overlap, a slow library, a different link.
    true = CostModel(alpha_s=0.0005, bandwidth_efficiency=0.6, overlap=0.0)
    model = fit(synthetic(true, link=500e6)).model
    assert model.alpha_s == pytest.approx(true.alpha_s, rel=1e-3)
    assert model.bandwidth_efficiency == pytest.approx(true.bandwidth_efficiency, rel=1e-4)
    assert model.overlap == pytest.approx(0.0, abs=1e-4)


def test_points_that_hide_all_their_comm_are_fitted_with_the_max():
    # Large overlap: some points hide their all-reduce completely (exposed comm 0). The linear
    # fit alone would be biased by them; the refinement with max(0, .) recovers the truth.
    true = CostModel(alpha_s=0.001, bandwidth_efficiency=0.9, overlap=0.9)
    points = synthetic(true, sizes=(1e6, 4e6, 16e6))
    hidden = [p for p in points if true.exposed_comm_s(p) == 0.0]
    assert hidden, "the design should include fully hidden points"
    result = fit(points)
    assert result.model.bandwidth_efficiency == pytest.approx(0.9, rel=1e-3)
    assert result.model.alpha_s == pytest.approx(0.001, rel=1e-2)
    assert result.model.overlap == pytest.approx(0.9, abs=1e-3)
    assert max(abs(r) for r in result.relative_residuals) < 1e-6


def test_single_rank_points_carry_no_network_information():
    points = synthetic()
    single = [StepPoint("fp32", 1, GBIT, 16e6, 1, 0.1, 0.1)]
    with pytest.raises(FitError):
        fit(single)
    assert TRUE.step_s(single[0]) == 0.1 and TRUE.allreduce_s(single[0]) == 0.0
    # Adding them changes nothing.
    a, b = fit(points).model, fit(points + single * 3).model
    assert a.alpha_s == pytest.approx(b.alpha_s) and a.overlap == pytest.approx(b.overlap)


def test_a_sweep_that_cannot_separate_the_parameters_says_so():
    # Two points for three parameters.
    assert not fit(synthetic(worlds=(2,), sizes=(16e6,))).identifiable
    # One world size, one bucket, compute linear in the bytes: the overlap column is a mix of
    # the other two, so alpha, bandwidth and overlap trade off exactly.
    points = synthetic(worlds=(2,), sizes=(2e6, 4e6, 6e6), modes=(("fp32", 1.0),))
    result = fit(points)
    assert result.condition > 1e6 and not result.identifiable
    assert result.rms_relative_error < 1e-6  # it still fits the points it has


def test_held_out_predicts_the_largest_world_size():
    points = synthetic(noise=0.01, seed=4, worlds=(2, 3, 4, 6))
    train = [p for p in points if p.world_size < 6]
    held = [p for p in points if p.world_size == 6]
    result = check_held_out(train, held)
    assert len(result.errors) == len(held)
    assert result.max_abs_error < 0.1 and result.within_target
    # The check can fail: a model with the wrong bandwidth misses by far more than 15%.
    wrong = [StepPoint(p.mode, p.world_size, p.link_bps, p.bytes_per_rank, p.buckets,
                       p.compute_s, p.step_s * 1.5) for p in held]
    assert not check_held_out(train, wrong).within_target
    assert set(result.errors_by_mode()) == {"fp32", "amp-fp16"}


def test_projection_is_labelled_and_behaves():
    projection = project(TRUE, compute_s={"fp32": 0.1, "amp-fp16": 0.08},
                         bytes_per_rank={"fp32": 100e6, "amp-fp16": 50e6},
                         buckets={"fp32": 4, "amp-fp16": 4})
    assert projection.label == PROJECTION_LABEL and "not measured" in projection.label
    assert len(projection.rows) == 2 * 4 * 3
    assert any("ring" in line for line in projection.assumptions())
    for mode in ("fp32", "amp-fp16"):
        for rate in (10e9, 25e9, 100e9):
            effs = [projection.efficiency(mode, n, rate) for n in (16, 64, 256, 1024)]
            assert all(0 < e <= 1 for e in effs)
            assert effs == sorted(effs, reverse=True)  # more GPUs, more hops: never better
        by_rate = [projection.efficiency(mode, 64, r) for r in (10e9, 25e9, 100e9)]
        assert by_rate == sorted(by_rate)
    # Half the bytes: fp16 compression is at least as efficient at every point.
    for n in (16, 64, 256, 1024):
        fp16, fp32 = (projection.efficiency(m, n, 10e9) for m in ("amp-fp16", "fp32"))
        assert fp16 > fp32 - 0.02
    # One number for every mode works too, and the arithmetic is the model's.
    single = project(TRUE, compute_s=0.1, bytes_per_rank={"fp32": 100e6}, buckets={"fp32": 4},
                     gpus=(16,), link_bps=(10e9,))
    (row,) = single.rows
    expected_ar = 2 * 15 / 16 * 100e6 * 8 / (0.9 * 10e9) + 2 * 15 * 4 * 0.004
    assert row["allreduce_s"] == pytest.approx(expected_ar)
    assert row["efficiency"] == pytest.approx(0.1 / (0.1 + expected_ar - 0.03))


def test_a_held_out_miss_counts_only_beyond_the_measurements_noise():
    train = synthetic(worlds=(2, 3))
    exact = [p for p in synthetic(worlds=(4,)) if p.mode == "fp32"][:1]
    (point,) = exact
    predicted = check_held_out(train, exact).predicted_s[0]

    def measured(scale, spread):
        # 10 steps spread symmetrically around a median of predicted x scale
        samples = tuple(predicted * scale * (1 + spread * (k + 0.5) / 4.5)
                        for k in range(-5, 5))
        return [StepPoint(point.mode, 4, point.link_bps, point.bytes_per_rank, point.buckets,
                          point.compute_s, predicted * scale, "n=4", samples)]

    # 17% slower than predicted with tight steps: missed.
    tight = check_held_out(train, measured(1.2, 0.02))
    assert tight.max_abs_error > 0.15 and tight.misses == [True] and not tight.met
    assert tight.verdict == "MISSED"
    # The same median from steps that scatter +-30%: the miss is within the noise.
    noisy = check_held_out(train, measured(1.2, 0.3))
    assert noisy.max_abs_error > 0.15 and noisy.misses == [False] and noisy.met
    assert not noisy.within_target and "noise" in noisy.verdict
    entry = noisy.to_record().dump()["held_out"][0]
    assert entry["missed"] is False and entry["measured_interval_s"][0] < entry["step_s"]
    # Off by twice the measured step, no amount of this noise hides it.
    assert not check_held_out(train, measured(0.5, 0.3)).met


def test_errors_by_mode_keeps_each_modes_worst_point():
    points = synthetic(worlds=(2, 3, 4))
    train = [p for p in points if p.world_size < 4]
    held = [StepPoint(p.mode, p.world_size, p.link_bps, p.bytes_per_rank, p.buckets,
                      p.compute_s, p.step_s * (1.1 if i == 1 else 1.0))
            for i, p in enumerate(p for p in points if p.world_size == 4)]
    worst = check_held_out(train, held).errors_by_mode()
    assert worst["amp-fp16"] == pytest.approx(1 / 1.1 - 1, rel=1e-3)  # the second point
