"""The cost model: its arithmetic and decisions from given figures, the
capacity ladder, where figures come from (installed, the profile file,
platform defaults), profiles old and new, and $ZIPCCL_STRATEGY."""

import dataclasses
import functools
import json

import jax
import jax.numpy as jnp
import numpy as np
import pytest

from zipccl_jax import profile, strategy

BF16 = jnp.bfloat16
SLOW = profile.Link(size=8, latency=1e-3, bandwidth=50e6)  # 400 Mbit/s
FAST = profile.Link(size=2, latency=20e-6, bandwidth=40e9)
MEASURED = profile.Profile("cpu", "cpu", compress_rate=1.1e9, decompress_rate=1.7e9, ratios=(("bfloat16", 1.45),),
                           links=(("data", SLOW), ("model", FAST)))

# These tests are about the CPU's defaults and figures (profiles measured on the CPU devices the
# suite runs on), so they name the platform: by default it is the default platform, a GPU's on a
# GPU host (test_platform_defaults_are_what_an_untuned_process_uses covers the default).
plan = functools.partial(strategy.plan, platform="cpu")
model_for = functools.partial(strategy.model_for, platform="cpu")


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
    small = plan("all_to_all", 1024, BF16, ("d",), 8, slow_link)
    large = plan("all_to_all", 256 << 20, BF16, ("d",), 8, slow_link)
    assert not small.compress and large.compress and "compressed direct, modelled 1.93 s vs raw direct 2.35 s; " \
        in large.reason
    fast_link = plan("all_to_all", 256 << 20, BF16, ("d",), 8, strategy.CostModel(link_bandwidth=1e11))
    assert not fast_link.compress  # the codec costs more than the link saves
    ints = plan("psum", 256 << 20, jnp.int32, ("d",), 8, "compressed")
    assert not ints.compress and "int32 is not compressed" in ints.reason
    one = plan("psum", 256 << 20, jnp.float32, ("d",), 1, None)
    assert not one.compress and "size 1" in one.reason
    # 1 MB over a 1 MB/s link, a consensus of 0.1 s: with 1 s per transfer one
    # phase of more bytes wins, with 0.1 s two phases of fewer; both beat the
    # raw float32 all-reduce and the rank-ordered plans without the codec
    latency_bound = plan("psum", 1 << 20, BF16, ("d",), 4, strategy.CostModel(
        latency=1.0, consensus_latency=0.1, link_bandwidth=1 << 20), platform="cpu")
    assert latency_bound.compress and latency_bound.algorithm == "all_gather+local_reduce"
    bandwidth_bound = plan("psum", 1 << 20, BF16, ("d",), 4,
                                    strategy.CostModel(latency=0.1, link_bandwidth=1 << 20), platform="cpu")
    assert bandwidth_bound.compress and bandwidth_bound.algorithm == "reduce_scatter+all_gather"
    assert strategy.last_plans()[-1] == bandwidth_bound
    raw = plan("psum", 1 << 20, BF16, ("d",), 4, "raw")
    assert not raw.compress and raw.algorithm == "all_reduce"  # XLA's own, whatever psum_algorithm says
    with pytest.raises(ValueError, match="strategy must be None, 'auto', 'raw', 'compressed', a CostModel or a Pinned plan"):
        plan("psum", 10, np.float32, ("d",), 2, "sometimes")
    with pytest.raises(ValueError, match="unknown collective 'reduce'"):
        plan("reduce", 10, np.float32, ("d",), 2)
    with pytest.raises(ValueError, match="unknown psum_algorithm 'ring'; expected one of reduce_scatter"):
        plan("psum", 10, np.float32, ("d",), 2, strategy.CostModel(psum_algorithm="ring"))


# What the bench's 2-process unshaped link measured (consensus 0.1 ms, a byte
# transfer 0.3 ms + 1.6 GB/s, XLA's float32 all-reduce 4 ms + 1.3 GB/s) and a
# 400 Mbit/s link, with the codec at 1.8 / 4 GB/s.
UNSHAPED = strategy.CostModel(latency=0.3e-3, link_bandwidth=1.6e9, consensus_latency=0.1e-3, reduce_latency=4e-3,
                              reduce_bandwidth=1.3e9, compress_rate=1.8e9, decompress_rate=4e9,
                              ratios=(("bfloat16", 1.44),))
