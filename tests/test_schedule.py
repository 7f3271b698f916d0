"""bench/hlo.py and bench/schedule.py: programs compiled for 8 and 2 x 8 H100s on the CPU machine.

The compiles run in a subprocess whose JAX platform is the CPU (this process's backend, with its 8
virtual devices, is already up), with jax's CUDA PJRT plugin, which a GPU-less machine can compile
with. Without the plugin these tests skip, except where ZIPCCL_REQUIRE_CUDA_PLUGIN=1 (CI) makes
that a failure. The parser's own tests need no plugin.
"""

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest

import zipccl_jax
from zipccl_jax.bench import hlo, schedule

REPO = Path(zipccl_jax.__file__).parent.parent

# Each program: name -> (topology, code defining f and specs on `mesh`); compiled in one subprocess.
PROGRAMS = {
    "lone_psum": ("1x1x8", """
f = jax.jit(jax.shard_map(lambda a: lax.psum(a, "d"), mesh=mesh, in_specs=P("d"), out_specs=P()))
specs = (jax.ShapeDtypeStruct((8 * 1024, 1024), jnp.bfloat16, sharding=NamedSharding(mesh, P("d"))),)
"""),
    "cond_psum": ("1x1x8", """
def body(a):
    return lax.cond(a[0, 0] > 0, lambda b: lax.psum(b, "d"), lambda b: 2 * b, a)
f = jax.jit(jax.shard_map(body, mesh=mesh, in_specs=P("d"), out_specs=P("d"), check_vma=False))
specs = (jax.ShapeDtypeStruct((8 * 1024, 1024), jnp.bfloat16, sharding=NamedSharding(mesh, P("d"))),)
"""),
    "mlp_lax": ("1x1x8", "f, specs = schedule.mlp_step(mesh, 'lax')"),
    "mlp_lax_2hosts": ("1x2x8", "f, specs = schedule.mlp_step(mesh, 'lax')"),
    "ragged_2hosts": ("1x2x8", """
def body(a):
    n = 16
    sizes = jnp.full((n,), a.shape[0] // n, jnp.int32)
    offsets = jnp.arange(n, dtype=jnp.int32) * (a.shape[0] // n)
    return lax.ragged_all_to_all(a, jnp.zeros_like(a), offsets, sizes, offsets, sizes, axis_name="d")
f = jax.jit(jax.shard_map(body, mesh=mesh, in_specs=P("d"), out_specs=P("d"), check_vma=False))
specs = (jax.ShapeDtypeStruct((16 * 1024, 1024), jnp.bfloat16, sharding=NamedSharding(mesh, P("d"))),)
"""),
}

# XLA's own behaviour behind docs/GPU.md's finding: 4 layers, each a static all_to_all of its
# activations; with a ragged_all_to_all in each layer's chain ("ragged") or without ("static")
_LAYERS = """
def layers(ws, x):
    outs, h = [], x
    for w in ws:
        h = jnp.tanh(h @ w)
        b = lax.all_to_all(h.reshape(8, -1), "d", 0, 0, tiled=True)
        if RAGGED:
            src, off = h.reshape(-1)[:8 * 1024], jnp.arange(8, dtype=jnp.int32) * 1024
            sizes = jnp.full((8,), 100, jnp.int32) + (b[0, 0] > 0).astype(jnp.int32)
            b = b + lax.ragged_all_to_all(src, jnp.zeros_like(src), off, sizes, off, sizes,
                                          axis_name="d").reshape(8, -1)[:, :1]
        outs.append(jnp.sum(b))
    return jnp.stack(outs)[None]
f = jax.jit(jax.shard_map(layers, mesh=mesh, in_specs=(P(), P("d")), out_specs=P("d"), check_vma=False))
specs = ([jax.ShapeDtypeStruct((2048, 2048), jnp.float32, sharding=NamedSharding(mesh, P()))] * 4,
         jax.ShapeDtypeStruct((8 * 256, 2048), jnp.float32, sharding=NamedSharding(mesh, P("d"))))
"""
PROGRAMS["layers_static"] = ("1x1x8", "RAGGED = False" + _LAYERS)
PROGRAMS["layers_ragged"] = ("1x1x8", "RAGGED = True" + _LAYERS)

