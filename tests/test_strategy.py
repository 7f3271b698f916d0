"""The cost model: decisions, the capacity ladder, where figures come from
(installed, the profile file, platform defaults), and $ZIPCCL_STRATEGY."""

import dataclasses

import jax.numpy as jnp
import numpy as np
import pytest

from zipccl_jax import profile, strategy

BF16 = jnp.bfloat16
SLOW = profile.Link(size=8, latency=1e-3, bandwidth=50e6)  # 400 Mbit/s
FAST = profile.Link(size=2, latency=20e-6, bandwidth=40e9)
MEASURED = profile.Profile("cpu", "cpu", compress_rate=1.1e9, decompress_rate=1.7e9, ratios=(("bfloat16", 1.45),),
                           links=(("data", SLOW), ("model", FAST)))


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
    small = strategy.plan("all_to_all", 1024, BF16, ("d",), 8, slow_link)
    large = strategy.plan("all_to_all", 256 << 20, BF16, ("d",), 8, slow_link)
    assert not small.compress and large.compress and "modelled 1.81 s vs 2.35 s raw" in large.reason
    fast_link = strategy.plan("all_to_all", 256 << 20, BF16, ("d",), 8, strategy.CostModel(link_bandwidth=1e11))
    assert not fast_link.compress  # the codec costs more than the link saves
    ints = strategy.plan("psum", 256 << 20, jnp.int32, ("d",), 8, "compressed")
    assert not ints.compress and "int32 is not compressed" in ints.reason
    one = strategy.plan("psum", 256 << 20, jnp.float32, ("d",), 1, None)
    assert not one.compress and "size 1" in one.reason
    latency_bound = strategy.plan("psum", 1 << 20, jnp.float32, ("d",), 4, strategy.CostModel(latency=1.0))
    assert latency_bound.algorithm == "all_gather+local_reduce"
    bandwidth_bound = strategy.plan("psum", 1 << 20, jnp.float32, ("d",), 64, strategy.CostModel(latency=0.0))
    assert bandwidth_bound.algorithm == "reduce_scatter+all_gather"
    assert strategy.last_plans()[-1] == bandwidth_bound
    with pytest.raises(ValueError, match="strategy must be None, 'auto', 'raw', 'compressed' or a CostModel"):
        strategy.plan("psum", 10, np.float32, ("d",), 2, "sometimes")
    with pytest.raises(ValueError, match="unknown collective 'reduce'"):
        strategy.plan("reduce", 10, np.float32, ("d",), 2)


def test_the_model_counts_the_rung_sent_and_the_raw_psum_in_float32():
    model = strategy.CostModel(ratios=(("bfloat16", 1.45), ("float32", 1.0)))
    assert strategy.wire_fraction(model, BF16) == 0.698 and strategy.wire_fraction(model, np.float32) == 1.0
    # at a link where the two balance for a 4-byte transfer, a bf16 psum
    # compresses (its raw path moves float32) and a bf16 all_to_all does not
    link = dataclasses.replace(model, latency=0.0, link_bandwidth=4e8)
    assert strategy.plan("psum", 64 << 20, BF16, ("d",), 2, link).compress
    assert not strategy.plan("all_to_all", 64 << 20, BF16, ("d",), 2, link).compress


def test_plans_name_the_axes_and_the_figures_behind_them():
    strategy.install(MEASURED)
    p = strategy.plan("psum", 16 << 20, BF16, ("data",), 8)
    assert p.compress and p.axes == ("data",) and p.source == "autotune"
    assert (p.latency, p.link_bandwidth, p.compress_rate, p.decompress_rate, p.ratio) == (1e-3, 50e6, 1.1e9, 1.7e9,
                                                                                          1.45)
    assert "('data',) from autotune: latency 1 ms, link 50 MB/s, codec 1.1 GB/s / 1.7 GB/s, bfloat16 ratio " \
           "1.450 (sends 70%)" in p.reason and "\n" not in p.reason
    assert strategy.last_plans(clear=True)[-1] == p and strategy.last_plans() == []


def test_several_axes_take_the_slowest_link_and_unmeasured_axes_the_default_link():
    strategy.install(MEASURED)
    both = strategy.model_for(("model", "data"))
    assert (both.latency, both.link_bandwidth, both.compress_rate) == (1e-3, 50e6, 1.1e9)
    default = strategy.PLATFORM_DEFAULTS["cpu"]
    other = strategy.model_for(("expert",), platform="cpu")
    assert (other.latency, other.link_bandwidth) == (default.latency, default.link_bandwidth)
    assert other.compress_rate == 1.1e9 and other.ratio(BF16) == 1.45 and other.ratio(np.float16) == 1.18
    assert other.source == f"link 'expert': {default.source}; codec: autotune"
    # the same measured fast link, installed for every axis ("*")
    strategy.install(dataclasses.replace(MEASURED, links=(("*", FAST),)))
    assert strategy.model_for(("expert",)).link_bandwidth == 40e9
    assert strategy.model_for(("data",)).link_bandwidth == 50e6  # an axis's own entry wins