SHAPED = dataclasses.replace(UNSHAPED, link_bandwidth=39e6, reduce_bandwidth=39e6)


def test_the_modelled_times_are_what_each_plan_runs():
    nbytes, n = 936_448, 2  # the bench LM's bf16 gradients, one bucket
    terms = strategy.modelled_terms("psum", nbytes, BF16, n, UNSHAPED, widened=True)
    share = nbytes / 2
    T = strategy.Terms
    expected = {(False, "all_reduce"): T(4e-3, 2 * share * 2 / 1.3e9, 0, 0, 0),  # float32 on the wire
                # the rank-ordered algorithms without the codec: no consensus, no size pass, raw bf16 bytes,
                # STORED_RAW streams packed and unpacked (summed) at copy_rate
                (False, "reduce_scatter+all_gather"): T(2 * 0.3e-3, 2 * share / 1.6e9, 0, (nbytes + share) / 5e9,
                                                        2 * nbytes / 5e9),
                (False, "all_gather+local_reduce"): T(0.3e-3, nbytes / 1.6e9, 0, nbytes / 5e9, 2 * nbytes / 5e9),
                # with it: a consensus per phase, the rung's bytes (0.697: the first rung at or above 1 / 1.44),
                # a size pass (a full compress: size_rate is compress_rate unless given), the compress at the
                # rung and the decode
                (True, "reduce_scatter+all_gather"): T(2 * (0.1e-3 + 0.3e-3), 2 * share * 0.697 / 1.6e9,
                                                       (nbytes + share) / 1.8e9, (nbytes + share) / 1.8e9,
                                                       2 * nbytes / 4e9),
                (True, "all_gather+local_reduce"): T(0.1e-3 + 0.3e-3, nbytes * 0.697 / 1.6e9, nbytes / 1.8e9,
                                                     nbytes / 1.8e9, 2 * nbytes / 4e9)}
    assert terms.keys() == expected.keys()
    for k, v in expected.items():
        assert terms[k] == pytest.approx(v, rel=1e-12), k
    times = strategy.modelled_times("psum", nbytes, BF16, n, UNSHAPED, widened=True)
    assert times == {k: sum(t) for k, t in terms.items()}
    # an analysis-only size pass (once the codec has one) is the same term at its own rate
    counted = strategy.modelled_terms("psum", nbytes, BF16, n, dataclasses.replace(UNSHAPED, size_rate=9e9),
                                      widened=True)
    assert counted[(True, "all_gather+local_reduce")] == pytest.approx(
        expected[(True, "all_gather+local_reduce")]._replace(size_pass=nbytes / 9e9), rel=1e-12)
    # compress=False runs a compressed plan's transfers at the top rung, without the codec: its uncompressed plan
    plain = strategy.modelled_times("psum", nbytes, BF16, n, UNSHAPED, widened=True, codec=False)
    assert plain[(True, "all_gather+local_reduce")] == times[(False, "all_gather+local_reduce")]
    assert plain[(False, "all_reduce")] == times[(False, "all_reduce")]
    # the data-moving collectives' raw plans are byte transfers; psum_scatter's is XLA's reduce-scatter
    for name, received in (("all_gather", nbytes), ("all_to_all", share), ("ppermute", nbytes)):
        assert strategy.modelled_times(name, nbytes, BF16, n, UNSHAPED)[(False, "direct")] == pytest.approx(
            0.3e-3 + received / 1.6e9, rel=1e-12)
    assert strategy.modelled_times("psum_scatter", nbytes, BF16, n, UNSHAPED, widened=True)[(False, "direct")] == \
        pytest.approx(4e-3 + share * 2 / 1.3e9, rel=1e-12)