# Why (docs/GPU.md, "The compiled program"): XLA:GPU runs its latency-hiding scheduler by default only
# on a module whose collectives its speed-of-light cost model knows, and ragged_all_to_all is not one.
# The 4-layer step with each lax collective, plus one ragged_all_to_all of the input that no layer
# reaches; with XLA's defaults and with the library's GPU_COMPILER_OPTIONS (the scheduler on).
_RAGGED_OF_INPUT = """
fn, (params, x) = schedule.mlp_step(mesh, "lax", COLLECTIVE)
def with_ragged(params, x):
    out = fn(params, x)
    def spill(a):
        src, off = a.reshape(-1)[:8 * 1024], jnp.arange(8, dtype=jnp.int32) * 1024
        sizes = jnp.full((8,), 100, jnp.int32) + (a[0, 0] > 0).astype(jnp.int32)
        return jnp.sum(lax.ragged_all_to_all(src, jnp.zeros_like(src), off, sizes, off, sizes, axis_name="d"))[None]
    extra = jax.shard_map(spill, mesh=mesh, in_specs=P("d"), out_specs=P("d"), check_vma=False)(x)
    return [out[0] + jnp.sum(extra)] + out[1:]
f, specs = jax.jit(with_ragged), (params, x)
"""
LAX_KINDS = ("psum", "all_gather", "all_to_all", "ppermute")
for _kind in ("psum", "all_gather", "psum_scatter", "all_to_all", "ppermute"):
    PROGRAMS[f"mlp_{_kind}_lax"] = ("1x1x8", f"f, specs = schedule.mlp_step(mesh, 'lax', '{_kind}')")
for _kind in LAX_KINDS:
    PROGRAMS[f"mlp_{_kind}_lax_ragged"] = ("1x1x8", f"COLLECTIVE = '{_kind}'" + _RAGGED_OF_INPUT)
    PROGRAMS[f"mlp_{_kind}_lax_ragged_lhs"] = ("1x1x8", f"COLLECTIVE = '{_kind}'" + _RAGGED_OF_INPUT
                                               + "options = zc.GPU_COMPILER_OPTIONS")

# zipccl's collectives alone, 16 MiB of bf16 per device, strategy="compressed" (the CUDA lowering)
ZIP_CALLS = {
    "psum": "zc.zip_psum(a, 'd', strategy='compressed')",
    "all_gather": "zc.zip_all_gather(a, 'd', strategy='compressed')",
    "psum_scatter": "zc.zip_psum_scatter(a, 'd', strategy='compressed')",
    "all_to_all": "zc.zip_all_to_all(a, 'd', 0, 0, strategy='compressed')",
    "ppermute": "zc.zip_ppermute(a, 'd', [(i, (i + 1) % a.shape[0]) for i in range(a.shape[0])], "
                "strategy='compressed')",
}
for _name, _call in ZIP_CALLS.items():
    for _topology in ("1x1x8", "1x2x8"):
        PROGRAMS[f"zip_{_name}_{_topology}"] = (_topology, f"f, specs = lone(lambda a: {_call})")
PROGRAMS["mlp_zip"] = ("1x1x8", "f, specs = schedule.mlp_step(mesh, 'zip')")
PROGRAMS["mlp_lax_lhs"] = ("1x1x8", "f, specs = schedule.mlp_step(mesh, 'lax'); options = zc.GPU_COMPILER_OPTIONS")
for _kind in ("psum", "all_gather", "psum_scatter", "all_to_all", "ppermute"):  # the library's options
    PROGRAMS[f"mlp_zip_{_kind}_lhs"] = ("1x1x8", f"f, specs = schedule.mlp_step(mesh, 'zip', '{_kind}'); "
                                        "options = zc.GPU_COMPILER_OPTIONS")
