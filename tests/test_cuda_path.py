"""What zipccl_jax does for the CUDA codec, checked on the CPU: the custom calls a CUDA lowering
emits (status words and a workspace that XLA allocates), the errors read from status words, the
eager-raise policy, the command-buffer trait at registration. The handlers themselves run in
tests/test_cuda_emulation.py."""

import re

import jax
import jax.numpy as jnp
import numpy as np
import pytest
from jax.sharding import NamedSharding
from jax.sharding import PartitionSpec as P

import zipccl_jax as zc
from zipccl_jax import _ffi, ops
from zipccl_jax import reference as ref
from zipccl_jax.bench.data import gaussian

N = 5000


class FakeCudaModule:
    """Stands in for _zipccl_cuda (absent from CPU-only builds): records the workspace sizes asked for."""

    def __init__(self):
        self.asked = []

    def workspace_bytes(self, target, dtype, batch, n, rows=1):
        self.asked.append((target, dtype, batch, n, rows))
        return 1000 + 7 * batch + n

    def row_workspace_bytes(self, target, dtype, rows, size, unit, leaves, part_rows):
        return 1000 + rows + size


def custom_call_results(fn, *args, platform):
    """{target: result types} of the zipccl custom calls in fn's lowering for `platform`."""
    text = jax.jit(fn).trace(*args).lower(lowering_platforms=(platform,)).as_text()
    calls = re.findall(r"custom_call @(zipccl_\w+)\(.*-> (.*)$", text, re.M)
    return {target: re.findall(r"tensor<([^>]*)>", results) for target, results in calls}


def test_a_cuda_lowering_adds_status_words_and_a_workspace_sized_by_the_cuda_module(monkeypatch):
    """On CUDA each call returns its status words (decoders) and a workspace of exactly the bytes the
    CUDA module asks for; on CPU the calls keep the CPU handlers' results (lax.platform_dependent:
    each lowering holds only its platform's call)."""
    _ffi.register()  # the real targets; then the fake, before any codec call (JAX caches traces)
    fake = FakeCudaModule()
    monkeypatch.setattr(_ffi, "cuda_module", lambda: fake)
    x = gaussian(3 * N, jnp.bfloat16).reshape(3, N)
    cap = zc.stream_capacity(N, jnp.bfloat16)
    payload, rows = jnp.zeros((3, cap), jnp.uint8), jnp.zeros((2, 4, cap), jnp.uint8)

    def codec(x, payload, rows):
        return (zc.compress(x, batch_dims=1), ops.decompress_items(payload, m=N, dtype=jnp.bfloat16),
                zc.decompress_accumulate(rows, m=N, dtype=jnp.bfloat16, out_dtype=jnp.float32))

    assert custom_call_results(codec, x, payload, rows, platform="cuda") == {
        "zipccl_compress": [f"3x{cap}xui8", "3xui32", f"{1000 + 21 + N}xui8"],
        "zipccl_decompress": [f"3x{N}xbf16", "3xui32", f"{1000 + 21 + N}xui8"],
        "zipccl_decompress_accumulate": [f"2x{N}xf32", "2x4xui32", f"{1000 + 14 + N}xui8"]}
    assert sorted(set(fake.asked)) == [("zipccl_compress", 1, 3, N, 1), ("zipccl_decompress", 1, 3, N, 1),
                                       ("zipccl_decompress_accumulate", 1, 2, N, 4)]  # 4 rows an item
    assert custom_call_results(codec, x, payload, rows, platform="cpu") == {
        "zipccl_compress": [f"3x{cap}xui8", "3xui32"], "zipccl_decompress": [f"3x{N}xbf16"],
        "zipccl_decompress_accumulate": [f"2x{N}xf32"]}
    # the platform's branch is a constant case that XLA removes: nothing of it is left to run
    assert "conditional" not in jax.jit(codec).lower(x, payload, rows).compile().as_text()


def cpu_error(fn) -> str:
    with pytest.raises(jax.errors.JaxRuntimeError) as e:
        jax.block_until_ready(fn())
    return str(e.value)