def test_decisions_follow_the_measured_figures():
    args = ("psum", 936_448, BF16, ("data",), 2)
    # unshaped: the all-reduce's fixed cost outweighs one phase, and the codec costs more than 1.44x fewer bytes
    # save at 1.6 GB/s: the rank-ordered all-gather without the codec (bf16 on the wire, no consensus)
    fast = plan(*args, UNSHAPED, platform="cpu")
    assert (fast.compress, fast.algorithm, fast.name, fast.widened) == (
        False, "all_gather+local_reduce", "uncompressed all_gather+local_reduce", True)
    assert fast.modelled == pytest.approx(strategy.modelled_times(*args[:3], 2, UNSHAPED, widened=True)[
        (False, "all_gather+local_reduce")]) and fast.terms.size_pass == 0 and fast.measured_seconds is None
    assert fast.reason.startswith("uncompressed all_gather+local_reduce, modelled 1.45 ms vs uncompressed "
                                  "reduce_scatter+all_gather 1.84 ms, compressed all_gather+local_reduce 2.32 ms, ")
    assert strategy.modelled_time(fast) == fast.modelled == strategy.modelled_time(fast, codec=False)
    slow = plan(*args, SHAPED, platform="cpu")
    assert slow.compress and slow.name == "compressed all_gather+local_reduce" and slow.modelled > 10 * fast.modelled
    assert strategy.modelled_time(slow, codec=False) > slow.modelled  # compress=False: its uncompressed variant
    # an all-reduce as cheap as a byte transfer: XLA's (float32 at twice the bytes, but no copies)
    cheap_reduce = dataclasses.replace(UNSHAPED, reduce_latency=0.3e-3, reduce_bandwidth=3.2e9)
    assert plan(*args, cheap_reduce, platform="cpu").name == "raw all_reduce"
    # on GPU the raw psum moves bf16 (not widened): with an all-reduce as fast as a transfer and copies at
    # the GPU default's rate, XLA's wins there; on CPU it moves float32 and the rank-ordered plan wins
    fast_reduce = dataclasses.replace(UNSHAPED, reduce_latency=0.3e-3, reduce_bandwidth=1.6e9, copy_rate=500e9)
    gpu, cpu = (plan(*args, fast_reduce, platform=p) for p in ("cuda", "cpu"))
    assert not gpu.widened and gpu.name == "raw all_reduce" and "(float32)" not in gpu.reason
    assert cpu.widened and cpu.name == "uncompressed all_gather+local_reduce" and \
        "all-reduce 300 us + 1.6 GB/s (float32)" in cpu.reason
    # a model given with the old fields only: they stand for the new ones
    old = strategy.CostModel(latency=2e-3, link_bandwidth=1e8)
    assert old.figures() == (2e-3, 1e8, 2e-3, 2e-3, 1e8)
    assert plan(*args, old, platform="cpu").consensus_latency == 2e-3


def test_the_model_counts_the_rung_sent_and_the_raw_psum_in_float32():
    model = strategy.CostModel(ratios=(("bfloat16", 1.45), ("float32", 1.0)))
    assert strategy.wire_fraction(model, BF16) == 0.6901 and strategy.wire_fraction(model, np.float32) == 1.0
    # at a link where the codec costs what 1.43x fewer bytes save, a bf16 psum
    # leaves XLA's all-reduce (it moves float32) for the rank-ordered plan without
    # the codec, and a bf16 all_to_all stays raw
    link = dataclasses.replace(model, latency=0.0, link_bandwidth=4e8)
    assert plan("psum", 64 << 20, BF16, ("d",), 2, link, platform="cpu").name == \
        "uncompressed all_gather+local_reduce"
    assert plan("psum", 64 << 20, BF16, ("d",), 2, link, platform="cuda").name == "raw all_reduce"
    assert not plan("all_to_all", 64 << 20, BF16, ("d",), 2, link).compress


