"""The collectives' row ops (ops.stream_sizes, encode_rows, decode_rows,
decode_accumulate_rows; ffi/zipccl_cpu.cc) against the numpy reference: a
bucket's leaves cut into rows (reference.row_order: contiguous or interleaved,
zero-padded), each row's stream at a rung's capacity, byte for byte."""

import re

import jax
import jax.numpy as jnp
import ml_dtypes
import numpy as np
import pytest

from zipccl_jax import ops
from zipccl_jax import reference as ref
from zipccl_jax.dtypes import DTYPE_CODES
from conftest import PLATFORMS, on
from test_reference import make

DTYPES = [ml_dtypes.bfloat16, np.float16, np.float32]
K = 4
# (leaf sizes, unit): one leaf split evenly; leaves that end mid-row and mid-unit, interleaved by blocks with
# padding; interleaved by code-table groups; a row shorter than a unit (all of it the contiguous rest)
LAYOUTS = [((K * 3 * ref.BLOCK,), 0), ((5000, 1, 3 * ref.BLOCK + 17, 0, 9000), ref.BLOCK),
           ((K * 2 * ref.GROUP_BLOCKS * ref.BLOCK + 3,), ref.GROUP_BLOCKS * ref.BLOCK), ((1000, 999), ref.BLOCK)]
KINDS = ["gauss", "random_bits", "specials_in_gauss", "skewed_signs", "nans"]


def leaves_of(sizes, dtype, seed=0):
    """Leaves of mixed kinds (a random_bits stretch makes some rows store raw)."""
    kinds = KINDS * len(sizes)
    return [make(kinds[i], n, dtype, seed=seed + i) if n else np.zeros(0, dtype) for i, n in enumerate(sizes)]


def ids(p):
    return f"{len(p[0])}leaves-unit{p[1]}"


