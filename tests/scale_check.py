"""Scale checks, each in its own process so its peak memory is its own
(docs/RELIABILITY.md records their output):

    python tests/scale_check.py stream ELEMENTS       # one bf16 stream, compress + decompress
    python tests/scale_check.py chunks ELEMENTS K     # bf16 in K streams (compress_chunks)
    python tests/scale_check.py leaves LEAVES         # zip_psum of a pytree vs lax.psum, 8 devices
    python tests/scale_check.py memory                # compiled temp bytes of each collective vs lax's
    python tests/scale_check.py transfer [REPEAT]     # CPU cost of compiling and running each collective

Each prints one line of `key=value` figures and exits non-zero on a wrong bit.
"""

import functools
import os
import resource
import sys
import time

os.environ.setdefault("XLA_FLAGS", "--xla_force_host_platform_device_count=8")

import jax  # noqa: E402
import jax.numpy as jnp  # noqa: E402
import numpy as np  # noqa: E402
from jax import lax  # noqa: E402
from jax.sharding import NamedSharding  # noqa: E402
from jax.sharding import PartitionSpec as P  # noqa: E402

import zipccl_jax as zc  # noqa: E402
from zipccl_jax import reference  # noqa: E402


def peak_rss_gb() -> float:
    return resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 2**20


def timed(fn, *args):
    start = time.perf_counter()
    out = jax.block_until_ready(fn(*args))
    return out, time.perf_counter() - start


