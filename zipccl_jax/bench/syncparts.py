"""The compressed gradient sync against its own transfer, over bench net's
shaped link: what the library adds to the bytes' time, and how steady the
transfer itself is.

    sudo python -m zipccl_jax.bench.syncparts --rate 400mbit,200mbit --repeat 40

Two processes (one per namespace, one CPU device each, gloo, as `bench net`)
take the LM's gradients of its first step (the bucket `bench net` syncs) and
time, in turn, each call after a barrier: zip_psum's compressed and
uncompressed all_gather+local_reduce plans (strategy.Pinned) and XLA's
all_gather of as many bytes as each of them sends (zip_psum's Stats). Both
processes run on one host, so their perf_counter clocks are the same clock:
per call the tool also reads how far apart the two processes started (the
barrier's skew) and the time from the later start to the later end. Times
are the slower process's median, as in `bench net`. docs/BENCHMARKS.md has
its figures.
"""

from __future__ import annotations

import argparse
import dataclasses
import json
import sys
import tempfile
import time

import numpy as np

from . import lm, net, netns, report

ALGORITHM = "all_gather+local_reduce"
PLANS = (f"compressed {ALGORITHM}", f"uncompressed {ALGORITHM}")


def labels(result: dict) -> list[str]:
    """The timed calls: the two plans, then the all_gathers of their bytes."""
    return [*PLANS, *(f"all_gather {nbytes:,} B" for nbytes in result["wire_bytes"])]


def worker(spec: dict) -> None:
    import jax
    from jax.experimental import multihost_utils
    from jax.sharding import NamedSharding
    from jax.sharding import PartitionSpec as P

    i = spec["process"]
    jax.distributed.initialize(spec["coordinator"], num_processes=2, process_id=i, initialization_timeout=60)
    from .. import strategy

    cfg = lm.Config(**spec["config"])
    mesh = jax.make_mesh((2,), ("data",))
    params = lm.replicate(mesh, lm.init_params(jax.random.key(0), cfg))
    batch = lm.shard_batch(mesh, lm.batch_at(lm.load_tokens(), cfg, 0, 2))
    grads = lm.make_grads(mesh, cfg)(params, batch)[1]
    calls, wire = [], []
    for name in PLANS:
        sync = lm.make_sync(mesh, cfg, strategy=strategy.Pinned(name), with_stats=True)
        stats = jax.block_until_ready(sync(grads))[1]
        wire.append(int(np.asarray(stats.wire_bytes.addressable_data(0))))
        calls.append((sync, grads))
    gather = jax.jit(jax.shard_map(lambda x: jax.lax.all_gather(x[0], "data")[None], mesh=mesh,
                                   in_specs=P("data"), out_specs=P("data")))
    for nbytes in wire:
        local = np.full((1, nbytes), i, np.uint8)
        calls.append((gather, jax.make_array_from_process_local_data(NamedSharding(mesh, P("data")), local)))
    for f, x in calls:  # untimed: compiles, connections
        jax.block_until_ready(f(x))
    starts, ends = np.zeros((spec["repeat"], len(calls))), np.zeros((spec["repeat"], len(calls)))
    for r in range(spec["repeat"]):
        for j in np.roll(np.arange(len(calls)), -r):  # no call always follows the same one
            f, x = calls[j]
            multihost_utils.sync_global_devices("zipccl_jax.bench.syncparts")
            starts[r, j] = time.perf_counter()
            jax.block_until_ready(f(x))
            ends[r, j] = time.perf_counter()
    print(net.RESULT_TAG + json.dumps({"wire_bytes": wire, "starts": starts.tolist(), "ends": ends.tolist()}),
          flush=True)
    jax.distributed.shutdown()


def combine(results: list[dict]) -> list[dict]:
    """Per call: the slower process's median and its quartiles (ms), the median
    start skew between the processes and the median time from the later
    start to the later end (one host: one clock)."""
    if results[0]["wire_bytes"] != results[1]["wire_bytes"]:
        raise RuntimeError("syncparts: the processes sent different byte counts")
    starts = np.array([r["starts"] for r in results]) * 1e3  # [process, round, call]
    ends = np.array([r["ends"] for r in results]) * 1e3
    took = ends - starts
    span = ends.max(axis=0) - starts.max(axis=0)
    rows = []
    for j, label in enumerate(labels(results[0])):
        slower = int(np.argmax(np.median(took[:, :, j], axis=1)))
        p25, p50, p75 = np.percentile(took[slower, :, j], [25, 50, 75])
        rows.append({"call": label, "ms": p50, "p25-p75": f"{p25:.3g}-{p75:.3g}",
                     "start skew ms": float(np.median(np.abs(starts[1, :, j] - starts[0, :, j]))),
                     "later start to later end ms": float(np.median(span[:, j]))})
    return rows


def run(rates: list[str], cfg: lm.Config, repeat: int, timeout: float = 600,
        burst_ms: float = 1.0) -> dict[str, list[dict]]:
    net.preflight(rates, "syncparts")
    spec = {"coordinator": f"{netns.SUBNET}.1:{net.PORT}", "config": dataclasses.asdict(cfg), "repeat": repeat}
    out = {}
    with netns.Network(2) as network, tempfile.TemporaryDirectory() as cwd:
        for rate in rates:
            network.set_rate(rate, burst_ms)
            out[rate] = combine(net.launch(network, spec, cwd, timeout, module="zipccl_jax.bench.syncparts"))
    return out


def main(argv=None) -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--rate", default="400mbit,200mbit")
    parser.add_argument("--repeat", type=int, default=40)
    parser.add_argument("--burst-ms", type=float, default=1.0,
                        help="each link's tbf bucket, in ms of its rate (bench net's: 1)")
    args = parser.parse_args(argv)
    for rate, rows in run(args.rate.split(","), lm.Config(), args.repeat, burst_ms=args.burst_ms).items():
        print(f"\n{rate}:\n")
        print(report.table(rows))


if __name__ == "__main__":
    if sys.argv[1:2] == ["worker"]:
        worker(json.loads(sys.argv[2]))
    else:
        main()
