"""`python -m zipccl_jax bench schedule`: a training step compiled for GPUs on a machine without one.

XLA compiles for a GPU target with no GPU present (docs/GPU.md; jax's CUDA PJRT plugin, the CPU
as JAX's platform, an H100 SXM target config shipped beside this file). The result is the
optimised, scheduled program XLA:GPU would run on N H100s: which collectives are asynchronous,
what compute overlaps them, where the host waits. Nothing runs, so there are no timings.

    mesh = gpu_mesh("1x1x8")                                  # JAX_PLATFORMS=cpu, plugin installed
    fn, specs = mlp_step(mesh, sync="zip")
    schedule = hlo.analyze(compile_for_gpus(fn, *specs).hlo, devices_per_host(mesh))

A user's step plugs in with `--fn module:function`: function(mesh, sync) -> (jitted fn, arg specs),
with sync "lax" or "zip" (a function without a `sync` parameter is compiled once).
"""

from __future__ import annotations

import collections
import dataclasses
import importlib
import importlib.util
import inspect
import json
import sys
import tempfile
from pathlib import Path

import jax
import jax.numpy as jnp
from jax import lax
from jax.sharding import NamedSharding
from jax.sharding import PartitionSpec as P

from .. import _xla_flags
from . import hlo, report

TARGET_CONFIG = Path(__file__).with_name("h100_sxm.txtpb")  # XLA's H100 SXM spec, runtime and driver 13.0
SYNCS = ("lax", "zip")
COLLECTIVES = ("psum", "all_gather", "psum_scatter", "all_to_all", "ppermute")
PAYLOAD_BYTES = 64 << 10


def plugin_installed() -> bool:
    try:
        return any(importlib.util.find_spec(f"jax_plugins.xla_cuda{v}") for v in (13, 12))
    except ModuleNotFoundError:  # no jax_plugins package at all
        return False


def _require_setup() -> None:
    version = jax.__version__
    missing = []
    if jax.config.jax_platforms != "cpu":
        missing.append("JAX's platform must be the CPU, set before jax starts: JAX_PLATFORMS=cpu "
                       "(or jax.config.update('jax_platforms', 'cpu') before the first computation)")
    if not plugin_installed():
        missing.append("jax's CUDA PJRT plugin, of jaxlib's version: pip install --no-deps "
                       f'"jax-cuda13-pjrt=={version}" "jax-cuda13-plugin=={version}"')
    if missing:
        raise RuntimeError("compiling for GPUs without a GPU needs\n- " + "\n- ".join(missing))


def gpu_mesh(topology: str = "1x1x8", axis_names=("d",), axis_shape=None):
    """A mesh of compile-only H100s. topology: "slices x hosts x GPUs per host" ("1x1x8": one host
    of 8; "1x2x8": two hosts). axis_shape defaults to all devices on one axis."""
    _require_setup()
    from jax.experimental import topologies

    topo = topologies.get_topology_desc(platform="cuda", target_config=TARGET_CONFIG.read_text(),
                                        topology=topology)
    return topologies.make_mesh(topo, tuple(axis_shape or (len(topo.devices),)), tuple(axis_names))


def devices_per_host(mesh) -> int:
    return sum(d.process_index == 0 for d in mesh.devices.flat)


@dataclasses.dataclass
class Compiled:
    hlo: str                               # the optimised, scheduled HLO
    thunks: list[hlo.Thunk] | None = None  # after XLA's thunk passes (command buffers), when dumped
    dump_dir: Path | None = None
    temp_bytes: int = 0                    # XLA's temporaries per device (memory_analysis)