def test_status_words_give_the_cpu_codecs_error_and_an_eager_gpu_decode_raises_it(monkeypatch):
    """The words a CUDA decoder returns (0, or the decoder's error code per row) are worded as the
    CPU handler words the same corrupt payload, naming the stream (decompress) or the item
    (accumulate); decoded eagerly on a GPU, that error is raised, with the CPU's exception type."""
    streams = [ref.compress(gaussian(N, jnp.float32, seed=i)) for i in range(3)]
    cap = max(map(len, streams))
    rows = np.stack([np.frombuffer(s + bytes(cap - len(s)), np.uint8) for s in streams])
    rows[1, ref.HEADER_BYTES + ref.DESC_BYTES - 1] |= 0x80  # stream 1, block 0's descriptor: a reserved bit (§2)
    decoded = cpu_error(lambda: ops.decompress_items(jnp.asarray(rows), m=N, dtype=jnp.float32))
    summed = cpu_error(lambda: zc.decompress_accumulate(jnp.asarray(rows[[0, 2, 0, 1]].reshape(2, 2, cap)), m=N,
                                                        dtype=jnp.float32))
    words = np.array([0, 13, 0], np.uint32)  # 13: kErrDescriptor of the decoders' Status (zipccl_format.h)
    assert decoded == "DATA_LOSS: " + ops.corrupt_payload_error(words)
    assert summed == "DATA_LOSS: " + ops.corrupt_payload_error(np.array([0, 0, 0, 13], np.uint32), rows_per_item=2)
    assert ops.corrupt_payload_error(np.zeros((2, 3), np.uint32), rows_per_item=3) is None

    monkeypatch.setattr(ops, "_on_gpu", lambda _: True)
    out = jnp.zeros(3)
    with pytest.raises(jax.errors.JaxRuntimeError) as e:
        ops._checked(out, jnp.asarray(words), with_status=False)
    assert str(e.value) == decoded
    assert ops._checked(out, jnp.asarray(words), with_status=True)[1] is not None
    # traced (under jit), the words are not known: the poisoned output stands, nothing is raised
    assert jax.jit(lambda w: ops._checked(out, w, with_status=False))(jnp.asarray(words)).shape == (3,)


def test_cuda_targets_are_registered_as_command_buffer_compatible(monkeypatch):
    """The handlers declare the trait themselves; the registration passes it as well, for jaxlibs
    that take it only from there. CPU targets get no trait."""
    from jaxlib import xla_client

    class Module:
        command_buffer_compatible = ("zipccl_decompress",)

        @staticmethod
        def registrations():
            return {"zipccl_compress": "c", "zipccl_decompress": "d"}

    registered = []
    monkeypatch.setattr(_ffi, "cuda_module", lambda: Module)
    monkeypatch.setattr(jax.ffi, "register_ffi_target",
                        lambda name, capsule, platform, **kw: registered.append((platform, name, kw)))
    assert _ffi.register.__wrapped__() == ("cpu", "CUDA")
    assert ("CUDA", "zipccl_compress", {}) in registered
    assert ("CUDA", "zipccl_decompress", {"traits": xla_client.CustomCallTargetTraits.COMMAND_BUFFER_COMPATIBLE}) \
        in registered
    assert all(kw == {} for platform, _, kw in registered if platform == "cpu")


@pytest.mark.skipif(_ffi.cuda_module() is None, reason="built without the CUDA codec (CI builds it)")
def test_the_cuda_modules_workspaces_cover_a_vmapped_call():
    """Under vmap a call's workspace is [B, bytes for one]: the handler then needs the bytes for B times
    the batch, which must not exceed B times the bytes for one. Every target is declared compatible."""
    module = _ffi.cuda_module()
    assert module.command_buffer_compatible == _ffi.TARGETS
    for target in (t for t in _ffi.TARGETS if t not in _ffi.ROW_TARGETS):  # test_row_ops checks those
        for dtype in (1, 2, 3):
            for batch, n in [(1, 0), (1, 1), (3, 4097), (2, 65537), (8, 1 << 20)]:
                one = module.workspace_bytes(target, dtype, batch, n, 3)
                assert all(module.workspace_bytes(target, dtype, b * batch, n, 3) <= b * one for b in (2, 3, 8))