PROGRAMS["mlp_zip_psum_lhs_2hosts"] = ("1x2x8", "f, specs = schedule.mlp_step(mesh, 'zip'); options = zc.GPU_COMPILER_OPTIONS")

COMPILE = """
import json, sys
import jax, jax.numpy as jnp
from jax import lax
from jax.sharding import NamedSharding, PartitionSpec as P
import zipccl_jax as zc
from zipccl_jax.bench import schedule

def lone(call):
    n = mesh.devices.size
    f = jax.jit(jax.shard_map(lambda a: call(a[0]).reshape(1, -1), mesh=mesh, in_specs=P("d"),
                              out_specs=P("d"), check_vma=False))
    return f, (jax.ShapeDtypeStruct((n, n, (1 << 23) // n), jnp.bfloat16, sharding=NamedSharding(mesh, P("d"))),)
out, programs = sys.argv[1], json.loads(sys.argv[2])
open(f"{out}/state", "w").write(zc._xla_flags.STATE)
meshes = {}
for name, (topology, code) in programs.items():
    mesh = meshes.setdefault(topology, schedule.gpu_mesh(topology))
    globals()["mesh"] = mesh
    scope = dict(globals())
    exec(code, scope)
    compiled = schedule.compile_for_gpus(scope["f"], *scope["specs"], options=scope.get("options"))
    open(f"{out}/{name}.hlo", "w").write(compiled.hlo)
    open(f"{out}/{name}.temp", "w").write(str(compiled.temp_bytes))
"""


def _env(**overrides):  # the subprocesses run in a temporary directory: `-c` and `-m` would import a source tree there
    env = dict(os.environ, JAX_PLATFORMS="cpu", PYTHONPATH=os.pathsep.join(
        [str(REPO)] + [p for p in os.environ.get("PYTHONPATH", "").split(os.pathsep) if p]))
    for key in ("XLA_FLAGS", "ZIPCCL_XLA_FLAGS"):
        env.pop(key, None)
    env.update(overrides)
    return env


def _require_plugin():
    if not schedule.plugin_installed():
        message = ("jax's CUDA PJRT plugin is not installed "
                   "(pip install --no-deps jax-cuda13-pjrt==$JAX jax-cuda13-plugin==$JAX)")
        if os.environ.get("ZIPCCL_REQUIRE_CUDA_PLUGIN") == "1":
            pytest.fail(message)
        pytest.skip(message)


# The programs above are compiled with XLA's own defaults (ZIPCCL_XLA_FLAGS=0: the import leaves
# XLA_FLAGS alone), or with explicit options. These are compiled as a user's process does: the
# import turns the latency-hiding scheduler on; or the user's XLA_FLAGS turns it off.
LIBRARY_PROGRAMS = {
    "mlp_zip_default": ("1x1x8", "f, specs = schedule.mlp_step(mesh, 'zip')"),
    "mlp_zip_default_2hosts": ("1x2x8", "f, specs = schedule.mlp_step(mesh, 'zip')"),
}
RUNS = {  # run: (the environment's changes, programs), one subprocess each
    "xla_defaults": ({"ZIPCCL_XLA_FLAGS": "0"}, PROGRAMS),
    "library": ({}, LIBRARY_PROGRAMS),
    "user_off": ({"XLA_FLAGS": "--xla_gpu_enable_latency_hiding_scheduler=false"},
                 {"mlp_zip_user_off": LIBRARY_PROGRAMS["mlp_zip_default"]}),
}