def test_plans_name_the_axes_and_the_figures_behind_them():
    strategy.install(MEASURED)
    p = plan("psum", 16 << 20, BF16, ("data",), 8)
    assert p.compress and p.axes == ("data",) and p.source == "autotune"
    assert (p.latency, p.link_bandwidth, p.compress_rate, p.decompress_rate, p.ratio) == (1e-3, 50e6, 1.1e9, 1.7e9,
                                                                                          1.45)
    # a link given without the consensus and all-reduce figures: its latency and bandwidth stand for them
    assert (p.consensus_latency, p.reduce_latency, p.reduce_bandwidth) == (1e-3, 1e-3, 50e6)
    assert "('data',) from autotune: consensus 1 ms, transfer 1 ms + 50 MB/s, all-reduce 1 ms + 50 MB/s " \
           "(float32), codec 1.1 GB/s / 1.7 GB/s (size pass 1.1 GB/s, stored copy 5 GB/s), bfloat16 ratio 1.450 " \
           "(sends 69%)" in p.reason
    assert p.reason.startswith("compressed reduce_scatter+all_gather, modelled ") and "\n" not in p.reason
    assert strategy.last_plans(clear=True)[-1] == p and strategy.last_plans() == []
    full = profile.Link(size=2, latency=3e-4, bandwidth=1.6e9, consensus=1e-4, reduce_latency=4e-3,
                        reduce_bandwidth=1.3e9)
    strategy.install(dataclasses.replace(MEASURED, links=(("data", full),)))
    p = plan("all_gather", 1 << 20, BF16, ("data",), 2)
    assert (p.latency, p.link_bandwidth, p.consensus_latency, p.reduce_latency, p.reduce_bandwidth) == (
        3e-4, 1.6e9, 1e-4, 4e-3, 1.3e9)
    assert "consensus 100 us, transfer 300 us + 1.6 GB/s, codec" in p.reason  # no all-reduce in an all_gather


def test_several_axes_take_the_slowest_link_and_unmeasured_axes_the_default_link():
    strategy.install(MEASURED)
    both = model_for(("model", "data"))
    assert (both.latency, both.link_bandwidth, both.compress_rate) == (1e-3, 50e6, 1.1e9)
    default = strategy.PLATFORM_DEFAULTS["cpu"]
    other = model_for(("expert",), platform="cpu")
    assert (other.latency, other.link_bandwidth) == (default.latency, default.link_bandwidth)
    assert other.compress_rate == 1.1e9 and other.ratio(BF16) == 1.45 and other.ratio(np.float16) == 1.18
    assert other.source == f"link 'expert': {default.source}; codec: autotune"
    # the same measured fast link, installed for every axis ("*")
    strategy.install(dataclasses.replace(MEASURED, links=(("*", FAST),)))
    assert model_for(("expert",)).link_bandwidth == 40e9
    assert model_for(("data",)).link_bandwidth == 50e6  # an axis's own entry wins
    # each figure the slowest of the axes', figure by figure
    a = profile.Link(2, latency=1e-3, bandwidth=1e9, consensus=5e-5, reduce_latency=1e-4, reduce_bandwidth=2e8)
    b = profile.Link(2, latency=1e-4, bandwidth=2e9, consensus=2e-4, reduce_latency=3e-3, reduce_bandwidth=9e8)
    strategy.install(dataclasses.replace(MEASURED, links=(("a", a), ("b", b))))
    assert model_for(("a", "b")).figures() == (1e-3, 1e9, 2e-4, 3e-3, 2e8)


def test_platform_defaults_are_what_an_untuned_process_uses(monkeypatch):
    cpu = plan("psum", 16 << 20, BF16, ("d",), 2, platform="cpu")
    gpu = plan("psum", 16 << 20, BF16, ("d",), 2, platform="cuda")
    assert model_for(("d",), platform="rocm") == strategy.PLATFORM_DEFAULTS["gpu"]
    for backend, family in (("cpu", "cpu"), ("gpu", "gpu")):  # no platform named: the default backend's
        monkeypatch.setattr(jax, "default_backend", lambda backend=backend: backend)
        assert strategy.model_for(("d",)) == strategy.PLATFORM_DEFAULTS[family]
    for p, name in ((cpu, "cpu"), (gpu, "gpu")):
        default = strategy.PLATFORM_DEFAULTS[name]
        assert p.source == default.source and p.source.startswith(f"{name} default (assumed")
        assert (p.latency, p.link_bandwidth, p.compress_rate) == (default.latency, default.link_bandwidth,
                                                                  default.compress_rate)
    # untuned, a 16 MB bf16 psum is not compressed: on CPU it goes rank-ordered
    # without the codec (XLA's all-reduce would move float32), on GPU raw (bf16
    # on the wire) whatever the codec
    assert cpu.name == "uncompressed all_gather+local_reduce" and cpu.widened
    assert gpu.name == "raw all_reduce" and not gpu.widened
    assert not plan("all_to_all", 16 << 20, BF16, ("d",), 2, platform="cuda").compress
    with pytest.raises(ValueError, match="no cost model for platform 'tpu'; expected cpu, cuda, rocm or gpu"):
        plan("psum", 16 << 20, BF16, ("d",), 2, platform="tpu")