@pytest.mark.parametrize("platform", PLATFORMS)
@pytest.mark.parametrize("dtype", DTYPES, ids=lambda d: np.dtype(d).name)
@pytest.mark.parametrize("layout", LAYOUTS, ids=ids)
def test_rows_round_trip_at_the_agreed_capacity_byte_for_byte(dtype, layout, platform):
    """On each platform's codec; the sums bit for bit, NaN payloads included (FORMAT.md §7)."""
    sizes, unit = layout
    host = leaves_of(sizes, dtype)
    leaves = [on(platform, leaf) for leaf in host]
    flat = np.concatenate(host)
    rows = ref.cut_rows(flat, K, unit)
    m = rows.shape[1]
    streams = [ref.compress(r) for r in rows]
    got_sizes = jax.jit(lambda *x: ops.stream_sizes(x, K, unit=unit))(*leaves)
    assert np.asarray(got_sizes).tolist() == [len(s) for s in streams] == ref.stream_sizes(flat, K, unit).tolist()
    cap = max(map(len, streams)) + 5  # the agreed rung: the largest stream fits, the others are zero-padded
    outs = jax.jit(lambda *x: ops.encode_rows(x, K, cap, outputs=2, unit=unit))(*leaves)
    assert [o.shape for o in outs] == [(K // 2, cap)] * 2
    payload = np.concatenate([np.asarray(o) for o in outs])
    for row, s in zip(payload, streams):
        assert row.tobytes() == s + bytes(cap - len(s))
    # decoded into leaves of other sizes than the sender's (the same flat array): rows are placed, not leaves
    back = jax.jit(lambda *p: ops.decode_rows(p, (7, flat.size - 7), dtype, unit=unit))(*outs)
    assert np.concatenate([np.asarray(b) for b in back]).tobytes() == flat.tobytes()
    sums = jax.jit(lambda *p: ops.decode_accumulate_rows(p, (m - 1, 1), dtype))(*outs)
    assert np.concatenate([np.asarray(s) for s in sums]).tobytes() == ref.accumulate(list(rows), dtype).tobytes()
    # the static transfer's encode (issue 25): the streams whole at the full capacity, and their lengths:
    # on CUDA the lengths the encoder wrote (no size pass), on the CPU those of stream_sizes
    full = ref.max_stream_bytes(m, dtype)
    whole, lengths = jax.jit(lambda *x: ops.encode_rows(x, K, full, unit=unit, lengths=True))(*leaves)
    assert np.asarray(lengths).tolist() == [len(s) for s in streams]
    for row, s in zip(np.asarray(whole), streams):
        assert row.tobytes() == s + bytes(full - len(s))
    raw = jax.jit(lambda *x: ops.encode_rows(x, K, ref.max_stream_bytes(m, dtype), outputs=K, unit=unit,
                                             raw=True))(*leaves)
    for j, o in enumerate(raw):
        assert o.tobytes() == ref.header(DTYPE_CODES[np.dtype(dtype).name], ref.FLAG_STORED_RAW, m) + rows[j].tobytes()


@pytest.mark.parametrize("dtype", DTYPES, ids=lambda d: np.dtype(d).name)
@pytest.mark.parametrize("layout", LAYOUTS, ids=ids)
def test_coding_with_the_size_pass_plans_gives_the_same_bytes_at_the_tightest_capacity(dtype, layout):
    sizes, unit = layout
    leaves = leaves_of(sizes, dtype, seed=7)
    streams = [ref.compress(r) for r in ref.cut_rows(np.concatenate(leaves), K, unit)]
    got, plans = jax.jit(lambda *x: ops.stream_sizes(x, K, unit=unit, plans=True))(*leaves)
    assert np.asarray(got).tolist() == [len(s) for s in streams]
    tight = max(map(len, streams))  # the largest stream fills its row exactly: nothing may be written past it
    for with_plans in (True, False):
        outs = jax.jit(lambda p, *x: ops.encode_rows(x, K, tight, outputs=K, unit=unit,
                                                     plans=p if with_plans else None))(plans, *leaves)
        assert [np.asarray(o).tobytes() for o in outs] == [s + bytes(tight - len(s)) for s in streams]
    short = [len(s) for s in streams].index(tight)
    with pytest.raises(Exception, match=rf"row {short}'s stream is longer than the capacity {tight - 1}"):
        jax.block_until_ready(jax.jit(lambda p, *x: ops.encode_rows(x, K, tight - 1, outputs=K, unit=unit,
                                                                    plans=p))(plans, *leaves))


@pytest.mark.parametrize("dtype", DTYPES, ids=lambda d: np.dtype(d).name)
def test_an_accumulated_row_taken_from_local_leaves_gives_the_same_bits(dtype):
    """Rows of two reduce tiles (ffi/accumulate_cpu.h: 16 blocks), the local row's second from its second leaf."""
    rows = ref.cut_rows(np.concatenate(leaves_of((K * (ref.GROUP_BLOCKS + 4) * ref.BLOCK + 5,), dtype, seed=3)), K, 0)
    m = rows.shape[1]
    cap = ref.max_stream_bytes(m, dtype)
    payload = np.zeros((K, cap), np.uint8)
    for j, r in enumerate(rows):
        s = ref.compress(r)
        payload[j, :len(s)] = np.frombuffer(s, np.uint8)
    want = ref.accumulate(list(rows), dtype).tobytes()
    for own in range(K):
        broken = payload.copy()
        broken[own, 16:19] = 0xFF  # the own row is not decoded: its corrupt stream goes unread
        op = jax.jit(lambda p, i, a, b: ops.decode_accumulate_rows([p], (m - 1, 1), dtype, local=(i, [a, b])))
        sums = op(broken, np.int32(own), rows[own][:7], rows[own][7:])
        assert np.concatenate([np.asarray(x) for x in sums]).tobytes() == want
    with pytest.raises(Exception, match="local row index out of range"):
        jax.block_until_ready(op(payload, np.int32(K), rows[0][:7], rows[0][7:]))
    with pytest.raises(Exception, match="the local row does not match the rows"):
        jax.block_until_ready(op(payload, np.int32(0), rows[0][:7], rows[0][8:]))


def test_a_bad_plan_is_refused():
    x = make("gauss", 3 * ref.BLOCK, np.float32)
    cap = ref.max_stream_bytes(x.size, np.float32)
    _, plans = jax.jit(lambda a: ops.stream_sizes(a, 1, plans=True))(x)
    encode = jax.jit(lambda p, a: ops.encode_rows(a, 1, cap, plans=p))
    bad = np.array(plans)
    bad[0, 16] = 13  # symbol 0's code length (the plan's lengths follow the 16 block refs): over 12
    with pytest.raises(Exception, match="corrupt row plan"):
        jax.block_until_ready(encode(bad, x))
    with pytest.raises(Exception, match="the plans do not hold one plan per row"):
        jax.block_until_ready(encode(np.asarray(plans)[:, 1:], x))


def test_a_stream_longer_than_the_capacity_is_refused():
    x = make("random_bits", 3 * ref.BLOCK, np.float32)
    with pytest.raises(Exception, match=r"row 0's stream is longer than the capacity 1000 its size pass agreed on"):
        jax.block_until_ready(jax.jit(lambda a: ops.encode_rows(a, 1, 1000))(x))


def test_a_corrupt_row_is_named():
    x = make("gauss", 2 * ref.BLOCK, np.float32)
    cap = ref.max_stream_bytes(ref.BLOCK, np.float32)
    outs = [np.array(o) for o in jax.jit(lambda a: ops.encode_rows(a, 2, cap, outputs=2))(x)]
    outs[1][0, ref.HEADER_BYTES + 7] ^= 0x80  # row 1, block 0's descriptor: a reserved bit (FORMAT.md §2)
    for op in (lambda *p: ops.decode_rows(p, (x.size,), np.float32), lambda *p: ops.decode_accumulate_rows(
            p, (ref.BLOCK,), np.float32)):
        with pytest.raises(Exception, match=r"zipccl: corrupt payload \(stream 1\)"):
            jax.block_until_ready(jax.jit(op)(*outs))


def test_the_first_failing_row_is_named_though_a_later_one_fails_sooner():
    """The reduce step sums a tile (16 blocks) of every row at a time; its verdict is still the first failing
    row's, as summing row by row would give: row 1 fails in its last block, row 2 in its first."""
    m = (ref.GROUP_BLOCKS + 2) * ref.BLOCK
    x = make("gauss", 3 * m, np.float32)
    cap = ref.max_stream_bytes(m, np.float32)
    (payload,) = [np.array(o) for o in jax.jit(lambda a: ops.encode_rows(a, 3, cap))(x)]
    payload[2, 16 + 7] ^= 0x80  # row 2, block 0's descriptor: a reserved bit (FORMAT.md §2)
    op = jax.jit(lambda p: ops.decode_accumulate_rows([p], (m,), np.float32))
    with pytest.raises(Exception, match=r"zipccl: corrupt payload \(stream 2\)"):
        jax.block_until_ready(op(payload))
    payload[1, 16 + 8 * (ref.GROUP_BLOCKS + 1) + 7] ^= 0x80  # row 1, its last block's
    with pytest.raises(Exception, match=r"zipccl: corrupt payload \(stream 1\)"):
        jax.block_until_ready(op(payload))


def test_bad_arguments_get_clear_errors():
    x = jnp.zeros(8, jnp.float32)
    with pytest.raises(ValueError, match="one dtype"):
        ops.stream_sizes([x, x.astype(jnp.bfloat16)], 2)
    with pytest.raises(ValueError, match="do not split into 3 outputs"):
        ops.encode_rows(x, 4, 64, outputs=3)
    parts = [jnp.zeros((1, 64), jnp.uint8), jnp.zeros((1, 80), jnp.uint8)]
    with pytest.raises(Exception, match="received parts differ in capacity"):
        jax.block_until_ready(jax.jit(lambda *p: ops.decode_rows(p, (8,), jnp.float32))(*parts))


def test_cpu_only_options_refuse_other_platforms_by_name_when_lowered():
    """stream_sizes(plans=True), encode_rows(plans=...) and decode_accumulate_rows(local=...) exist on
    the CPU only: lowered for CUDA (alone, or beside the CPU as jax.export does) they raise before
    XLA compiles anything, naming the option and the platforms; lowered for the CPU they lower."""
    x = jnp.zeros(2 * ref.BLOCK, jnp.bfloat16)
    cap = ref.max_stream_bytes(ref.BLOCK, np.dtype(jnp.bfloat16))
    plans = jnp.zeros((2, ops._zipccl_cpu.plan_bytes(ref.BLOCK)), jnp.uint8)
    part = jnp.zeros((2, cap), jnp.uint8)
    cases = {"stream_sizes(plans=True)": (lambda a: ops.stream_sizes(a, 2, plans=True), (x,)),
             "encode_rows(plans=...)": (lambda a, p: ops.encode_rows(a, 2, cap, plans=p), (x, plans)),
             "decode_accumulate_rows(local=...)": (
                 lambda p, a: ops.decode_accumulate_rows([p], (ref.BLOCK,), jnp.bfloat16, local=(0, [a])),
                 (part, x[:ref.BLOCK]))}
    for option, (fn, args) in cases.items():
        traced = jax.jit(fn).trace(*args)
        assert "zipccl_" in traced.lower(lowering_platforms=("cpu",)).as_text()
        for platforms in (("cuda",), ("cpu", "cuda")):
            with pytest.raises(NotImplementedError, match=re.escape(
                    f"zipccl: {option} runs on the CPU only; this computation is lowered for {', '.join(platforms)}")):
                traced.lower(lowering_platforms=platforms)


class FakeCudaModule:
    """Stands in for _zipccl_cuda (absent from CPU-only builds): records the row workspaces asked for."""

    def row_workspace_bytes(self, target, dtype, rows, size, unit, leaves, part_rows):
        self.asked = getattr(self, "asked", []) + [(target, dtype, rows, size, unit, leaves, part_rows)]
        return 1000 + rows + part_rows


def test_a_cuda_lowering_of_the_row_ops_adds_status_words_and_workspaces(monkeypatch):
    """On CUDA the decoders return a status word per row and every op a workspace of the bytes the
    CUDA module asks for (tests/test_cuda_emulation.py runs the handlers); on CPU neither."""
    from zipccl_jax import _ffi

    _ffi.register()
    fake = FakeCudaModule()
    monkeypatch.setattr(_ffi, "cuda_module", lambda: fake)
    a, b = jnp.zeros(5000, jnp.bfloat16), jnp.zeros(3000, jnp.bfloat16)
    parts = [jnp.zeros((1, 900), jnp.uint8), jnp.zeros((3, 900), jnp.uint8)]

    def ops_of(a, b, p0, p1):
        return (ops.stream_sizes([a, b], K, unit=ref.BLOCK), ops.encode_rows([a, b], K, 900, outputs=K),
                ops.decode_rows([p0, p1], (8000,), jnp.bfloat16), ops.decode_accumulate_rows([p0, p1], (10, 1990),
                                                                                             jnp.bfloat16))

    def results(platform):
        text = jax.jit(ops_of).trace(a, b, *parts).lower(lowering_platforms=(platform,)).as_text()
        return {t: re.findall(r"tensor<([^>]*)>", r) for t, r in re.findall(r"custom_call @(zipccl_\w+)\(.*-> (.*)$",
                                                                           text, re.M)}

    assert results("cuda") == {"zipccl_stream_sizes": ["4xui32", "1004xui8"],
                               "zipccl_encode_rows": ["1x900xui8"] * K + ["1004xui8"],
                               "zipccl_decode_rows": ["8000xbf16", "4xui32", "1007xui8"],
                               "zipccl_decode_accumulate_rows": ["10xbf16", "1990xbf16", "4xui32", "1005xui8"]}
    assert sorted(set(fake.asked)) == [("zipccl_decode_accumulate_rows", 1, 1, 2000, 0, 2, 4),
                                       ("zipccl_decode_rows", 1, 4, 8000, 0, 1, 3),
                                       ("zipccl_encode_rows", 1, K, 8000, 0, 2, 0),
                                       ("zipccl_stream_sizes", 1, K, 8000, ref.BLOCK, 2, 0)]
    assert results("cpu") == {"zipccl_stream_sizes": ["4xui32"], "zipccl_encode_rows": ["1x900xui8"] * K,
                              "zipccl_decode_rows": ["8000xbf16"], "zipccl_decode_accumulate_rows": ["10xbf16",
                                                                                                     "1990xbf16"]}


def test_the_cuda_modules_row_workspaces():
    """The real module's sizes (when built with the CUDA codec): an encode holds what a size pass
    does and the assembled streams; rows lying as one leaf need no gathered copy; a bad target is refused."""
    from zipccl_jax import _ffi

    module = _ffi.cuda_module()
    if module is None:
        pytest.skip("built without the CUDA codec (CI builds it)")
    size = K * 3 * ref.BLOCK

    def bytes_of(target, leaves=1, unit=0):
        return module.row_workspace_bytes(target, 1, K, size, unit, leaves, 1)

    sizes, encode = bytes_of("zipccl_stream_sizes"), bytes_of("zipccl_encode_rows")
    assert encode >= sizes + K * ref.max_stream_bytes(size // K, ml_dtypes.bfloat16)
    assert bytes_of("zipccl_encode_rows", leaves=2) >= encode + size * 2  # the rows gathered from two leaves
    assert bytes_of("zipccl_decode_rows", unit=ref.BLOCK) >= size * 2 > bytes_of("zipccl_decode_rows")
    with pytest.raises(ValueError, match="no row workspace for target zipccl_compress"):
        bytes_of("zipccl_compress")