@pytest.fixture(scope="module")
def compiled(tmp_path_factory):
    """{program: its analyzed Schedule}, each run's compiled in one subprocess; "state of RUN": what
    the run's import did to XLA_FLAGS (zipccl_jax._xla_flags.STATE)."""
    _require_plugin()
    schedules = {}
    for run, (overrides, programs) in RUNS.items():
        out = tmp_path_factory.mktemp(f"hlo_{run}")
        done = subprocess.run([sys.executable, "-c", COMPILE, str(out), json.dumps(programs)], env=_env(**overrides),
                              cwd=out, capture_output=True, text=True, timeout=300)
        assert done.returncode == 0, done.stderr[-3000:]
        for name in programs:
            schedules[name] = hlo.analyze((out / f"{name}.hlo").read_text(), devices_per_host=8)
            schedules[name].temp_bytes = int((out / f"{name}.temp").read_text())
        schedules[f"state of {run}"] = (out / "state").read_text()
    return schedules


def test_lone_psum_is_one_start_done_pair_marked_sync(compiled):
    s = compiled["lone_psum"]
    (c,) = hlo.payload_transfers(s)
    assert (c.op, c.bytes, c.top_level, c.overlaps) == ("all-reduce", 1024 * 1024 * 2, True, [])
    # alone, nothing to overlap: jax 0.10.2 marks the start/done pair is_sync,
    # 0.11.2 makes it a Triton collective fusion
    assert c.groups == [list(range(8))]
    hlo.assert_no_host_round_trip(s)


def test_lax_train_step_overlaps_every_layers_transfer(compiled):
    s = compiled["mlp_lax"]
    transfers = hlo.payload_transfers(s, 64 << 10)
    assert [c.bytes for c in transfers] == [16 << 20] * 4  # one all-reduce per layer, not combined
    assert all(c.op == "all-reduce" and c.asynchronous and c.top_level for c in transfers)
    assert sum(bool(c.overlaps) for c in transfers) == 4  # jax 0.10.2: 4 of 4, gemms of the next layers' backward
    assert any("gemm" in name for c in transfers for name in c.overlaps)
    assert s.summary()["overlapped"] == 4 and s.summary()["conditionals"] == 0
    hlo.assert_no_host_round_trip(s)
    hlo.assert_payload_async_at_top_level(s)


def test_collective_inside_a_cond_is_found_synchronous_in_its_branch(compiled):
    s = compiled["cond_psum"]
    assert len(s.conditionals) == 1 and s.whiles == {}
    (c,) = hlo.payload_transfers(s)
    assert c.op == "all-reduce" and c.context == f"branch of %{s.conditionals[0]}" and not c.overlaps
    with pytest.raises(AssertionError, match="conditional"):
        hlo.assert_no_host_round_trip(s)
    with pytest.raises(AssertionError, match="not asynchronous at the top level"):
        hlo.assert_payload_async_at_top_level(s)


def test_two_hosts_of_eight(compiled):
    s = compiled["mlp_lax_2hosts"]
    transfers = hlo.payload_transfers(s)
    assert len(transfers) == 4 and all(c.asynchronous and c.groups == [list(range(16))] for c in transfers)
    ragged = compiled["ragged_2hosts"]
    assert [c.op for c in ragged.collectives] == ["ragged-all-to-all"]
    assert len(ragged.host_round_trips) == 1 and "span hosts" in ragged.host_round_trips[0]


def top_level_pair(c) -> bool:
    """At the top level, as a start/done pair, or synchronous where nothing could overlap it (jax
    0.10.2 keeps such a pair and marks it is_sync; 0.11.2 leaves it unsplit), as XLA does lax's."""
    return c.top_level and (c.has_done or c.is_sync)


def bulk_and_spill(s):
    """A compressed collective's payload transfers: the bulk (static sizes) and the spill (ragged)."""
    transfers = hlo.payload_transfers(s)
    spill = [c for c in transfers if c.op == "ragged-all-to-all"]
    return [c for c in transfers if c not in spill], spill