def test_the_static_transfer_is_modelled_as_it_runs():
    """A module lowered for CUDA alone moves compressed streams by the static transfer: per sized
    transfer two collectives (the bulk, which carries the spill lengths, and the spill) and no
    consensus, the bulk's bytes at static_fraction of the raw ones, no size pass; the ladder's terms
    elsewhere. The transfer's own capacity (collectives/_transfer.static_capacity) is that fraction
    of the raw bytes."""
    model = dataclasses.replace(strategy.PLATFORM_DEFAULTS["gpu"], latency=30e-6, consensus_latency=50e-6)
    ladder = strategy.modelled_terms("psum", 16 << 20, BF16, 8, model)
    static = strategy.modelled_terms("psum", 16 << 20, BF16, 8, model, static=True)
    for algo, steps in (("reduce_scatter+all_gather", 2), ("all_gather+local_reduce", 1)):
        lt, st = ladder[(True, algo)], static[(True, algo)]
        assert st.fixed == pytest.approx(steps * 2 * 30e-6) and lt.fixed == pytest.approx(steps * 80e-6)
        assert st.size_pass == 0 < lt.size_pass and (st.encode, st.decode) == (lt.encode, lt.decode)
        assert st.wire / lt.wire == pytest.approx(strategy.static_fraction(model, BF16)
                                                  / strategy.wire_fraction(model, BF16))
        assert static[(False, algo)] == ladder[(False, algo)]  # the uncompressed plans do not change
    p = plan("psum", 16 << 20, BF16, ("d",), 8, model, platform="cuda", static=True)
    assert p.terms == static[(p.compress, p.algorithm)]


def test_the_profile_file_is_read_until_figures_are_installed(tmp_path, monkeypatch):
    path = tmp_path / "profile.json"
    monkeypatch.setenv(strategy.PROFILE_ENV, str(path))
    profile.write(dataclasses.replace(MEASURED, ladder=(0.7, 1.0)), path)
    from_file = model_for(("data",))
    assert from_file.source == f"profile {path}" and from_file.ladder == (0.7, 1.0)
    assert plan("psum", 16 << 20, BF16, ("data",), 8).compress
    strategy.install(dataclasses.replace(MEASURED, links=(("data", FAST),)))
    assert model_for(("data",)).link_bandwidth == 40e9  # installed wins over the file
    assert model_for(("other",)).ladder == strategy.DEFAULT_LADDER  # codec part: installed, default ladder
    path.write_text('{"latency": 0.001, "link_bandwidth": 1e6}')  # a version-1 profile
    strategy.uninstall()
    with pytest.raises(ValueError, match=r"profile .*profile.json: not a zipccl_jax profile .*calibrate"):
        model_for(("data",))
    path.write_text(VERSION_2)
    with pytest.raises(profile.OutdatedProfile, match=r"profile .*profile.json: version 2, written by an older "
                                                      r"zipccl_jax .*python -m zipccl_jax calibrate"):
        model_for(("data",))