def test_platform_defaults_are_what_an_untuned_process_uses():
    cpu = strategy.plan("psum", 16 << 20, BF16, ("d",), 2, platform="cpu")
    gpu = strategy.plan("psum", 16 << 20, BF16, ("d",), 2, platform="cuda")
    assert strategy.model_for(("d",), platform="rocm") == strategy.PLATFORM_DEFAULTS["gpu"]
    assert strategy.model_for(("d",)) == strategy.PLATFORM_DEFAULTS["cpu"]  # this test process runs on CPU
    for p, name in ((cpu, "cpu"), (gpu, "gpu")):
        default = strategy.PLATFORM_DEFAULTS[name]
        assert p.source == default.source and p.source.startswith(f"{name} default (assumed")
        assert (p.latency, p.link_bandwidth, p.compress_rate) == (default.latency, default.link_bandwidth,
                                                                  default.compress_rate)
    # untuned, a 16 MB bf16 psum goes raw on CPU; on GPU the assumed codec
    # beats the float32 the raw psum moves, not the bf16 an all_to_all moves
    assert not cpu.compress and gpu.compress
    assert not strategy.plan("all_to_all", 16 << 20, BF16, ("d",), 2, platform="cuda").compress
    with pytest.raises(ValueError, match="no cost model for platform 'tpu'; expected cpu, cuda, rocm or gpu"):
        strategy.plan("psum", 16 << 20, BF16, ("d",), 2, platform="tpu")


def test_the_profile_file_is_read_until_figures_are_installed(tmp_path, monkeypatch):
    path = tmp_path / "profile.json"
    monkeypatch.setenv(strategy.PROFILE_ENV, str(path))
    profile.write(dataclasses.replace(MEASURED, ladder=(0.7, 1.0)), path)
    from_file = strategy.model_for(("data",))
    assert from_file.source == f"profile {path}" and from_file.ladder == (0.7, 1.0)
    assert strategy.plan("psum", 16 << 20, BF16, ("data",), 8).compress
    strategy.install(dataclasses.replace(MEASURED, links=(("data", FAST),)))
    assert strategy.model_for(("data",)).link_bandwidth == 40e9  # installed wins over the file
    assert strategy.model_for(("other",)).ladder == strategy.DEFAULT_LADDER  # codec part: installed, default ladder
    path.write_text('{"latency": 0.001, "link_bandwidth": 1e6}')  # a version-1 profile
    strategy.uninstall()
    with pytest.raises(ValueError, match=r"profile .*profile.json: not a zipccl_jax profile .*calibrate"):
        strategy.model_for(("data",))


def test_zipccl_strategy_overrides_the_default_and_a_per_call_strategy_wins(monkeypatch):
    strategy.install(MEASURED)  # the model compresses a 16 MB bf16 psum over "data"
    args = ("psum", 16 << 20, BF16, ("data",), 8)
    monkeypatch.setenv(strategy.STRATEGY_ENV, "raw")
    forced = strategy.plan(*args)
    assert not forced.compress and forced.reason.startswith("ZIPCCL_STRATEGY=raw: raw ")
    assert strategy.plan(*args, "auto").compress and strategy.plan(*args, "compressed").compress
    assert strategy.plan(*args, strategy.model_for(("data",))).compress
    monkeypatch.setenv(strategy.STRATEGY_ENV, " Compressed ")
    assert strategy.plan("psum", 1024, BF16, ("data",), 8).compress
    monkeypatch.setenv(strategy.STRATEGY_ENV, "auto")
    assert strategy.plan(*args).compress and not strategy.plan("psum", 1024, BF16, ("data",), 8).compress
    monkeypatch.setenv(strategy.STRATEGY_ENV, "always")
    with pytest.raises(ValueError, match=r"\$ZIPCCL_STRATEGY must be one of auto, raw, compressed \(or unset\), "
                                         r"got 'always'"):
        strategy.plan(*args)
    assert not strategy.plan(*args, "raw").compress  # a per-call strategy never reads the variable


@pytest.mark.parametrize("text,problem", [
    ("{", "is not valid JSON"),
    ('{"zipccl_jax_profile": 3}', "version 3, this zipccl_jax reads version 2"),
    ('{"zipccl_jax_profile": 2, "platform": "tpu", "device_kind": "", "codec": {}, "ratios": {}, "links": {}}',
     "platform 'tpu', expected one of cpu, gpu"),
    ('{"zipccl_jax_profile": 2, "platform": "cpu", "device_kind": "cpu", "codec": {"compress_rate": 1e9}, '
     '"ratios": {}, "links": {}, "bandwith": 1}', "unknown key.s. bandwith"),
    ('{"zipccl_jax_profile": 2, "platform": "cpu", "device_kind": "cpu", "codec": {"compress_rate": 1e9}, '
     '"ratios": {}, "links": {}}', "codec: missing key.s. decompress_rate"),
    ('{"zipccl_jax_profile": 2, "platform": "cpu", "device_kind": "cpu", "codec": {"compress_rate": 1e9, '
     '"decompress_rate": 1e9}, "ratios": {}, "links": {"d": {"size": 2, "latency": 0, "bandwidth": -5}}}',
     "link 'd' bandwidth must be a finite number > 0, got -5"),
])
def test_a_malformed_profile_is_an_error_naming_the_file_and_the_problem(tmp_path, text, problem):
    path = tmp_path / "p.json"
    path.write_text(text)
    with pytest.raises(ValueError, match=f"profile {path}.*{problem}"):
        profile.read(path)


def test_a_profile_round_trips_exactly(tmp_path):
    odd = dataclasses.replace(MEASURED, compress_rate=1234567.0987654321, ladder=(0.6, 0.75, 1.0))
    assert profile.read(profile.write(odd, tmp_path / "sub" / "p.json")) == odd