@pytest.mark.parametrize("name", list(ZIP_CALLS))
def test_compressed_collectives_compiled_for_gpus_have_no_branch_loop_or_host_wait(compiled, name):
    """Compiled for one host of 8 H100s: no conditional and no loop; the bulk of the bytes moves in
    static-size collectives that are start/done pairs at the top level (XLA marks a pair is_sync
    when nothing can go between, as it does lax's alone); the spill is a ragged_all_to_all, which
    within a host reads its sizes from device memory: no host round trip at all. Across two hosts
    the program is the same, and each spill is XLA's NCCL fallback, whose sizes go to the host."""
    s = compiled[f"zip_{name}_1x1x8"]
    assert s.conditionals == [] and s.whiles == {}
    hlo.assert_no_host_round_trip(s)
    bulk, spill = bulk_and_spill(s)
    phases = 2 if name == "psum" else 1
    assert len(bulk) == phases and len(spill) == phases
    assert all(top_level_pair(c) for c in bulk) and all(c.top_level for c in spill)
    ops = {"psum": {"all-to-all", "all-gather"}, "all_gather": {"all-gather"}, "psum_scatter": {"all-to-all"},
           "all_to_all": {"all-to-all"}, "ppermute": {"collective-permute"}}[name]
    assert {c.op for c in bulk} == ops
    assert all(c.bytes < (16 << 20) * 0.68 for c in bulk if c.op == "all-to-all")  # 1.01 / 1.5 of the raw rows
    two = compiled[f"zip_{name}_1x2x8"]
    assert two.conditionals == [] and two.whiles == {}
    assert len(two.host_round_trips) == phases and all("ragged" in t for t in two.host_round_trips)
    assert all(top_level_pair(c) for c in bulk_and_spill(two)[0])


# XLA's temporaries per device, in messages (16 MiB), compiled for 8 H100s: docs/DESIGN.md's "Memory"
# (the encode's full-capacity streams, the CUDA workspace, the received bulk and spill and their join)
GPU_TEMP_BOUND = {"psum": 3.7, "all_gather": 11.0, "psum_scatter": 3.1, "all_to_all": 3.1, "ppermute": 3.1}


@pytest.mark.parametrize("name", list(ZIP_CALLS))
def test_compressed_collectives_on_gpus_stay_within_their_memory_bound(compiled, name):
    temp = compiled[f"zip_{name}_1x1x8"].temp_bytes / (16 << 20)
    assert GPU_TEMP_BOUND[name] - 0.6 < temp <= GPU_TEMP_BOUND[name], temp


def gemm_overlapped(transfers) -> int:
    """How many of the transfers have a GEMM (other layers' backward compute) between start and done."""
    return sum(any("gemm" in name for name in c.overlaps) for c in transfers)


def test_a_zip_train_step_overlaps_as_many_transfers_as_lax(compiled):
    """The 4-layer step with one zip_psum per layer's gradients, compiled with the library's
    GPU_COMPILER_OPTIONS (XLA's latency-hiding scheduler on): no conditional, no host round trip,
    every payload transfer a start/done pair at the top level with compute between, and at least
    as many transfers overlapping compute, and overlapping the other layers' GEMMs, as with
    lax.psum (4 of 4 and 3 of 4 there)."""
    ours, theirs = compiled["mlp_zip_psum_lhs"], compiled["mlp_lax"]
    assert ours.conditionals == [] and ours.whiles == {}
    hlo.assert_no_host_round_trip(ours)
    hlo.assert_payload_async_at_top_level(ours)
    assert ours.summary()["overlapped"] >= theirs.summary()["overlapped"] == 4
    bulk, spill = bulk_and_spill(ours)
    # 4 reduce-scatter bulks; XLA may combine the all-gather phases' bulks (their buffers are small)
    assert [c.op for c in bulk].count("all-to-all") == 4 and "all-gather" in {c.op for c in bulk}
    assert len(spill) == 8 and all(c.asynchronous and c.top_level and c.overlaps for c in bulk + spill)
    lax_gemm = gemm_overlapped(hlo.payload_transfers(theirs))
    assert gemm_overlapped(bulk) >= lax_gemm == 3
    # the flag changes nothing in the lax step: XLA runs the scheduler there already
    assert [(c.op, c.overlaps) for c in hlo.payload_transfers(compiled["mlp_lax_lhs"])] == \
        [(c.op, c.overlaps) for c in hlo.payload_transfers(theirs)]
    # across two hosts the same, with one host round trip per spill (XLA's NCCL fallback)
    two = compiled["mlp_zip_psum_lhs_2hosts"]
    assert two.summary()["overlapped"] == two.summary()["payload transfers"] == 14
    assert len(two.host_round_trips) == 8