def test_zipccl_strategy_overrides_the_default_and_a_per_call_strategy_wins(monkeypatch):
    strategy.install(MEASURED)  # the model compresses a 16 MB bf16 psum over "data"
    args = ("psum", 16 << 20, BF16, ("data",), 8)
    monkeypatch.setenv(strategy.STRATEGY_ENV, "raw")
    forced = plan(*args)
    assert not forced.compress and forced.reason.startswith("ZIPCCL_STRATEGY=raw: raw ")
    assert plan(*args, "auto").compress and plan(*args, "compressed").compress
    assert plan(*args, model_for(("data",))).compress
    monkeypatch.setenv(strategy.STRATEGY_ENV, " Compressed ")
    assert plan("psum", 1024, BF16, ("data",), 8).compress
    monkeypatch.setenv(strategy.STRATEGY_ENV, "auto")
    assert plan(*args).compress and not plan("psum", 1024, BF16, ("data",), 8).compress
    monkeypatch.setenv(strategy.STRATEGY_ENV, "always")
    with pytest.raises(ValueError, match=r"\$ZIPCCL_STRATEGY must be one of auto, raw, compressed \(or unset\), "
                                         r"got 'always'"):
        plan(*args)
    assert not plan(*args, "raw").compress  # a per-call strategy never reads the variable


# what zipccl_jax wrote before the per-plan figures (its latency: a loop of tiny all_gathers)
VERSION_2 = ('{"zipccl_jax_profile": 2, "platform": "cpu", "device_kind": "cpu", "codec": {"compress_rate": 1e9, '
             '"decompress_rate": 1e9}, "ratios": {}, "links": {"d": {"size": 2, "latency": 0.004, "bandwidth": 1e9}}}')
V3 = '{"zipccl_jax_profile": 3, "platform": "cpu", "device_kind": "cpu", '
V4 = '{"zipccl_jax_profile": 4, "platform": "cpu", "device_kind": "cpu", '


@pytest.mark.parametrize("text,problem", [
    ("{", "is not valid JSON"),
    ('{"zipccl_jax_profile": 5}', "version 5, this zipccl_jax reads version 4"),
    (VERSION_2, "version 2, written by an older zipccl_jax whose link figures this one does not use"),
    (V3 + '"codec": {}, "ratios": {}, "links": {}}', "version 3, written by an older zipccl_jax whose figures lack "
                                                      "the size pass, the copy rate and the plans measured in situ"),
    (V4 + '"codec": {"compress_rate": 1e9, "decompress_rate": 1e9, "size_rate": 0}, "ratios": {}, "links": {}}',
     "size_rate must be a finite number > 0, got 0"),
    (V4 + '"codec": {"compress_rate": 1e9, "decompress_rate": 1e9}, "ratios": {}, "links": {}, "measured": '
     '[{"collective": "psum", "axes": ["d"], "axis_size": 2, "dtype": "bfloat16", "bytes": 8, "seconds": {"x": -1}}]}',
     "measured.0. seconds of 'x' must be a finite number > 0, got -1"),
    (V4 + '"codec": {"compress_rate": 1e9, "decompress_rate": 1e9}, "ratios": {}, "links": {}, "measured": '
     '[{"collective": "psum", "axes": "d", "axis_size": 2, "dtype": "bfloat16", "bytes": 8, "seconds": {}}]}',
     "measured.0.: axes must be a list of axis names, got 'd'"),
    (V4 + '"codec": {}, "ratios": {}, "links": {}}', "codec: missing key.s. compress_rate, decompress_rate"),
    ('{"zipccl_jax_profile": 4, "platform": "tpu", "device_kind": "", "codec": {}, "ratios": {}, "links": {}}',
     "platform 'tpu', expected one of cpu, gpu"),
    (V4 + '"codec": {"compress_rate": 1e9}, "ratios": {}, "links": {}, "bandwith": 1}', "unknown key.s. bandwith"),
    (V4 + '"codec": {"compress_rate": 1e9, "decompress_rate": 1e9}, "ratios": {}, '
     '"links": {"d": {"size": 2, "latency": 0, "bandwidth": -5}}}', "link 'd' bandwidth must be a finite number > 0, got -5"),
    (V4 + '"codec": {"compress_rate": 1e9, "decompress_rate": 1e9}, "ratios": {}, '
     '"links": {"d": {"size": 2, "latency": 0, "bandwidth": 5, "consensus": -1}}}',
     "link 'd' consensus must be a finite number >= 0, got -1"),
    (V4 + '"codec": {"compress_rate": 1e9, "decompress_rate": 1e9}, "ratios": {}, '
     '"links": {"d": {"size": 2, "latency": 0, "bandwidth": 5, "reduce_bandwidth": 0}}}',
     "link 'd' reduce_bandwidth must be a finite number > 0, got 0"),
    (V4 + '"codec": {"compress_rate": 1e9, "decompress_rate": 1e9}, "ratios": {}, '
     '"links": {"d": {"size": 2, "latency": 0, "bandwidth": 5, "pmax": 1}}}', "link 'd': unknown key.s. pmax"),
])
def test_a_malformed_profile_is_an_error_naming_the_file_and_the_problem(tmp_path, text, problem):
    path = tmp_path / "p.json"
    path.write_text(text)
    with pytest.raises(ValueError, match=f"profile {path}.*{problem}"):
        profile.read(path)


