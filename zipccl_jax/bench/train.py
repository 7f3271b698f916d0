"""Training-step benchmark of the LM (zipccl_jax.bench.lm): lax.psum vs zip_psum.

    python -m zipccl_jax bench train [--steps N] [--d-model D] ...

On the local devices (the GPUs, or 8 virtual CPU devices where there are
fewer than two: bench/devices.py; `--platform` picks) `run()` trains the
same model from the same initial parameters on the same batches once per
gradient sync and reports, per sync: the step time (median after warm-up),
the communication time (the jitted gradient sync alone, on gradients
captured from a real step, median; the syncs are timed in turn, one call of
each per round, each call after a barrier) next to the cost model's
prediction for the plan it ran and, where autotune timed the plans in situ,
its time there, the bytes each device sends (zipccl's Stats of the timed
syncs), the plan it ran, and whether the losses are bit-identical to
zip_psum's compress=False run (which runs the default's plan without the
codec; a sync that sums another way, XLA's all-reduce against the
rank-ordered plans, says so). The syncs: lax.psum;
zip_psum with the default strategy (what the installed figures, a profile or
the platform default decide); the same with the codec off (compress=False);
and zip_psum pinned to strategy="compressed". The network benchmark (net.py)
runs `measure()` in one process per network namespace, after autotune.
"""

from __future__ import annotations

import dataclasses
import time

import jax
import numpy as np
from jax.experimental import multihost_utils

from .. import strategy as zipccl_strategy
from . import report
from .devices import choose, describe, wire_ratio

# label -> (lm sync, compress, strategy)
SYNCS = {"lax.psum": ("lax", True, None), "zip_psum": ("zip", True, None),
         "zip_psum compress=False": ("zip", False, None), "zip_psum strategy=compressed": ("zip", True, "compressed")}
DEFAULT, REFERENCE, COMPRESSED = "zip_psum", "zip_psum compress=False", "zip_psum strategy=compressed"


def _median_ms(times) -> float:
    return float(np.median(times)) * 1e3


def _local(a) -> np.ndarray:
    return np.asarray(a.addressable_data(0))


def measure(mesh, cfg, steps: int, warmup: int, repeat: int, sent_bytes=None, progress=None, tune=None) -> dict:
    """Per sync label: step_ms, comm_ms (medians), losses; plus compute_ms,
    zipccl's wire bytes and plans, and, with `sent_bytes()` (this process's
    link counter), the bytes per sync measured on the link. `tune(grads)`,
    if given, runs before any sync is compiled, on a step's gradients; what it
    returns is kept as result["tune"]."""
    from . import lm

    n = mesh.size
    tokens = lm.load_tokens()
    host_params = lm.init_params(jax.random.key(0), cfg)
    params0, opt0 = lm.replicate(mesh, (host_params, lm.init_opt(host_params)))
    batches = [lm.shard_batch(mesh, lm.batch_at(tokens, cfg, s, n)) for s in range(warmup + steps)]
    grads_fn = lm.make_grads(mesh, cfg)
    jax.block_until_ready(grads_fn(params0, batches[0]))
    compute = []
    for b in batches[warmup:]:
        t = time.perf_counter()
        jax.block_until_ready(grads_fn(params0, b))
        compute.append(time.perf_counter() - t)
    result = {"compute_ms": _median_ms(compute), "syncs": {}}
    if tune:
        result["tune"] = tune(grads_fn(params0, batches[0])[1])
    timed = {}
    for label, (sync, compress, strategy) in SYNCS.items():
        if progress:
            progress(label)
        result["syncs"][label], timed[label] = _train_sync(mesh, cfg, lm, grads_fn, (sync, compress, strategy),
                                                           params0, opt0, batches, warmup)
    _time_syncs(result["syncs"], timed, repeat, sent_bytes)
    return result


def _barrier_then(read):
    """read() once every process has finished what it started: then every
    byte of this process's earlier syncs has left it (each peer received it
    before entering the barrier), and its link counter counts them all."""
    multihost_utils.sync_global_devices("zipccl_jax.bench.train: link counter")
    return read()