@pytest.mark.parametrize("name", ["all_gather", "psum_scatter", "all_to_all", "ppermute"])
def test_every_zip_collective_in_a_train_step_overlaps_as_lax_does(compiled, name):
    """The same step with each other collective: with GPU_COMPILER_OPTIONS every payload transfer of
    the compressed step overlaps compute, and as many bulks overlap other layers' GEMMs as lax's
    transfers do (psum_scatter: XLA combines lax's four reduce-scatters into one that overlaps
    nothing). zip_ppermute's bulks are smaller than XLA's combine threshold in pairs, so XLA sends
    two layers' bulks by one collective-permute (xla_gpu_collective_permute_combine_threshold_bytes=0
    would keep them apart: 3 of 4 over GEMMs then, as lax's)."""
    ours, theirs = compiled[f"mlp_zip_{name}_lhs"], compiled[f"mlp_{name}_lax"]
    assert ours.conditionals == [] and ours.whiles == {}
    hlo.assert_no_host_round_trip(ours)
    hlo.assert_payload_async_at_top_level(ours)
    transfers = hlo.payload_transfers(ours)
    assert all(c.overlaps for c in transfers)
    assert ours.summary()["overlapped"] >= theirs.summary()["overlapped"]
    bulk, _ = bulk_and_spill(ours)
    if name == "ppermute":  # XLA combines the compressed bulks in pairs (14 MB each, under its 30 MiB
        assert gemm_overlapped(bulk) >= 1  # combine threshold; lax's 16 MiB are over): 1 of 2, over 2 layers' GEMMs
    else:
        assert gemm_overlapped(bulk) >= max(2, gemm_overlapped(hlo.payload_transfers(theirs)))


def test_without_the_options_the_zip_step_overlaps_no_gemm(compiled):
    """XLA's defaults (docs/GPU.md, "The compiled program"): the spill's ragged_all_to_all keeps
    XLA's latency-hiding scheduler off for the whole module; the bulks are still start/done pairs at
    the top level, no conditional and no host wait, but no GEMM runs under any transfer. When XLA
    changes this, this test says so."""
    ours = compiled["mlp_zip"]
    assert ours.conditionals == [] and ours.whiles == {}
    hlo.assert_no_host_round_trip(ours)
    bulk, spill = bulk_and_spill(ours)
    assert all(top_level_pair(c) for c in bulk) and len(spill) == 8
    assert gemm_overlapped(hlo.payload_transfers(ours)) == 0


def test_the_import_turns_xlas_scheduler_on_so_a_plain_jit_overlaps_as_with_the_options(compiled):
    """A user's process: importing zipccl_jax put --xla_gpu_enable_latency_hiding_scheduler=true in
    XLA_FLAGS before the backends started, so the step jitted with no options is scheduled as with
    GPU_COMPILER_OPTIONS: every payload transfer overlaps compute, 3 bulks over other layers' GEMMs
    (lax.psum's 3), on one host and on two. A user's own XLA_FLAGS wins: with the flag false the
    step overlaps no GEMM, as under XLA's defaults (ZIPCCL_XLA_FLAGS=0)."""
    assert (compiled["state of library"], compiled["state of xla_defaults"], compiled["state of user_off"]) == \
        ("set", "off", "user")
    ours, options = compiled["mlp_zip_default"], compiled["mlp_zip_psum_lhs"]
    assert [(c.op, c.bytes, c.overlaps) for c in hlo.payload_transfers(ours)] == \
        [(c.op, c.bytes, c.overlaps) for c in hlo.payload_transfers(options)]
    assert ours.summary()["overlapped"] == ours.summary()["payload transfers"] == 14
    hlo.assert_no_host_round_trip(ours)
    hlo.assert_payload_async_at_top_level(ours)
    assert gemm_overlapped(bulk_and_spill(ours)[0]) >= gemm_overlapped(hlo.payload_transfers(compiled["mlp_lax"])) == 3
    two = compiled["mlp_zip_default_2hosts"]
    assert two.summary()["overlapped"] == two.summary()["payload transfers"] == 14 and len(two.host_round_trips) == 8
    assert gemm_overlapped(hlo.payload_transfers(compiled["mlp_zip_user_off"])) == 0