def test_a_profile_round_trips_exactly(tmp_path):
    full = profile.Link(size=2, latency=3.1e-4, bandwidth=1.6e9, consensus=9.87654321e-5, reduce_latency=4.01e-3,
                        reduce_bandwidth=1.3e9)
    timed = profile.Measured("psum", ("data",), 8, "bfloat16", 936_448,
                             tuple(zip(strategy.plan_names("psum"), (4.1e-3, 2.5e-3, 1.23456789e-3, 9e-3, 7e-3))))
    odd = dataclasses.replace(MEASURED, compress_rate=1234567.0987654321, ladder=(0.6, 0.75, 1.0),
                              links=(("data", SLOW), ("model", full)),  # a link without the new figures, one with
                              size_rate=3.3e9, copy_rate=7.77e9, measured=(timed,))
    path = profile.write(odd, tmp_path / "sub" / "p.json")
    assert profile.read(path) == odd
    doc = json.loads(path.read_text())
    assert doc["zipccl_jax_profile"] == 4 and doc["links"]["data"] == {"size": 8, "latency": 1e-3, "bandwidth": 50e6}
    assert doc["links"]["model"]["consensus"] == 9.87654321e-5
    assert doc["codec"]["size_rate"] == 3.3e9 and doc["measured"][0]["seconds"]["uncompressed all_gather+local_reduce"] \
        == 1.23456789e-3
    bare = dataclasses.replace(MEASURED, links=())  # no optional figure: none written, none read back
    assert profile.read(profile.write(bare, tmp_path / "bare.json")) == bare
    assert "measured" in json.loads((tmp_path / "bare.json").read_text()) and bare.size_rate is None


def test_the_rank_ordered_plans_without_the_codec_are_candidates_named_apart_from_raw():
    args = ("psum", 936_448, BF16, ("data",), 2, UNSHAPED)
    assert strategy.plan_names("psum") == ("raw all_reduce", "uncompressed reduce_scatter+all_gather",
                                           "uncompressed all_gather+local_reduce", "compressed reduce_scatter+all_gather",
                                           "compressed all_gather+local_reduce")
    assert strategy.plan_names("all_to_all") == ("raw direct", "compressed direct")
    chosen = plan(*args, platform="cpu")
    assert chosen.name == "uncompressed all_gather+local_reduce" and not chosen.compress
    # psum_algorithm applies to the rank-ordered plans with or without the codec
    rs = plan(*args[:5], dataclasses.replace(UNSHAPED, psum_algorithm="reduce_scatter+all_gather"),
                       platform="cpu")
    assert rs.name == "uncompressed reduce_scatter+all_gather"
    # "raw" is XLA's collective, never the rank-ordered plans; "compressed" the codec's plans
    assert plan(*args[:5], "raw", platform="cpu").name == "raw all_reduce"
    assert plan(*args[:5], "compressed", platform="cpu").name == "compressed all_gather+local_reduce"
    # a pinned plan runs whatever the figures say, and says so
    pinned = plan(*args[:5], strategy.Pinned("compressed reduce_scatter+all_gather"), platform="cpu")
    assert pinned.name == "compressed reduce_scatter+all_gather" and pinned.reason.startswith(
        "strategy=Pinned('compressed reduce_scatter+all_gather'): compressed reduce_scatter+all_gather, modelled ")
    assert plan("psum", 64, np.int32, ("data",), 2, strategy.Pinned("compressed all_gather+local_reduce")
                         ).name == "raw all_reduce"  # the codec takes no int32
    with pytest.raises(ValueError, match="all_gather has no plan 'uncompressed all_gather.local_reduce'; its plans: "
                                         "raw direct, compressed direct"):
        plan("all_gather", 64, BF16, ("data",), 2, strategy.Pinned("uncompressed all_gather+local_reduce"))