COLLECTIVES = {
    "psum": lambda a: zc.zip_psum(a, "d", strategy=zc.strategy.Pinned("compressed reduce_scatter+all_gather")),
    "psum all_gather+local_reduce": lambda a: zc.zip_psum(
        a, "d", strategy=zc.strategy.Pinned("compressed all_gather+local_reduce")),
    "all_gather": lambda a: zc.zip_all_gather(a, "d", strategy="compressed"),
    "psum_scatter": lambda a: zc.zip_psum_scatter(a, "d", strategy="compressed"),
    "all_to_all": lambda a: zc.zip_all_to_all(a, "d", 0, 0, strategy="compressed"),
    "ppermute": lambda a: zc.zip_ppermute(a, "d", [(0, 3), (3, 5), (6, 0)], strategy="compressed"),
}


@pytest.mark.parametrize("name", COLLECTIVES)
def test_a_cuda_lowering_moves_streams_with_no_branch_loop_or_size_consensus(monkeypatch, name):
    """Lowered for CUDA alone, every compressed collective is straight-line code: one encode that
    returns its streams' lengths (no size pass), a static-size collective for the bulk with the
    spill lengths and one ragged_all_to_all, no pmax; lowered for the CPU it keeps the capacity ladder
    (a case over the rungs, after a size pass and a pmax). The compiled schedule on 8 x H100 is
    tests/test_schedule.py's."""
    _ffi.register()
    monkeypatch.setattr(_ffi, "cuda_module", lambda: FakeCudaModule())
    mesh = jax.make_mesh((8,), ("d",), devices=jax.devices("cpu")[:8])
    f = jax.jit(jax.shard_map(lambda a: COLLECTIVES[name](a[0])[None], mesh=mesh, in_specs=P("d"),
                              out_specs=P("d"), check_vma=False))
    x = jax.device_put(np.zeros((8, 8, 3000), jnp.bfloat16), NamedSharding(mesh, P("d")))
    texts, plans = {}, {}
    for p in ("cuda", "cpu"):
        zc.strategy.last_plans(clear=True)
        texts[p] = f.trace(x).lower(lowering_platforms=(p,)).as_text()
        plans[p] = zc.strategy.last_plans(clear=True)
    cuda, cpu = texts["cuda"], texts["cpu"]
    # the strategy models what each lowering runs: the static transfer (no size pass) on CUDA, the ladder on CPU
    assert plans["cuda"] and all(p.compress and p.terms.size_pass == 0 for p in plans["cuda"])
    assert plans["cpu"] and all(p.compress and p.terms.size_pass > 0 for p in plans["cpu"])
    # (the cases left in the CUDA text are lax.platform_dependent's, on a constant: XLA folds them; the
    # compiled program has no conditional at all: test_schedule.py)
    for construct in ("stablehlo.if", "stablehlo.while", "zipccl_stream_sizes", "stablehlo.all_reduce"):
        assert construct not in cuda, construct
    phases = 2 if name == "psum" else 1
    assert cuda.count("@ragged_all_to_all(") == phases
    assert len(re.findall(r"custom_call @zipccl_encode_rows\(.*-> \(tensor<\d+x\d+xui8>, tensor<\d+xui32>", cuda)) \
        == phases
    assert "ragged_all_to_all" not in cpu and "zipccl_stream_sizes" in cpu and "stablehlo.all_reduce" in cpu


def test_a_cuda_transfer_past_int32_offsets_is_refused_by_name(monkeypatch):
    """ragged_all_to_all's offsets are int32 without jax_enable_x64: a transfer whose streams span
    2**31 bytes or more is refused when lowering, naming the sizes and what to do."""
    _ffi.register()
    monkeypatch.setattr(_ffi, "cuda_module", lambda: FakeCudaModule())
    mesh = jax.make_mesh((8,), ("d",), devices=jax.devices("cpu")[:8])
    f = jax.jit(jax.shard_map(lambda a: COLLECTIVES["all_to_all"](a[0])[None], mesh=mesh, in_specs=P("d"),
                              out_specs=P("d"), check_vma=False))
    x = jax.ShapeDtypeStruct((8, 8, 1 << 27), jnp.bfloat16, sharding=NamedSharding(mesh, P("d")))
    with pytest.raises(ValueError, match=r"8 streams of up to 268435472 bytes on CUDA needs offsets past 2\*\*31"):
        f.trace(x).lower(lowering_platforms=("cuda",))