def test_xla_overlaps_no_static_transfer_whose_chain_holds_a_ragged_all_to_all(compiled):
    """The XLA behaviour docs/GPU.md reports (jaxlib 0.10.2 and 0.11.2): static all_to_alls overlap
    the next layers' compute, 4 of 4, until each layer's chain also holds a ragged_all_to_all.
    When XLA changes this, this test says so and the docs' finding needs revisiting."""
    alone, ragged = compiled["layers_static"], compiled["layers_ragged"]
    assert [c.op for c in hlo.payload_transfers(alone)] == ["all-to-all"] * 4
    assert alone.summary()["overlapped"] == 4
    assert any("gemm" in name for c in hlo.payload_transfers(alone) for name in c.overlaps)
    static = [c for c in hlo.payload_transfers(ragged) if c.op == "all-to-all"]
    assert len(static) == 4 and not any(c.overlaps for c in static)


@pytest.mark.parametrize("kind", LAX_KINDS)
def test_one_ragged_all_to_all_anywhere_turns_xlas_scheduler_off_for_every_collective(compiled, kind):
    """One ragged_all_to_all of the step's input, which no layer reaches, and lax's per-layer
    all-reduces, all-gathers, all-to-alls or collective-permutes overlap at most one (by the order
    of XLA's memory scheduler) instead of 4 of 4: XLA:GPU runs its latency-hiding scheduler by
    default only on a module whose collectives all have a speed-of-light cost model, which
    ragged-all-to-all has not (gpu_hlo_schedule.cc IsLHSEnabled, sol_latency_estimator.cc
    HasOnlySupportedCollectives). xla_gpu_enable_latency_hiding_scheduler (GPU_COMPILER_OPTIONS)
    gives the 4 back."""
    alone, ragged, lhs = (compiled[f"mlp_{kind}_lax{suffix}"] for suffix in ("", "_ragged", "_ragged_lhs"))
    op = {"psum": "all-reduce", "all_gather": "all-gather", "all_to_all": "all-to-all",
          "ppermute": "collective-permute"}[kind]
    for s in (alone, ragged, lhs):
        assert [c.op for c in hlo.payload_transfers(s) if c.op != "ragged-all-to-all"] == [op] * 4
    static = lambda s: [c for c in hlo.payload_transfers(s) if c.op == op]  # noqa: E731
    assert sum(bool(c.overlaps) for c in static(alone)) == 4
    assert sum(bool(c.overlaps) for c in static(ragged)) <= 1
    assert sum(bool(c.overlaps) for c in static(lhs)) == 4 and all(c.asynchronous for c in static(lhs))


def test_cli_json_compares_zip_with_lax(tmp_path):
    _require_plugin()
    run = subprocess.run([sys.executable, "-m", "zipccl_jax", "bench", "schedule", "--json", "-"], env=_env(),
                         cwd=tmp_path, capture_output=True, text=True, timeout=240)
    assert run.returncode == 0, run.stderr[-3000:]
    result = json.loads(run.stdout)
    assert result["setup"]["topology"] == "1x1x8" and result["setup"]["step"] == "mlp"
    assert result["setup"]["xla_flags"] == "set"  # the import turned XLA's scheduler on
    lax_run, zip_run = result["results"]
    assert (lax_run["sync"], zip_run["sync"]) == ("lax", "zip")
    assert lax_run["summary"] == {"conditionals": 0, "whiles": 0, "collectives": 4, "payload transfers": 4,
                                  "asynchronous": 4, "overlapped": 4, "inside a branch or loop": 0,
                                  "host round trips": 0}
    assert set(zip_run["summary"]) == set(lax_run["summary"]) and zip_run["summary"]["payload transfers"] > 0
    row = lax_run["transfers"][0]
    assert set(row) == {"op", "count", "largest bytes", "where", "start/done", "is_sync", "overlapping ops",
                        "overlaps"}
    assert {c["name"] for c in lax_run["collectives"]} and all(c["asynchronous"] for c in lax_run["collectives"])
    assert "[2/2] schedule mlp sync=zip on 1x1x8" in run.stderr


