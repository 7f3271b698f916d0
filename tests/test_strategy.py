"""The cost model: decisions, the capacity ladder, profiles and calibration."""

import jax.numpy as jnp
import numpy as np
import pytest

from zipccl_jax import calibrate, strategy


def test_capacities_are_increasing_aligned_and_end_at_the_full_stream():
    for raw in [2, 100, 8192, 1 << 24]:
        cap = raw + 16
        rungs = strategy.capacities(cap, raw)
        assert rungs[-1] == cap and list(rungs) == sorted(set(rungs))
        assert all(r % 8 == 0 for r in rungs[:-1])
        if raw >= 8192:
            assert len(rungs) == len(strategy.DEFAULT_LADDER)
            assert rungs[0] <= 16 + 0.59 * raw


def test_plan_follows_the_cost_model():
    slow_link = strategy.CostModel(link_bandwidth=1e8)  # 800 Mbit/s
    small = strategy.plan("all_to_all", 1024, jnp.bfloat16, 8, slow_link)
    large = strategy.plan("all_to_all", 256 << 20, jnp.bfloat16, 8, slow_link)
    assert not small.compress and large.compress and "us" in large.reason
    fast_link = strategy.plan("all_to_all", 256 << 20, jnp.bfloat16, 8, strategy.CostModel(link_bandwidth=1e11))
    assert not fast_link.compress  # the codec costs more than the link saves
    ints = strategy.plan("psum", 256 << 20, jnp.int32, 8, "compressed")
    assert not ints.compress and "int32 is not compressed" in ints.reason
    one = strategy.plan("psum", 256 << 20, jnp.float32, 1, None)
    assert not one.compress and "size 1" in one.reason
    latency_bound = strategy.plan("psum", 1 << 20, jnp.float32, 4, strategy.CostModel(latency=1.0))
    assert latency_bound.algorithm == "all_gather+local_reduce"
    bandwidth_bound = strategy.plan("psum", 1 << 20, jnp.float32, 64, strategy.CostModel(latency=0.0))
    assert bandwidth_bound.algorithm == "reduce_scatter+all_gather"
    assert strategy.last_plans()[-1] == bandwidth_bound


def test_profile_round_trips_and_is_used_by_default(tmp_path, monkeypatch):
    path = tmp_path / "profile.json"
    model = strategy.CostModel(latency=1e-3, link_bandwidth=1e6, ratios=(("bfloat16", 1.4),), ladder=(0.7, 1.0))
    strategy.save_model(model, path)
    monkeypatch.setenv(strategy.PROFILE_ENV, str(path))
    assert strategy.load_model() == model
    plan = strategy.plan("all_gather", 1 << 20, jnp.bfloat16, 8)
    assert plan.compress  # a 1 MB/s link makes compression pay


def test_calibration_measures_this_machine():
    model = calibrate.measure(codec_elements=1 << 18, link_elements=1 << 14)
    assert model.compress_rate > 1e7 and model.decompress_rate > 1e7
    assert dict(model.ratios)["bfloat16"] > 1.45
    assert 0 < model.latency < 1 and model.link_bandwidth > 1e5
    with pytest.raises(ValueError, match="strategy must be"):
        strategy.plan("psum", 10, np.float32, 2, "sometimes")