def _train_sync(mesh, cfg, lm, grads_fn, how, params, opt, batches, warmup):
    """Trains with one sync: (its result so far: step_ms, losses, plans;
    (the jitted sync alone, the gradients of the last step))."""
    sync, compress, strategy = how
    step = lm.make_step(mesh, cfg, sync=sync, compress=compress, strategy=strategy)
    losses, times = [], []
    for s, b in enumerate(batches):
        last_params = params
        t = time.perf_counter()
        params, opt, loss, *stats = step(params, opt, b)
        losses.append(float(_local(jax.block_until_ready(loss))))
        if s >= warmup:
            times.append(time.perf_counter() - t)
    # the gradients the last step synced (recomputed: their bits, and so the
    # rung sent, can differ from the step's in the last place)
    _, grads = grads_fn(last_params, batches[-1])
    sync_fn = lm.make_sync(mesh, cfg, sync=sync, compress=compress, strategy=strategy, with_stats=bool(stats))
    zipccl_strategy.last_plans(clear=True)
    jax.block_until_ready(sync_fn(grads))  # compiles: the plans are made while it is lowered
    plans = zipccl_strategy.last_plans(clear=True)
    out = {"step_ms": _median_ms(times), "losses": losses}
    if stats:
        out["plans"] = [_plan_record(p, compress) for p in plans]
    return out, (sync_fn, grads)


def _plan_record(p, compress: bool) -> dict:
    """What a sync's plan ran (compress=False turns a compressed plan into its
    uncompressed variant), why, the model's time for it and autotune's
    in-situ time of it where one was measured."""
    ran = zipccl_strategy.plan_name(p.compress and compress, p.algorithm)
    measured = dict(p.measured).get(ran)
    return {"compress": p.compress, "algorithm": p.algorithm, "ran": ran, "reason": p.reason,
            "predicted_ms": zipccl_strategy.modelled_time(p, codec=compress) * 1e3,
            "in_situ_ms": None if measured is None else measured * 1e3}


def _time_syncs(results: dict, timed: dict, repeat: int, sent_bytes) -> None:
    """Times the syncs in turn, one call of each per round (so a change in
    the machine's load falls on all of them alike; each round starts one
    sync later, so no sync always follows the same one), after an untimed
    round, every call started after a barrier: adds comm_ms (median) and
    its quartiles, zipccl's wire bytes of a timed call and, with sent_bytes, the link bytes
    per call. The link counter is read only after a barrier: a sync ends on
    this process once it has received, while what it sent may still be
    queued (a shaped link queues ~50 ms)."""
    read = sent_bytes or (lambda: 0)
    labels = list(timed)
    comm = {label: [] for label in labels}
    link = dict.fromkeys(labels, 0)
    for label in labels:  # untimed: each sync's first call in this rotation
        _barrier_then(read)
        jax.block_until_ready(timed[label][0](timed[label][1]))
    for r in range(repeat):
        for label in labels[r % len(labels):] + labels[:r % len(labels)]:
            sync_fn, grads = timed[label]
            before = _barrier_then(read)
            t = time.perf_counter()
            synced = jax.block_until_ready(sync_fn(grads))
            comm[label].append(time.perf_counter() - t)
            link[label] += _barrier_then(read) - before
            if "plans" in results[label]:  # zip_psum's own count of what this device sent
                sync_stats = synced[1]
                results[label]["wire_bytes"] = float(_local(sync_stats.wire_bytes))
                results[label]["raw_bytes"] = float(_local(sync_stats.raw_bytes))
    for label in labels:
        results[label]["comm_ms"] = _median_ms(comm[label])
        results[label]["comm_quartiles_ms"] = [float(q) * 1e3 for q in np.percentile(comm[label], [25, 75])]
        if sent_bytes:
            results[label]["link_bytes"] = link[label] / repeat


def losses_identical(a: list[float], b: list[float]) -> bool:
    return np.array_equal(np.asarray(a, np.float32).view(np.uint32), np.asarray(b, np.float32).view(np.uint32))