# ---------------------------------------------------------------------------
# the parser alone (no plugin needed)


def test_gpu_compiler_options_are_what_bench_schedule_passes_and_the_cpu_accepts_them():
    import argparse

    import jax
    import jax.numpy as jnp

    assert zipccl_jax.GPU_COMPILER_OPTIONS == {"xla_gpu_enable_latency_hiding_scheduler": True}
    args = argparse.Namespace(gpu_compiler_options=True, compiler_option=["a=1", "b=false", "c=0.5", "d=x"])
    assert schedule.compiler_options(args) == {"xla_gpu_enable_latency_hiding_scheduler": True,
                                               "a": 1, "b": False, "c": 0.5, "d": "x"}
    with pytest.raises(ValueError, match="KEY=VALUE"):
        schedule.compiler_options(argparse.Namespace(gpu_compiler_options=False, compiler_option=["a"]))
    # a step jitted with them runs on the CPU too (the option is XLA:GPU's; the CPU compile takes it)
    f = jax.jit(lambda x: 2 * x, compiler_options=zipccl_jax.GPU_COMPILER_OPTIONS)
    assert f(jnp.ones(3)).tolist() == [2.0, 2.0, 2.0]


def test_shape_bytes_and_replica_groups():
    assert hlo.shape_bytes("(u8[1,622872]{1,0}, /*index=5*/bf16[8,4]{1,0}, f32[])") == 622872 + 64 + 4
    assert hlo.replica_groups("replica_groups={{0,1},{2,3}}, dimensions={0}") == [[0, 1], [2, 3]]
    assert hlo.replica_groups("replica_groups=[2,4]<=[8]") == [[0, 1, 2, 3], [4, 5, 6, 7]]
    assert hlo.replica_groups("replica_groups=[4,2]<=[2,4]T(1,0)") == [[0, 4], [1, 5], [2, 6], [3, 7]]
    assert hlo.replica_groups("source_target_pairs={{0,1},{1,0}}") == [[0, 1], [1, 0]]
    assert hlo.replica_groups("replica_groups=mesh['d'=4] {'d'}, use_global_device_ids=true") == [[0, 1, 2, 3]]
    assert hlo.replica_groups("replica_groups=mesh['h'=2,'g'=3] {'h'}") == [[0, 3], [1, 4], [2, 5]]


def test_thunks_in_command_buffers():
    sequence = """001: kCustomCall   [source       | next=002 (1) ] kCustomCall
870: kConditional  [prev=005 (1) | next=871 (1) ]
  branch_0:
    008: kAllToAll      [prev=007 (1) | next=000 (1)] kAllToAll
    000: kCommandBuffer [prev=008 (1) | sink        ]
        009: kCopy       [source       | next=017 (8)] kCopy
        017: kCustomCall [prev=016 (1) | sink        ] kCustomCall
    018: kCustomCall    [source       | next=019 (1)] kCustomCall
"""
    metadata = 'thunk_info {\n    profile_annotation: "ffi_call.18"\n    thunk_id: 17\n  }'
    thunks = hlo.read_thunks(sequence, metadata)
    assert [(t.id, t.in_command_buffer) for t in thunks] == [
        (1, False), (870, False), (8, False), (0, False), (9, True), (17, True), (18, False)]
    assert thunks[5].name == "ffi_call.18"