def compile_for_gpus(fn, *arg_specs, command_buffer=None, dump=False, options=None) -> Compiled:
    """Compiles jitted fn for the mesh its arg_specs (ShapeDtypeStructs with shardings) live on.
    command_buffer: XLA's xla_gpu_enable_command_buffer, e.g. "FUSION,CUSTOM_CALL,COLLECTIVES" or
    a list ("" turns command buffers off; None keeps XLA's default). dump: also write XLA's dump
    (this compile only, no XLA_FLAGS) to a temporary directory and read its thunk sequence."""
    options = dict(options or {})
    if command_buffer is not None:
        options["xla_gpu_enable_command_buffer"] = (command_buffer if isinstance(command_buffer, str)
                                                    else ",".join(command_buffer))
    dump_dir = Path(tempfile.mkdtemp(prefix="zipccl_schedule_")) if dump else None
    if dump:
        options["xla_dump_to"] = str(dump_dir)
    compiled = fn.lower(*arg_specs).compile(compiler_options=options)
    result = Compiled(compiled.as_text(), dump_dir=dump_dir, temp_bytes=compiled.memory_analysis().temp_size_in_bytes)
    if dump:
        result.thunks = read_dumped_thunks(dump_dir)
    return result


def read_dumped_thunks(dump_dir: Path) -> list[hlo.Thunk]:
    """The thunk sequence after XLA's thunk passes (XLA writes that file only when a pass, such as
    command-buffer conversion, changed the sequence; otherwise the sequence as emitted)."""
    after = sorted(dump_dir.glob("*thunk_sequence_after_thunk_passes.txt"))
    sequence = after or sorted(dump_dir.glob("*thunk_sequence.txt"))
    metadata = sorted(dump_dir.glob("*thunk_metadata.txt"))
    if not sequence:
        raise FileNotFoundError(f"no thunk sequence dumped in {dump_dir}")
    return hlo.read_thunks(sequence[-1].read_text(), metadata[-1].read_text() if metadata else "")


def command_buffer_capture(compiled: Compiled) -> dict[str, dict[str, int]]:
    """{what: {"captured": n, "outside": m}} per kind of thunk, custom calls by target: which
    thunks XLA put in command buffers (CUDA graphs)."""
    targets = {i.name: i.target() for instrs in hlo.parse(compiled.hlo)[1].values() for i in instrs}
    counts: dict[str, dict[str, int]] = collections.defaultdict(lambda: {"captured": 0, "outside": 0})
    for t in compiled.thunks or []:
        if t.kind in ("kCommandBuffer", "kSequential", "kConditional", "kWhile"):
            continue
        what = (targets.get(t.name) or t.kind) if t.kind == "kCustomCall" else t.kind
        counts[what]["captured" if t.in_command_buffer else "outside"] += 1
    return dict(counts)


# ---------------------------------------------------------------------------
# steps to compile: fn(mesh, sync, ...) -> (jitted fn, arg specs)


def _zip(name):
    from .. import collectives  # the library, imported late: `bench schedule --help` needs no codec

    return getattr(collectives, "zip_" + name)


def sync_layer(g, collective: str, sync: str, axis: str):
    """One layer's gradient (flat, divisible by the axis size) through one collective, and back to
    an update of its shape: sums for psum and all_gather; this device's slice of the sum, in place,
    for psum_scatter and all_to_all (a ZeRO-style update); own plus neighbour's for ppermute."""
    n = lax.axis_size(axis)
    kw = {"strategy": "compressed"} if sync == "zip" else {}
    call = _zip(collective) if sync == "zip" else getattr(lax, collective)
    if collective == "psum":
        return call(g, axis, **kw)
    if collective == "all_gather":
        return call(g, axis, **kw).sum(0)
    if collective == "ppermute":
        return g + call(g, axis, [(i, (i + 1) % n) for i in range(n)], **kw)
    rows = g.reshape(n, -1)
    if collective == "psum_scatter":
        mine = call(rows, axis, scatter_dimension=0, **kw)
    elif collective == "all_to_all":
        mine = call(rows, axis, 0, 0, **kw).sum(0)
    else:
        raise ValueError(f"collective must be one of {COLLECTIVES}, got {collective!r}")
    return lax.dynamic_update_slice_in_dim(jnp.zeros_like(rows), mine[None], lax.axis_index(axis), 0).reshape(-1)