def summary_rows(result: dict, **key) -> list[dict]:
    """One table row per sync; speedups against lax.psum."""
    syncs = result["syncs"]
    base = syncs["lax.psum"]
    rows = []
    for label, s in syncs.items():
        quartiles = s.get("comm_quartiles_ms")
        row = {**key, "sync": label, "step ms": s["step_ms"], "comm ms": s["comm_ms"],
               "comm p25-p75": "-" if quartiles is None else f"{quartiles[0]:.3g}-{quartiles[1]:.3g}",
               "predicted ms": predicted_ms(s),
               "in situ ms": in_situ_ms(s), "comm speedup vs lax": base["comm_ms"] / s["comm_ms"],
               "step speedup vs lax": base["step_ms"] / s["step_ms"]}
        if "link_bytes" in s:
            row["link bytes/sync"] = int(s["link_bytes"])
        row["zipccl wire B"] = int(s["wire_bytes"]) if "wire_bytes" in s else "-"
        row["plan"] = plan_label(s)
        # the codec changes no bit; XLA's all-reduce and the rank-ordered plans sum differently (README)
        same_sum = "plans" not in s or summation(s) == summation(syncs[REFERENCE])
        row["losses = compress=False"] = losses_identical(s["losses"], syncs[REFERENCE]["losses"]) if same_sum \
            else "other sum"
        rows.append(row)
    return rows


def predicted_ms(sync: dict):
    """What the cost model predicted for a zip_psum sync (its plans' modelled
    times, summed), "-" for lax: a diagnostic next to the measured time."""
    plans = sync.get("plans")
    return sum(p["predicted_ms"] for p in plans) if plans else "-"


def in_situ_ms(sync: dict):
    """What autotune measured in situ for the plans a zip_psum sync ran
    (summed), "-" where any was not measured (or for lax)."""
    plans = sync.get("plans")
    return sum(p["in_situ_ms"] for p in plans) if plans and all(p["in_situ_ms"] is not None for p in plans) else "-"


def plan_label(sync: dict) -> str:
    """The plans a zip_psum sync ran (strategy.plan_name: "raw all_reduce",
    "uncompressed ...", "compressed ..."), "-" for lax."""
    return ", ".join(sorted({p["ran"] for p in sync.get("plans") or []})) or "-"


def summation(sync: dict) -> str:
    """"XLA" where a sync's sum is XLA's all-reduce, "rank-ordered" where the
    plans sum in rank order (with or without the codec: the same bits)."""
    return ", ".join(sorted({"XLA" if p["algorithm"] == "all_reduce" else "rank-ordered" for p in sync["plans"]}))


def wire_line(result: dict) -> str:
    z = result["syncs"][COMPRESSED]
    return (f"zipccl wire bytes per device per step: {z['wire_bytes']:,.0f} compressed vs {z['raw_bytes']:,.0f} "
            f"raw ({wire_ratio(z['raw_bytes'], z['wire_bytes'])}); compute (forward+backward) "
            f"{result['compute_ms']:.1f} ms")


def config_from_args(args):
    from . import lm

    fields = {f.name for f in dataclasses.fields(lm.Config)}
    overrides = {k: v for k, v in vars(args).items() if k in fields and v is not None}
    return lm.Config(**overrides)


def run(args) -> list[dict]:
    """`bench train` on the local devices: prints progress and the table."""
    cfg = config_from_args(args)
    platform = getattr(args, "platform", None)
    devices, note = choose(need=1 if platform else 2, platform=platform)
    mesh = jax.make_mesh((len(devices),), ("data",), devices=devices)
    progress = report.Progress(len(SYNCS))
    def started(label):
        if progress.done:
            progress.finish()
        progress.start(f"train {label}")
    result = measure(mesh, cfg, args.steps, args.warmup, args.repeat, progress=started)
    progress.finish()
    print(f"## Training step on {describe(devices)}: {cfg}\n")
    if note:
        print(f"({note})\n")
    print(wire_line(result) + "\n")
    rows = summary_rows(result)
    print(report.table(rows))
    if args.json:
        report.save_json(args.json, config=dataclasses.asdict(cfg), devices=len(devices),
                         platform=devices[0].platform, note=note, result=result)
    if args.plot:
        report.bar_plot(args.plot, f"LM step on {len(devices)} x {devices[0].platform}", ["step", "comm"],
                        {r["sync"]: [r["step ms"], r["comm ms"]] for r in rows}, "ms (median)")
    return rows