@functools.partial(jax.jit, static_argnums=1)
def make_bf16(key, n):
    """n bf16 values: a Gaussian block of 2^20 repeated, with the two low mantissa
    bits of each element set from a hash of its index, so the data compresses
    like Gaussians, no two blocks are alike (a misplaced block cannot go unseen)
    and generating it costs no memory beyond its own 2n bytes."""
    base = lax.bitcast_convert_type(jax.random.normal(key, (1 << 20,), jnp.bfloat16), jnp.uint16)
    tiled = jnp.broadcast_to(base, (-(-n // (1 << 20)), 1 << 20)).reshape(-1)[:n]
    noise = ((lax.iota(jnp.uint32, n) * jnp.uint32(2654435761)) >> 30).astype(jnp.uint16)
    return lax.bitcast_convert_type(tiled ^ noise, jnp.bfloat16)


@jax.jit
def same_bits(a, b):
    return jnp.all(lax.bitcast_convert_type(a, jnp.uint16) == lax.bitcast_convert_type(b, jnp.uint16))


def codec(elements: int, chunks: int) -> str:
    x = jax.block_until_ready(make_bf16(jax.random.key(0), elements // chunks * chunks))
    encode = jax.jit(lambda a: zc.compress_chunks(a, chunks) if chunks > 1 else zc.compress(a)).lower(x).compile()
    rss_before = peak_rss_gb()
    c, t_compress = timed(encode, x)
    decode = jax.jit(zc.decompress).lower(c).compile()
    y, t_decompress = timed(decode, c)
    ok = bool(same_bits(x, y.reshape(-1)))
    stream_bytes = int(np.sum(np.asarray(c.nbytes, np.int64)))
    return (f"ok={ok} elements={x.size} raw_bytes={x.size * 2} streams={chunks} stream_bytes={stream_bytes} "
            f"ratio={x.size * 2 / stream_bytes:.4f} compress_s={t_compress:.2f} decompress_s={t_decompress:.2f} "
            f"peak_rss_before_codec_gb={rss_before:.2f} peak_rss_gb={peak_rss_gb():.2f}")


def leaves(count: int) -> str:
    """zip_psum and lax.psum of `count` small leaves of mixed sizes and dtypes on 8 devices:
    trace+compile time (wall and CPU seconds of this process), compiled temp memory,
    process peak RSS, and the bits of the result."""
    mesh = jax.make_mesh((8,), ("d",), devices=jax.devices("cpu")[:8])
    rng = np.random.default_rng(0)
    dtypes = [np.dtype("float32"), np.dtype(jnp.bfloat16)]
    tree = [rng.standard_normal((8, 1 + i % 97, 3), np.float32).astype(dtypes[i % 2]) for i in range(count)]
    args = jax.device_put(tree, NamedSharding(mesh, P("d")))
    results, lines = {}, []
    for name, fn in {"lax": lambda t: lax.psum([a.astype(jnp.float32) for a in t], "d"),
                     "zip": lambda t: zc.zip_psum(t, "d", strategy="compressed")}.items():
        f = jax.jit(jax.shard_map(lambda t: [a[None] for a in fn([a[0] for a in t])], mesh=mesh,
                                  in_specs=P("d"), out_specs=P("d")))
        start, cpu_start = time.perf_counter(), time.process_time()
        compiled = f.lower(args).compile()
        t_compile, cpu_compile = time.perf_counter() - start, time.process_time() - cpu_start
        out, t_run = timed(compiled, args)
        out, t_run = timed(compiled, args)  # the second call: no first-touch costs
        temp = compiled.memory_analysis().temp_size_in_bytes
        results[name] = out
        lines.append(f"{name}_compile_s={t_compile:.2f} {name}_compile_cpu_s={cpu_compile:.2f} {name}_run_s={t_run:.3f} {name}_temp_mb={temp / 2**20:.1f} "
                     f"peak_rss_after_{name}_gb={peak_rss_gb():.2f}")
    # the rank-ordered float32 sum of each leaf, rounded once: bit for bit
    ok = all(np.asarray(z)[0].tobytes() == reference.accumulate(list(t), t.dtype).tobytes()
             for z, t in zip(results["zip"], tree))
    close = all(np.allclose(np.asarray(z)[0].astype(np.float32), np.asarray(r)[0], rtol=1e-2, atol=1e-2)
                for z, r in zip(results["zip"], results["lax"]))
    payload = sum(t[0].nbytes for t in tree)
    return f"ok={ok and close} leaves={count} bytes_per_device={payload} " + " ".join(lines)


def memory() -> str:
    """Per device: temp bytes of each compressed collective and of lax's, over the message."""
    from test_memory import COLLECTIVES, temp_bytes

    rows = []
    for dtype in (jnp.bfloat16, jnp.float32):
        for m in (1 << 16, 1 << 20, 1 << 22):
            message = m * jnp.dtype(dtype).itemsize
            for name, (ours, theirs, _, upper) in COLLECTIVES.items():
                zip_temp, lax_temp = temp_bytes(ours, name, m, dtype), temp_bytes(theirs, name, m, dtype)
                rows.append(f"| {jnp.dtype(dtype).name} | {message:,} | {name} | {zip_temp:,} | "
                            f"{zip_temp / message:.3f}x | {upper:g}x | {lax_temp / message:.2f}x |")
    return "ok=True\n" + "\n".join(rows)


def transfer(repeat: int) -> str:
    """Per compressed collective (strategy="compressed", 8 devices, 2 MiB of Gaussian bf16 each):
    CPU seconds of this process (all threads) to trace+lower and to compile it, and CPU
    milliseconds per call (median of `repeat`): the codec's work of all 8 devices and XLA's
    collectives. Public API only, so it runs against any installed version, for side-by-side
    comparisons in alternation."""
    from zipccl_jax.bench.data import gaussian

    n, m = 8, 1 << 20
    mesh = jax.make_mesh((n,), ("d",), devices=jax.devices("cpu")[:n])
    x = jax.device_put(gaussian(n * m, "bfloat16", seed=1), NamedSharding(mesh, P("d")))
    cases = {"psum": (lambda a: zc.zip_psum(a, "d", strategy="compressed"), P()),
             "psum_scatter": (lambda a: zc.zip_psum_scatter(a, "d", tiled=True, strategy="compressed"), P("d")),
             "all_to_all": (lambda a: zc.zip_all_to_all(a, "d", 0, 0, tiled=True, strategy="compressed"), P("d")),
             "all_gather": (lambda a: zc.zip_all_gather(a, "d", tiled=True, strategy="compressed"), P("d"))}
    fields = []
    for name, (fn, spec) in cases.items():
        f = jax.jit(jax.shard_map(fn, mesh=mesh, in_specs=P("d"), out_specs=spec, check_vma=False))
        t0 = time.process_time()
        lowered = f.lower(x)
        t1 = time.process_time()
        compiled = lowered.compile()
        t2 = time.process_time()
        jax.block_until_ready(compiled(x))
        runs = []
        for _ in range(repeat):
            t = time.process_time()
            jax.block_until_ready(compiled(x))
            runs.append(time.process_time() - t)
        fields.append(f"{name}_lower_cpu_s={t1 - t0:.3f} {name}_compile_cpu_s={t2 - t1:.3f} "
                      f"{name}_run_cpu_ms={1e3 * float(np.median(runs)):.1f}")
    return "ok=True " + " ".join(fields)


if __name__ == "__main__":
    what = sys.argv[1]
    if what == "memory":
        line = memory()
    elif what == "transfer":
        line = transfer(int(sys.argv[2]) if len(sys.argv) > 2 else 9)
    elif what == "leaves":
        line = leaves(int(sys.argv[2]))
    else:
        line = codec(int(sys.argv[2]), int(sys.argv[3]) if what == "chunks" else 1)
    print(line, flush=True)
    sys.exit(0 if line.startswith("ok=True") else 1)