def mlp_step(mesh, sync: str = "lax", collective: str = "psum", layers: int = 4, width: int = 2048,
             batch_per_device: int = 256, axis: str = "d"):
    """An SGD step of a `layers`-layer tanh MLP, data-parallel over axis, each layer's gradient
    synced by its own collective (lax's or zipccl's), so layer k's transfer can run during the
    backward of the layers below it. The default width gives 16 MiB per layer: two exceed XLA:GPU's
    30 MiB combine threshold, so lax's psums stay one per layer (at 4 MiB XLA merges all four
    into one all-reduce that waits for the whole backward)."""
    n = mesh.shape[axis]

    def loss(params, x):
        for w in params:
            x = jnp.tanh(x @ w)
        return (x * x).mean()

    def local(params, x):
        mine = [lax.pcast(w, axis, to="varying") for w in params]  # differentiate a varying copy: no psum by autodiff
        grads = jax.grad(loss)(mine, x)
        return [w - 1e-3 * sync_layer(g.reshape(-1), collective, sync, axis).reshape(w.shape) / n
                for w, g in zip(params, grads)]

    fn = jax.jit(jax.shard_map(local, mesh=mesh, in_specs=(P(), P(axis)), out_specs=P(), check_vma=False))
    params = [jax.ShapeDtypeStruct((width, width), jnp.float32, sharding=NamedSharding(mesh, P()))] * layers
    x = jax.ShapeDtypeStruct((n * batch_per_device, width), jnp.float32, sharding=NamedSharding(mesh, P(axis)))
    return fn, (params, x)


def lm_step(mesh, sync: str = "lax", axis: str = "d", cfg=None):
    """bench/lm.py's training step (Adam, every gradient synced by one lax.psum or zip_psum)."""
    from . import lm

    cfg = cfg or lm.Config(d_model=512, n_layers=4, n_heads=8, seq_len=128, batch_per_device=8)
    replicated, n = NamedSharding(mesh, P()), mesh.shape[axis]
    params = jax.eval_shape(lambda: lm.init_params(jax.random.key(0), cfg))
    opt = jax.eval_shape(lm.init_opt, params)
    spec = lambda a: jax.ShapeDtypeStruct(a.shape, a.dtype, sharding=replicated)  # noqa: E731
    batch = jax.ShapeDtypeStruct((n * cfg.batch_per_device, cfg.seq_len + 1), jnp.int32,
                                 sharding=NamedSharding(mesh, P(axis)))
    return lm.make_step(mesh, cfg, axis=axis, sync=sync), (jax.tree.map(spec, params), jax.tree.map(spec, opt), batch)


def user_step(path: str):
    """The function named by "module:function" (module importable, or a .py path)."""
    module, _, name = path.rpartition(":")
    if not module:
        raise ValueError(f"--fn takes module:function, got {path!r}")
    if module.endswith(".py"):
        spec = importlib.util.spec_from_file_location(Path(module).stem, module)
        mod = importlib.util.module_from_spec(spec)
        spec.loader.exec_module(mod)
    else:
        mod = importlib.import_module(module)
    return getattr(mod, name)


# ---------------------------------------------------------------------------
# the command


def grouped(schedule: hlo.Schedule, min_bytes: int = PAYLOAD_BYTES) -> list[dict]:
    """The payload transfers as table rows, alike ones (op, where, form, what overlaps) counted together
    (a switch's branches hold one transfer each, of which one runs)."""
    rows: dict[tuple, dict] = {}
    for c in hlo.payload_transfers(schedule, min_bytes):
        where = "top level" if c.top_level else c.context.split(" of ")[0]
        overlaps = ", ".join(f"{k} x{v}" if v > 1 else k
                             for k, v in collections.Counter(c.overlaps).items()) or "-"
        key = (c.op, where, c.has_done, c.is_sync, overlaps)
        row = rows.setdefault(key, {"op": c.op, "count": 0, "largest bytes": 0, "where": where,
                                    "start/done": c.has_done, "is_sync": c.is_sync,
                                    "overlapping ops": len(c.overlaps), "overlaps": overlaps})
        row["count"] += 1
        row["largest bytes"] = max(row["largest bytes"], c.bytes)  # alternative branches: summing would mislead
    return list(rows.values())


