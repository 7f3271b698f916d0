"""`python -m zipccl_jax calibrate`: measures the cost model on this machine.

Codec rates come from compressing and decompressing Gaussian bf16 on one
device; latency and link bandwidth from all_gathers over all local devices
(tiny ones for latency, 16 MB per device for bandwidth); ratios from the codec
on Gaussian data of each dtype. The profile is JSON: edit it to describe a
network the calibration cannot see (for example a slower link between hosts).
"""

from __future__ import annotations

import dataclasses
import time
from pathlib import Path

import jax
import jax.numpy as jnp
import numpy as np
from jax import lax
from jax.sharding import NamedSharding
from jax.sharding import PartitionSpec as P

from . import ops, strategy
from .bench import data as bench_data


def _median(fn, repeat=5) -> float:
    jax.block_until_ready(fn())
    times = []
    for _ in range(repeat):
        t = time.perf_counter()
        jax.block_until_ready(fn())
        times.append(time.perf_counter() - t)
    return float(np.median(times))


def measure(codec_elements: int = 1 << 22, link_elements: int = 4 << 20) -> strategy.CostModel:
    model = strategy.CostModel()
    x = jnp.asarray(bench_data.gaussian(codec_elements, "bfloat16"))
    compress = jax.jit(ops.compress)
    c = compress(x)
    decompress = jax.jit(ops.decompress)
    fields = {
        "compress_rate": x.nbytes / _median(lambda: compress(x)),
        "decompress_rate": x.nbytes / _median(lambda: decompress(c)),
        "ratios": tuple((dt, round(float(ops.compress(jnp.asarray(bench_data.gaussian(1 << 20, dt))).ratio()), 4))
                        for dt in ("bfloat16", "float16", "float32")),
    }
    n = jax.device_count()
    if n > 1:
        mesh = jax.make_mesh((n,), ("d",))

        def gather_time(elements):
            xs = jax.device_put(jnp.zeros((n, elements), jnp.float32), NamedSharding(mesh, P("d")))
            f = jax.jit(jax.shard_map(lambda a: lax.all_gather(a, "d"), mesh=mesh, in_specs=P("d"),
                                      out_specs=P("d"), check_vma=False))
            return _median(lambda: f(xs), repeat=10)

        latency = gather_time(1)
        fields["latency"] = latency
        fields["link_bandwidth"] = link_elements * 4 * (n - 1) / max(gather_time(link_elements) - latency, 1e-9)
    return dataclasses.replace(model, **fields)


def main(path: Path | None = None) -> None:
    model = measure()
    where = strategy.save_model(model, path)
    print(f"devices: {jax.device_count()} x {jax.devices()[0].platform}")
    for k, v in dataclasses.asdict(model).items():
        print(f"  {k}: {v}")
    print(f"profile written to {where} (edit it, or set $ZIPCCL_PROFILE to use another)")