def timed(nbytes, seconds, axes=("data",), size=2, dtype="bfloat16"):
    return profile.Measured("psum", axes, size, dtype, nbytes, tuple(zip(strategy.plan_names("psum"), seconds)))


def test_times_measured_in_situ_decide_matching_calls_and_the_model_the_others():
    ms = 1e-3
    # measured: XLA's all-reduce fastest, then the compressed all-gather; the model (UNSHAPED-like figures
    # installed) prefers the uncompressed all-gather
    link = profile.Link(2, latency=0.3e-3, bandwidth=1.6e9, consensus=0.1e-3, reduce_latency=4e-3,
                        reduce_bandwidth=1.3e9)
    strategy.install(dataclasses.replace(MEASURED, links=(("data", link),), compress_rate=1.8e9, decompress_rate=4e9,
                                         measured=(timed(936_448, (3 * ms, 5 * ms, 6 * ms, 4 * ms, 3.5 * ms)),)))
    p = plan("psum", 936_448, BF16, ("data",), 2, platform="cpu")
    assert p.name == "raw all_reduce" and p.measured_seconds == 3 * ms
    assert dict(p.measured)["compressed all_gather+local_reduce"] == 3.5 * ms
    assert p.reason.startswith("raw all_reduce, measured in situ (autotune) 3 ms vs compressed all_gather+local_reduce "
                               "3.5 ms, compressed reduce_scatter+all_gather 4 ms, uncompressed reduce_scatter+"
                               "all_gather 5 ms, uncompressed all_gather+local_reduce 6 ms (modelled 5.")
    # forced to compress: the faster compressed plan as measured
    assert plan("psum", 936_448, BF16, ("data",), 2, "compressed").name == "compressed all_gather+local_reduce"
    # other bytes, another axis or axis size, another dtype, another collective, a CostModel per call: the model
    model_choice = "uncompressed all_gather+local_reduce"
    for args in [("psum", 936_450, BF16, ("data",), 2), ("psum", 936_448, BF16, ("model",), 2),
                 ("psum", 936_448, BF16, ("data",), 4), ("psum", 936_448, np.float16, ("data",), 2),
                 ("psum", 936_448, BF16, ("data", "model"), 2)]:
        other = plan(*args, platform="cpu")
        assert other.measured == () and "modelled" in other.reason and "in situ" not in other.reason, args
    assert plan("psum", 936_448, BF16, ("data",), 2, platform="cpu").measured != ()
    assert plan("psum", 936_448, BF16, ("data",), 2, model_for(("data",)),
                         platform="cpu").name == model_choice
    assert plan("all_gather", 936_448, BF16, ("data",), 2).measured == ()
    # equal times: the first in plan_names' order; a measurement over "*" (autotune(mesh=None)) stands for any axis
    strategy.install(dataclasses.replace(MEASURED, measured=(timed(4096, (2 * ms, 1 * ms, 1 * ms, 1 * ms, 1 * ms),
                                                                   axes=("*",), size=8),)))
    tie = plan("psum", 4096, BF16, ("expert",), 8)
    assert tie.name == "uncompressed reduce_scatter+all_gather" and "(autotune)" in tie.reason
    strategy.uninstall()
    assert plan("psum", 4096, BF16, ("expert",), 8).measured == ()