def compiler_options(args) -> dict:
    """The compile options `bench schedule` was given: --gpu-compiler-options (the library's
    GPU_COMPILER_OPTIONS), then each --compiler-option KEY=VALUE (true/false, a number, or text)."""
    options = {}
    if getattr(args, "gpu_compiler_options", False):
        options.update(_xla_flags.GPU_COMPILER_OPTIONS)
    for item in getattr(args, "compiler_option", None) or []:
        key, sep, value = item.partition("=")
        if not sep or not key:
            raise ValueError(f"--compiler-option takes KEY=VALUE, got {item!r}")
        if value.lower() in ("true", "false"):
            options[key] = value.lower() == "true"
        else:
            try:
                options[key] = int(value)
            except ValueError:
                try:
                    options[key] = float(value)
                except ValueError:
                    options[key] = value
    return options


def compile_steps(args) -> list[dict]:
    """Compiles the chosen step with each sync; a result per sync."""
    jax.config.update("jax_platforms", "cpu")  # before any backend starts: the GPUs are compile-only
    mesh = gpu_mesh(args.topology)
    per_host = devices_per_host(mesh)
    if args.fn:
        builder = user_step(args.fn)
        syncs = SYNCS if "sync" in inspect.signature(builder).parameters else (None,)
    else:
        builder = {"mlp": lambda m, sync: mlp_step(m, sync, args.collective), "lm": lm_step}[args.step]
        syncs = SYNCS
    progress, results = report.Progress(len(syncs)), []
    for sync in syncs:
        progress.start(f"schedule {args.fn or args.step} sync={sync} on {args.topology}")
        fn, specs = builder(mesh, sync=sync) if sync else builder(mesh)
        compiled = compile_for_gpus(fn, *specs, command_buffer=args.command_buffer, dump=args.thunks,
                                    options=compiler_options(args))
        schedule = hlo.analyze(compiled.hlo, per_host)
        summary = schedule.summary(PAYLOAD_BYTES)
        progress.finish(", ".join(f"{k} {v}" for k, v in summary.items()))
        results.append({"sync": sync or "user", "summary": summary,
                        "transfers": grouped(schedule), "host round trips": schedule.host_round_trips,
                        "collectives": [dataclasses.asdict(c) | {"asynchronous": c.asynchronous}
                                        for c in schedule.collectives],
                        "command buffers": command_buffer_capture(compiled) if args.thunks else None})
    return results


def run(args) -> list[dict]:
    results = compile_steps(args)
    setup = {"topology": args.topology, "step": args.fn or args.step, "command_buffer": args.command_buffer,
             "collective": args.collective, "jax": jax.__version__, "payload_bytes": PAYLOAD_BYTES,
             "compiler_options": compiler_options(args), "xla_flags": _xla_flags.STATE}
    if args.json == "-":
        json.dump({"setup": setup, "results": results}, sys.stdout, indent=1)
        print()
        return results
    for r in results:
        options = "".join(f", {k}={v}" for k, v in setup["compiler_options"].items())
        print(f"\n## {setup['step']}, sync={r['sync']}, {args.topology} x H100 (jax {jax.__version__}{options}; "
              f"latency-hiding scheduler: {_xla_flags.describe()})\n")
        print(report.table(r["transfers"]))
        s = r["summary"]
        print(f"\nconditionals {s['conditionals']}, whiles {s['whiles']}, payload transfers (>= 64 KiB) "
              f"{s['payload transfers']}, asynchronous {s['asynchronous']}, overlapped {s['overlapped']}, "
              f"in a branch or loop {s['inside a branch or loop']}, host round trips {s['host round trips']}")
        for trip in r["host round trips"][:8]:
            print(f"- {trip}")
        if len(r["host round trips"]) > 8:
            print(f"- ... {len(r['host round trips']) - 8} more")
        if r["command buffers"] is not None:
            print("\ncommand buffers (thunks captured / outside):",
                  ", ".join(f"{k} {v['captured']}/{v['outside']}" for k, v in sorted(r["command buffers"].items())))
    if args.json:
        report.save_json(args.json, setup=setup, results=results)
    return results
