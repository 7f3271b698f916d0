"""The CUDA codec's XLA FFI handlers (format version 6) run on the CPU the way a GPU runs them, against
the numpy reference (zipccl_jax/reference.py; the sums against reference.accumulate, which no
format version changes).

tests/cuda_emulation.cc compiles ffi/zipccl_cuda.cu with g++ (tests/cuda_host_shim.h stands in for
the CUDA runtime) and calls the real handlers -- Compress, Decompress, DecompressAccumulate and the
collectives' row ops -- on host buffers, each with the workspace its size function asks for (every
array followed by a gap that ASan reports), and the timing functions of `python -m zipccl_jax
selftest` and `bench gpu`. Every handler call is checked to make no host synchronisation (the shim
counts stream and event waits and host<->device copies); a decoder's verdict is read from the status
words it returns, as zipccl_jax.ops reads them (0, or the decoder's error code alone), and a corrupt
item's output must be poisoned (all-one bytes). Every CUDA thread is a std::thread; several CUDA
blocks of a launch run at once, each with its own shared memory (garbage at the start of every
block); the 32 lanes of a warp meet in lockstep at every warp intrinsic and exchange their values
there; __syncthreads is a real barrier. A lane that skips an intrinsic its warp reaches, or a thread
that leaves the kernel while its block waits at __syncthreads, fails the run with a message naming
them. Grids are sized, as on a GPU, from the emulated device's SM count.

Under AddressSanitizer and UBSan the runs check the handlers' bookkeeping byte for byte: batching
(the kernels take their stream from blockIdx.x), streams at capacities that are not a multiple of 4
(every odd bfloat16 or float16 length: the kernels align their word accesses to the address),
workspace carving, error reporting, argument checks; under ThreadSanitizer, that threads and blocks
order their shared and global accesses (an injected race must be reported). What needs a GPU stays
unchecked: the device's weaker memory model, warp scheduling and speed, device memory errors
(compute-sanitizer, with tests/test_cuda.py), GPU arithmetic (NaN payloads of sums: the emulation's
float add is a GPU's, tests/cuda_host_shim.h) and XLA's capture of the handlers into command
buffers."""

import itertools
import re
import struct
import subprocess
import zlib
from functools import lru_cache
from pathlib import Path

import numpy as np
import pytest

from zipccl_jax import reference as ref  # the sums and the rows: format-independent
from zipccl_jax import reference as r6
from zipccl_jax.bench.data import DTYPES, gaussian, random_bits, special_values
from zipccl_jax.ops import corrupt_payload_error
from test_codec_cpu import mutate
from test_cuda6_emulation import (build as build_emulator, category, fast_path_cases, group_lengths, group_safe_ref,
                                  hostile_cases, kinds, status_messages)

ROOT = Path(__file__).resolve().parents[1]
CODES = {"bfloat16": 1, "float16": 2, "float32": 3}
SIZES = [0, 1, 4095, 4096, 4097, 65537]  # 65537: 17 blocks in two groups; odd sizes: unaligned rows
# (SMs, resident CUDA blocks): the emulated device. One SM: small grids whose CUDA blocks loop over
# their work, one at a time; several SMs: bigger grids, several blocks racing at once.
LAUNCHES = [(1, 1), (4, 3)]
COMPRESS, DECOMPRESS, ACCUMULATE, TIME = 0, 1, 2, 3
CORRUPT = "zipccl: corrupt payload (stream {}): "


def build(directory, sanitizers):
    """The handlers' emulator (tests/cuda_emulation.cc), built with -fsanitize=sanitizers."""
    return build_emulator(directory, sanitizers, "cuda_emulation.cc")


@pytest.fixture(scope="module")
def emulator(tmp_path_factory):
    return build(tmp_path_factory.mktemp("asan"), "address,undefined")


@pytest.fixture(scope="module")
def tsan_emulator(tmp_path_factory):
    return build(tmp_path_factory.mktemp("tsan"), "thread")


def run_emulator(exe, requests, launch, inject=0, smem_block=None):
    """smem_block: the shared memory a CUDA block may have (default an H100's)."""
    data = b"".join(struct.pack("<8q", *(list(h) + [0] * (8 - len(h)))) + body for h, body in requests)
    extra = [] if smem_block is None else [str(smem_block)]
    return subprocess.run([str(exe), *map(str, launch), str(inject), *extra], input=data, capture_output=True,
                          timeout=600)


def replies_of(run, count):
    """The emulator's replies: [(error message, output, status words, host syncs)]."""
    assert run.returncode == 0, run.stderr.decode()[-3000:]
    replies, pos = [], 0
    while pos < len(run.stdout):
        fields = []
        for _ in range(4):
            (size,) = struct.unpack_from("<q", run.stdout, pos)
            fields.append(run.stdout[pos + 8 : pos + 8 + size])
            pos += 8 + size
        replies.append((fields[0].decode(), fields[1], np.frombuffer(fields[2], np.uint32),
                        struct.unpack("<q", fields[3])[0]))
    assert len(replies) == count
    return replies


def verdict(header, message, out, status):
    """The handler's error, else what zipccl_jax.ops raises for its status words (the CPU codec's
    wording), "" when every stream decoded. A word holds the decoder's error code alone (the format's
    statuses end at 15), and a corrupt item's output must be all-one bytes (NaN)."""
    if message or header[0] not in (DECOMPRESS, ACCUMULATE) or not status.size:
        return message
    assert status.max() <= 15, f"status words hold only the decoder's codes: {status}"
    rows = header[4] if header[0] == ACCUMULATE else 1
    corrupt = status.reshape(-1, rows).any(axis=1)
    items = np.frombuffer(out, np.uint8).reshape(len(corrupt), -1)
    assert all((item == 0xFF).all() for item in items[corrupt]), "a corrupt item's output is not poisoned"
    return corrupt_payload_error(status, rows) or ""


def emulate(exe, requests, launch=LAUNCHES[-1], smem_block=None):
    """Runs requests (header tuple, input bytes) -> [(error message, output bytes)]. The handlers
    must not synchronise with the host."""
    replies = replies_of(run_emulator(exe, requests, launch, smem_block=smem_block), len(requests))
    for (header, _), (_, _, _, syncs) in zip(requests, replies):
        assert syncs == 0, f"request {header} made {syncs} host synchronisations"
    return [(verdict(h, m, out, st), out) for (h, _), (m, out, st, _) in zip(requests, replies)]


def compress_request(items):
    """items: [batch, n], into rows of the worst-case length."""
    batch, n = items.shape
    return (COMPRESS, CODES[items.dtype.name], n, batch, r6.max_stream_bytes(n, items.dtype)), items.tobytes()


def decompress_request(streams, dtype, n, cap=None):
    """Streams padded with random bytes to a common row length, cap or the longest."""
    cap = max(map(len, streams)) if cap is None else cap
    pad = np.random.default_rng(cap).integers(0, 256, cap, np.uint8).tobytes()
    return (DECOMPRESS, CODES[np.dtype(dtype).name], n, len(streams), cap), b"".join(s + pad[len(s) :] for s in streams)


@lru_cache(maxsize=None)
@np.errstate(over="ignore")
def items_of(dtype, n):
    """Items of every sort the encoder treats differently, [6, n]: coded groups, a ReLU's zeros and
    flips, STORED_RAW, specials among coded values, all zeros, a ref a block."""
    specials = np.resize(special_values(dtype), n)
    mixed = gaussian(n, dtype, seed=n + 3)
    mixed[::37] = specials[::37]
    scales = (gaussian(n, "float32", seed=n + 4) * np.exp2(np.arange(n) // r6.BLOCK * 9 - 30)).astype(dtype)
    return np.stack([gaussian(n, dtype, seed=n), -np.maximum(gaussian(n, dtype, seed=n + 1), 0),
                     random_bits(n, dtype, seed=n + 2), mixed, np.zeros(n, dtype), scales])


@lru_cache(maxsize=None)
def streams_of(dtype, n):
    return [r6.compress(x) for x in items_of(dtype, n)]


@pytest.mark.parametrize("launch", LAUNCHES, ids=lambda l: f"sms{l[0]}_resident{l[1]}")
@pytest.mark.parametrize("dtype", DTYPES)
def test_compress_is_byte_identical_to_reference(emulator, dtype, launch):
    """A batch of every sort of item per size, in one handler call each (rows at the worst-case
    capacity: not a multiple of 4 for odd 16-bit sizes), then every kind of data the encoder treats
    differently as a batch of one."""
    cases = kinds(dtype)
    requests = [compress_request(items_of(dtype, n)) for n in SIZES]
    requests += [compress_request(x[None]) for x in cases.values()]
    expected = [streams_of(dtype, n) for n in SIZES] + [[r6.compress(x)] for x in cases.values()]
    for (err, out), streams in zip(emulate(emulator, requests, launch), expected):
        assert err == ""
        batch = len(streams)
        sizes = np.frombuffer(out[: 4 * batch], np.uint32)
        rows = np.frombuffer(out[4 * batch :], np.uint8).reshape(batch, -1)
        for i, (size, row, stream) in enumerate(zip(sizes, rows, streams)):
            assert row[:size].tobytes() == stream, (i, len(stream), size)


@pytest.mark.parametrize("launch", LAUNCHES, ids=lambda l: f"sms{l[0]}_resident{l[1]}")
@pytest.mark.parametrize("dtype", DTYPES)
def test_reference_streams_decode_bit_exact(emulator, dtype, launch):
    """Each size's streams as one batch, padded with garbage to the worst case."""
    requests = [decompress_request(streams_of(dtype, n), dtype, n, r6.max_stream_bytes(n, dtype)) for n in SIZES]
    for n, (err, out) in zip(SIZES, emulate(emulator, requests, launch)):
        assert err == ""
        assert out == items_of(dtype, n).tobytes(), n


def assert_same_sums(got, expected):
    """Bit for bit, NaN payloads and signs included (FORMAT.md §8): the emulation's float adds are
    a GPU's (canonical NaNs, tests/cuda_host_shim.h), so this holds only where the kernels apply
    the format's NaN rule."""
    assert got.dtype == expected.dtype and got.shape == expected.shape
    a, b = (v.view(f"u{expected.itemsize}") for v in (got, expected))
    bad = np.flatnonzero(a != b)
    assert not bad.size, f"{bad.size} sums differ, the first at {bad[0]}: {a[bad[0]]:#x}, expected {b[bad[0]]:#x}"


def accumulate_request(payload, dtype, n, out_dtype):
    """payload: [batch, k, cap] uint8."""
    batch, k, cap = payload.shape
    return (ACCUMULATE, CODES[np.dtype(dtype).name], n, batch, k, cap, CODES[np.dtype(out_dtype).name]), payload.tobytes()


@pytest.mark.parametrize("launch", LAUNCHES, ids=lambda l: f"sms{l[0]}_resident{l[1]}")
@pytest.mark.parametrize("dtype", DTYPES)
def test_accumulate_matches_reference(emulator, dtype, launch):
    """Items of 1, 2 and 3 rows each (coded, STORED_RAW and all-zero rows mixed), summed in row order
    to the payload dtype and to float32: the rows of 8, 4 and 2 blocks decoded at once (a partial
    round at the end of 17 blocks)."""
    requests, expected = [], []
    for k, n in itertools.product((1, 2, 3), SIZES):
        streams = streams_of(dtype, n)
        cap = r6.max_stream_bytes(n, dtype)
        batch = len(streams) // k
        payload = np.frombuffer(decompress_request(streams[: batch * k], dtype, n, cap)[1], np.uint8)
        payload = payload.reshape(batch, k, cap)
        for out_dtype in (dtype, np.float32):
            requests.append(accumulate_request(payload, dtype, n, out_dtype))
            rows = items_of(dtype, n)[: batch * k].reshape(batch, k, n)
            expected.append(np.concatenate([ref.accumulate(list(r), out_dtype) for r in rows]))
    for (err, out), sums in zip(emulate(emulator, requests, launch), expected):
        assert err == ""
        assert_same_sums(np.frombuffer(out, sums.dtype), sums)


@lru_cache(maxsize=None)
def many_rows(dtype):
    """11 rows, each its own stream of another kind or scale (each with its own group codes, which
    hold codes of 12 bits), as an item of the reduce step: (rows, streams, payload [1, 11, cap])."""
    k, n = 11, 65536 + 4097  # two groups of codes a row, the second partial
    rows = np.stack([gaussian(n, dtype, seed=20 + r) * np.asarray(2.0 ** (r - 5), dtype) if r % 4 else
                     items_of(dtype, n)[r // 4 % 6] for r in range(k)])
    streams = [r6.compress(r) for r in rows]
    nb = -(-n // r6.BLOCK)
    codes = [group_lengths(s, nb, b) for s in streams for b in range(nb)]
    assert max(c.max() for c in codes if c is not None) == 12, "no 12-bit group code: the slow values go untested"
    cap = max(map(len, streams)) + 3  # unaligned rows
    payload = np.frombuffer(decompress_request(streams, dtype, n, cap)[1], np.uint8).reshape(1, k, cap)
    return rows, streams, payload


# The shared memory a CUDA block may have: an H100's (8 rows decoded at once, whatever the dtype), a
# consumer Blackwell's 99 KB (3 rows of each dtype) and 64 KB (1 row: a row warp's table and slot take
# ~26 KB, bf16's u32 table as fp32's slot)
H100, SMALL, TINY = 232448, 101376, 65536


@pytest.mark.parametrize("dtype, smem_block", [("bfloat16", H100), ("bfloat16", SMALL), ("bfloat16", TINY),
                                               ("float16", SMALL), ("float32", H100), ("float32", TINY)])
def test_many_rows_are_summed_in_order_however_many_decode_at_once(emulator, dtype, smem_block):
    """11 rows, each its own stream of another kind or scale (each with its own group codes), summed
    in row order by rounds of as many rows as the shared memory lets decode at once (8 + 3,
    3 + 3 + 3 + 2, 1 x 11): the reference's bits. A corrupt row of a later round gives its verdict and
    poisons its item alone: a reserved bit set, or a group-coded block's ref moved just under the one
    from which the row warp's decoder checks no value (a class whose q is not normal). The rows'
    group codes come from WarpCodesKernel (11 rows: more than the row warps): one the reference
    refuses gives its verdict; a flipped group-coded block (a table the row warp builds) decodes."""
    rows, streams, payload = many_rows(dtype)
    k, n = rows.shape
    nb = -(-n // r6.BLOCK)
    bad = payload.copy()
    bad[0, 9, r6.HEADER_BYTES + 8 * 16 + 7] |= 2  # row 9's descriptor of block 16: a reserved bit (49)
    low, message = payload.copy(), ""
    for b in range(nb):  # row 10's first block whose ref just under its code's safe ref the reference refuses
        safe, at = group_safe_ref(streams[10], nb, b), r6.HEADER_BYTES + r6.DESC_BYTES * b
        if safe:
            word = int.from_bytes(streams[10][at : at + 8], "little") & ~(0x3FF << 32) | (safe - 1) << 32
            moved = streams[10][:at] + word.to_bytes(8, "little") + streams[10][at + 8 :]
            message = reference_message(moved, dtype, n)
            if message:
                low[0, 10, : len(moved)] = np.frombuffer(moved, np.uint8)
                break
    assert message, "no block to move"
    # more rows than row warps: each row's group codes are worked out once (WarpCodesKernel) and
    # loaded by the row warps: row 9's first group code made one that the reference refuses (its
    # Kraft sum over 1) gives its verdict; row 6's first group-coded block read with its sign
    # flipped (valid: the warp builds that table itself) gives the flipped values' sums
    table, flipped = payload.copy(), payload.copy()
    at = r6.HEADER_BYTES + r6.DESC_BYTES * nb  # group 0's table: block 0's record starts with it
    assert group_lengths(streams[9], nb, 0) is not None
    table[0, 9, at : at + 2] = 0x11  # four codes of one bit
    table_message = reference_message(table[0, 9].tobytes(), dtype, n)
    assert table_message
    fb = next(b for b in range(nb) if group_lengths(streams[6], nb, b) is not None)
    flipped[0, 6, r6.HEADER_BYTES + r6.DESC_BYTES * fb + 5] ^= 0x40  # the descriptor's flip (bit 46)
    flipped_rows = [r6.decompress(flipped[0, r].tobytes(), dtype, n) for r in range(k)]
    assert not np.array_equal(flipped_rows[6].view(np.uint8), rows[6].view(np.uint8))
    requests = [accumulate_request(payload, dtype, n, out_dtype) for out_dtype in (dtype, np.float32)]
    requests += [accumulate_request(np.concatenate([payload, b]), dtype, n, dtype) for b in (bad, low)]
    requests += [accumulate_request(table, dtype, n, dtype), accumulate_request(flipped, dtype, n, np.float32)]
    replies = emulate(emulator, requests, smem_block=smem_block)
    for (err, out), out_dtype in zip(replies[:2], (dtype, np.float32)):
        assert err == ""
        assert_same_sums(np.frombuffer(out, out_dtype), ref.accumulate(list(rows), out_dtype))
    err, out = replies[2]
    assert err == CORRUPT.format(1) + status_messages()[13], err
    assert_same_sums(np.frombuffer(out, dtype)[:n], ref.accumulate(list(rows), dtype))
    err, out = replies[3]
    assert err.startswith(CORRUPT.format(1)) and category(err[len(CORRUPT.format(1)) :]) == category(message), (
        err, message)
    assert_same_sums(np.frombuffer(out, dtype)[:n], ref.accumulate(list(rows), dtype))
    err, _ = replies[4]
    assert err.startswith(CORRUPT.format(0)) and category(err[len(CORRUPT.format(0)) :]) == category(table_message), (
        err, table_message)
    err, out = replies[5]
    assert err == ""
    assert_same_sums(np.frombuffer(out, np.float32), ref.accumulate(flipped_rows, np.float32))


def test_every_lane_of_a_valid_stream_takes_the_fast_path(emulator):
    """The decoder's fast path (FastLane) refuses only lanes the exact decoder (DecodeLane) refuses
    too, so a slow fast path would still decode every bit: here, in the emulation's strict mode
    (injection 4), a lane of a valid stream that it refuses fails its stream. The streams hold
    escapes and long codes in full lanes, family and group codes, checked fp16 values, and rows
    whose group codes hold 12-bit codes summed by AccumulateKernel's row warps (a table without its
    12-bit codes fails it)."""
    cases = fast_path_cases()
    requests = [decompress_request([r6.compress(x)], x.dtype, x.size) for x in cases.values()]
    sums = []
    for dtype in ("bfloat16", "float32"):
        rows, _, payload = many_rows(dtype)
        requests.append(accumulate_request(payload, dtype, rows.shape[1], np.float32))
        sums.append(ref.accumulate(list(rows), np.float32))
    replies = replies_of(run_emulator(emulator, requests, LAUNCHES[-1], inject=4), len(requests))
    for (header, _), (message, out, status, _), x in zip(requests, replies, list(cases.values()) + sums):
        assert verdict(header, message, out, status) == "", header
        if header[0] == DECOMPRESS:
            assert np.frombuffer(out, x.dtype).view(np.uint8).tobytes() == x.view(np.uint8).tobytes(), header
        else:
            assert_same_sums(np.frombuffer(out, np.float32), x)


def reference_message(stream, dtype, n):
    try:
        r6.decompress(stream, dtype, n)
    except r6.CorruptPayload as e:
        return str(e)
    return ""


@pytest.mark.parametrize("launch", LAUNCHES, ids=lambda l: f"sms{l[0]}_resident{l[1]}")
def test_mutated_payloads_get_the_reference_verdict(emulator, launch):
    """Each mutated stream alone in a row of its own length: accepted with the reference's bits, or
    rejected with the category of the reference's error (its first three words) naming stream 0;
    the same streams as the rows of one accumulate each, whose item is then poisoned."""
    rng = np.random.default_rng(zlib.crc32(b"handlers") + launch[0])
    cases = []
    for name, x in hostile_cases().items():
        stream = r6.compress(x)
        cases += [(x, mutate(stream, rng)) for _ in range(40)]
    requests = [decompress_request([b], x.dtype, x.size) for x, b in cases]
    requests += [accumulate_request(np.frombuffer(b, np.uint8).reshape(1, 1, -1), x.dtype, x.size, np.float32)
                 for x, b in cases]
    replies = emulate(emulator, requests, launch)
    rejected = 0
    for (x, b), (err, out), (a_err, a_out) in zip(cases, replies[: len(cases)], replies[len(cases) :]):
        message = reference_message(b, x.dtype, x.size)
        if not message:
            assert err == "" and out == r6.decompress(b, x.dtype, x.size).tobytes(), err
            assert a_err == "" and a_out == r6.decompress(b, x.dtype, x.size).astype(np.float32).tobytes()
            continue
        rejected += 1
        for e in (err, a_err):
            assert e.startswith(CORRUPT.format(0)) and category(e[len(CORRUPT.format(0)) :]) == category(message), (
                e, message)
    assert rejected > len(cases) // 3, rejected


def test_first_corrupt_stream_is_named_and_the_others_still_decode(emulator):
    """Decompress names the first bad stream of a batch (row order); accumulate names the first item
    with a bad row, as the CPU codec does, and poisons only that item's sums."""
    dtype, n = np.float32, 9000
    xs = [gaussian(n, dtype, seed=s) for s in range(4)]
    streams = [r6.compress(x) for x in xs]
    bad_desc = bytearray(streams[2])
    bad_desc[r6.HEADER_BYTES + 7] |= 2  # block 0's descriptor: a reserved bit (49 and up)
    batch = [streams[0], streams[1], bytes(bad_desc), streams[3], b"ZCCX" + streams[0][4:]]
    messages = [reference_message(b, dtype, n) for b in batch]
    assert [bool(m) for m in messages] == [False, False, True, False, True]
    cap = r6.max_stream_bytes(n, dtype)
    (err, out), = emulate(emulator, [decompress_request(batch, dtype, n, cap)])
    assert err == CORRUPT.format(2) + status_messages()[13] and category(messages[2]) == category(status_messages()[13])
    got = np.frombuffer(out, dtype).reshape(5, n)
    for i in [0, 1, 3]:
        assert got[i].tobytes() == xs[i].tobytes()
    assert (got[[2, 4]].view(np.uint32) == 0xFFFFFFFF).all()
    rows = np.frombuffer(decompress_request(batch, dtype, n, cap)[1], np.uint8).reshape(5, cap)
    payload = np.stack([rows[[0, 1, 3]], rows[[0, 2, 1]]])  # [2 items, k = 3, cap]: row 1 * 3 + 1 is bad
    (err, out), = emulate(emulator, [accumulate_request(payload, dtype, n, dtype)])
    assert err == CORRUPT.format(1) + status_messages()[13]
    assert_same_sums(np.frombuffer(out, dtype)[:n], ref.accumulate([xs[0], xs[1], xs[3]], dtype))


def test_headers_of_empty_streams_are_checked(emulator):
    """n = 0: no element to decode, but a bad header is still refused, by decompress and accumulate
    alike (the CPU codec checks them too)."""
    good = r6.compress(np.zeros(0, np.float32))
    bad = b"ZCCX" + good[4:]
    message = reference_message(bad, np.float32, 0)
    payload = np.frombuffer(good + bad, np.uint8).reshape(1, 2, len(good))
    replies = emulate(emulator, [decompress_request([good, bad], np.float32, 0),
                                 accumulate_request(payload, np.float32, 0, np.float32)])
    assert [err for err, _ in replies] == [CORRUPT.format(1) + status_messages()[2], CORRUPT.format(0) + status_messages()[2]]
    assert category(message) == category(status_messages()[2])


def test_a_version_5_stream_is_refused_by_name(emulator):
    """The handlers read version 6 alone: a stream whose version byte says 5 is refused as the
    reference refuses it."""
    x = gaussian(5000, "bfloat16", seed=3)
    old = bytearray(r6.compress(x))
    old[4] = 5
    message = reference_message(bytes(old), x.dtype, x.size)
    (err, _), = emulate(emulator, [decompress_request([bytes(old)], x.dtype, x.size)])
    assert message.startswith("unsupported format version 5")
    assert err == CORRUPT.format(0) + status_messages()[3] and category(err[len(CORRUPT.format(0)) :]) == category(message)


def test_a_short_workspace_is_refused(emulator):
    """Each handler checks the workspace result against what it carves out of it. The size functions
    leave 255 bytes for aligning the buffer's start: 256 fewer can never be enough."""
    x = gaussian(5000, "float32", seed=1)
    (_, code, n, batch, cap), body = compress_request(x[None])
    stream = r6.compress(x)
    payload = np.frombuffer(stream + bytes(cap - len(stream)), np.uint8)
    requests = [((COMPRESS, code, n, batch, cap, 0, 0, 256), body),
                ((DECOMPRESS, code, n, 1, cap, 0, 0, 256), payload.tobytes()),
                ((ACCUMULATE, code, n, 1, 1, cap, code, 256), payload.tobytes())]
    for op, (err, _) in zip(["compress", "decompress", "accumulate"], emulate(emulator, requests)):
        size, needed = map(int, re.fullmatch(f"zipccl: {op}: workspace of (\\d+) bytes, (\\d+) needed", err).groups())
        assert size == needed - 256


def test_the_selftest_timing_runs_and_round_trips(emulator):
    """zipccl_cuda::TimeCodec, which `python -m zipccl_jax selftest` calls on a GPU: its events read
    the host clock here, so only the bookkeeping is checked (sizes, round trip, positive times)."""
    x = gaussian(65537, "bfloat16", seed=7)
    replies = replies_of(run_emulator(emulator, [((TIME, 1, x.size, 2), x.tobytes())], (4, 3)), 1)
    (err, out, _, syncs), = replies
    assert err == "" and syncs >= 1  # it waits for its last event: not a handler
    ms, (compressed, round_trip) = struct.unpack_from("<3d", out), struct.unpack_from("<2q", out, 24)
    assert all(0 < t < 60_000 for t in ms), ms
    assert compressed == len(r6.compress(x)) and round_trip == 1


def test_the_gpu_benchmarks_row_timing_runs_its_rows(emulator):
    """zipccl_cuda::TimeRows (`python -m zipccl_jax bench gpu`'s reduce step): the bucket cut into
    8 rows, compressed as one batch and decoded and summed; the rows' bytes are the reference's
    streams' and every row decodes. A bucket that does not cut into the rows is refused."""
    x = gaussian(8 * 4100, "bfloat16", seed=8)
    replies = replies_of(run_emulator(emulator, [((9, 1, x.size, 2, 8), x.tobytes()), ((9, 1, x.size - 1, 2, 8),
                                                                                     x[:-1].tobytes())], (4, 3)), 2)
    (err, out, _, _), (bad, _, _, _) = replies
    assert err == ""
    ms, (compressed, decoded) = struct.unpack_from("<3d", out), struct.unpack_from("<2q", out, 24)
    assert all(0 < t < 60_000 for t in ms), ms
    assert compressed == sum(len(r6.compress(r)) for r in x.reshape(8, -1)) and decoded == 1
    assert "time_rows: bad arguments (the elements must cut into the rows)" in bad


def test_handlers_refuse_bad_arguments_with_clear_errors(emulator):
    x = gaussian(100, "float32", seed=2)[None]
    (_, code, n, batch, cap), body = compress_request(x)
    requests = [((COMPRESS, code, n, batch, cap - 1), body),  # one byte short of the worst case
                ((COMPRESS, 7, n, batch, cap), body),  # int32: not a float
                ((DECOMPRESS, 7, n, 1, cap), bytes(cap)),
                ((ACCUMULATE, code, n, 1, 1, cap, 1), bytes(cap)),  # float32 payload into bfloat16
                ((ACCUMULATE, 9, n, 1, 1, cap, 3), bytes(cap)),
                ((ACCUMULATE, code, n, 1, 0, cap, 3), b"")]  # k = 0: nothing to sum, no output
    errors = [err for err, _ in emulate(emulator, requests)]
    assert errors == [f"zipccl: compress: payload capacity {cap - 1} is below {cap} or a stream exceeds 4 GiB",
                      "zipccl: unsupported dtype (XLA element type 4); supported: bfloat16, float16, float32",
                      "zipccl: unsupported dtype (XLA element type 4); supported: bfloat16, float16, float32",
                      "zipccl: accumulate: output dtype must be the payload dtype or float32",
                      "zipccl: accumulate: bad dtype code",
                      ""]


@pytest.mark.parametrize("k", [4, 9], ids=["4 rows (2 blocks a round)", "9 rows (8 + 1)"])
@pytest.mark.parametrize("dtype", DTYPES)
def test_sums_of_nans_carry_the_reference_bits_although_the_gpu_add_canonicalises(emulator, dtype, k):
    """Rows of NaNs of random payloads and signs (quiet and signalling) and infinities of both signs,
    summed by the reduce step (4 rows: two blocks a round; 9: a round of 8 and one of 1) through both handlers
    (zipccl_decompress_accumulate, the collectives' decode_accumulate_rows) to the dtype and to
    float32. The emulated float add is a GPU's: every NaN it makes is 0x7FFFFFFF; so is every NaN of
    the emulated hardware widening of fp16 (the worst a device may do with a payload). The kernels
    apply §7's NaN rule to exactly widened values and give the reference's bits; adding with the
    GPU's add and widening alone (ZC_INJECTED(3)) gives other bits at the NaN sums, so this test can
    fail, as it does without the fp16 payloads' exact widening."""
    n = 4097
    rng = np.random.default_rng(11)
    w = np.dtype(dtype).itemsize * 8
    exp = ((1 << {16: 5, 32: 8}[w]) - 1) << {16: 10, 32: 23}[w]
    if dtype == "bfloat16":
        exp = 0xFF << 7
    uint = np.uint16 if w == 16 else np.uint32
    mant = (1 << {"bfloat16": 7, "float16": 10, "float32": 23}[dtype]) - 1
    raw = rng.integers(0, 1 << w, (k, n), np.uint64).astype(uint)
    rows = ((raw & (1 << (w - 1)) | exp | raw & mant)).astype(uint)  # NaNs and infinities, both signs
    rows[:, ::7] = gaussian(n, dtype, seed=3)[::7].view(uint)
    rows = rows.view(np.dtype(dtype) if dtype != "bfloat16" else gaussian(1, dtype).dtype)
    streams = [r6.compress(r) for r in rows]
    cap = max(map(len, streams))
    payload = np.frombuffer(b"".join(s + bytes(cap - len(s)) for s in streams), np.uint8)
    requests, expected = [], []
    for out_dtype in (rows.dtype, np.float32):
        requests.append(accumulate_request(payload.reshape(1, k, cap), rows.dtype, n, out_dtype))
        requests.append(((ACCUMULATE_ROWS_OP, CODES[dtype], n, k, CODES[np.dtype(out_dtype).name], 1,
                          (1 << 32) | cap), payload.tobytes()))
        expected += [ref.accumulate(list(rows), out_dtype)] * 2
    sums = expected[2].astype(np.float32)
    assert np.isnan(sums).mean() > 0.5 and len({int(v) for v in sums.view(np.uint32)[np.isnan(sums)]}) > 100
    for (err, out), want in zip(emulate(emulator, requests), expected):
        assert err == ""
        assert_same_sums(np.frombuffer(out, want.dtype), want)
    naive = replies_of(run_emulator(emulator, requests, LAUNCHES[-1], inject=3), len(requests))
    for (err, out, _, _), want in zip(naive, expected):
        assert err == "" and out != want.tobytes()


# ---------------------------------------------------------------------------- the collectives' row ops

SIZES_OP, ENCODE_OP, ENCODE_RAW_OP, DECODE_ROWS_OP, ACCUMULATE_ROWS_OP, ENCODE_LENGTHS_OP = 4, 5, 6, 7, 8, 10
# (elements, rows, unit, leaves, buffers): contiguous rows in one leaf and in 20 leaves (more than a kernel
# takes at once), interleaved blocks with padding, a row shorter than its unit, odd rows (unaligned streams),
# 20 row buffers (more received parts than one launch takes)
ROW_LAYOUTS = [(4 * 4100, 4, 0, 1, 2), (4 * 4100, 4, 0, 20, 4), (2 * 4 * r6.BLOCK + 4 * 300 + 3, 4, r6.BLOCK, 3, 1),
               (2 * 1000, 2, r6.BLOCK, 2, 2), (3 * 4097, 3, 0, 1, 3), (20 * 301 - 7, 20, 0, 2, 20)]


def flat_of(dtype, size, seed):
    """Mixed kinds end to end: Gaussian, random bits (a stored-raw row), specials."""
    parts = [gaussian(size // 3 + 1, dtype, seed=seed), random_bits(size // 3 + 1, dtype, seed=seed + 1),
             np.resize(special_values(dtype), size // 3 + 1)]
    return np.concatenate(parts)[:size]


def row_request(op, dtype, size, rows, unit, leaves, buffers=1, cap=0, body=b""):
    return (op, CODES[np.dtype(dtype).name], size, rows, unit, leaves, (buffers << 32) | cap), body


@pytest.mark.parametrize("launch", LAUNCHES, ids=lambda l: f"sms{l[0]}_resident{l[1]}")
@pytest.mark.parametrize("dtype", DTYPES)
def test_row_ops_are_byte_identical_to_the_reference(emulator, dtype, launch):
    """stream_sizes: the reference's lengths; encode_rows: its streams at a capacity of the longest
    + 3 (zeros after each); raw: STORED_RAW streams; decode_rows: every element back in its leaf;
    decode_accumulate_rows: the rows' sums, to the dtype and to float32."""
    requests, checks = [], []
    for i, (size, rows, unit, leaves, buffers) in enumerate(ROW_LAYOUTS):
        x = flat_of(dtype, size, seed=i)
        cut = ref.cut_rows(x, rows, unit)
        m = cut.shape[1]
        streams = [r6.compress(r) for r in cut]
        cap, full = max(map(len, streams)) + 3, r6.max_stream_bytes(m, dtype)
        payload = b"".join(s + bytes(cap - len(s)) for s in streams)
        raw = b"".join(r6.header(CODES[dtype], r6.FLAG_STORED_RAW, m) + r.tobytes() for r in cut)
        requests += [row_request(SIZES_OP, dtype, size, rows, unit, leaves, body=x.tobytes()),
                     row_request(ENCODE_OP, dtype, size, rows, unit, leaves, buffers, cap, x.tobytes()),
                     row_request(ENCODE_RAW_OP, dtype, size, rows, unit, leaves, buffers, full, x.tobytes()),
                     row_request(DECODE_ROWS_OP, dtype, size, rows, unit, leaves, buffers, cap, payload)]
        checks += [np.array([len(s) for s in streams], np.uint32).tobytes(), payload, raw, x.tobytes()]
        for out_dtype in (x.dtype, np.float32):
            req = (ACCUMULATE_ROWS_OP, CODES[dtype], m, rows, CODES[np.dtype(out_dtype).name], leaves,
                   (buffers << 32) | cap)
            requests.append((req, payload))
            checks.append(ref.accumulate(list(cut), out_dtype))
    for (err, out), expected in zip(emulate(emulator, requests, launch), checks):
        assert err == ""
        if isinstance(expected, bytes):
            assert out == expected
        else:
            assert_same_sums(np.frombuffer(out, expected.dtype), expected)


def test_row_ops_report_and_poison_the_corrupt_row_and_refuse_bad_arguments(emulator):
    """decode_rows: the corrupt row's status word and its elements all-one bytes (NaN), the other rows
    decoded; decode_accumulate_rows: the row's word and every sum poisoned. The words give the CPU
    row ops' error. Then: a short workspace, a raw encode below the full capacity, no rows."""
    dtype, size, rows = "float32", 4 * 5000, 4
    x = flat_of(dtype, size, seed=7)
    streams = [r6.compress(r) for r in ref.cut_rows(x, rows)]
    cap = max(map(len, streams))
    payload = bytearray(b"".join(s + bytes(cap - len(s)) for s in streams))
    payload[2 * cap : 2 * cap + 4] = b"ZCCX"  # row 2 (the second buffer's first): its magic
    code = CODES[dtype]
    requests = [row_request(DECODE_ROWS_OP, dtype, size, rows, 0, 1, 2, cap, bytes(payload)),
                ((ACCUMULATE_ROWS_OP, code, size // rows, rows, code, 1, (2 << 32) | cap), bytes(payload))]
    (d_err, d_out, d_status, d_syncs), (a_err, a_out, a_status, a_syncs) = replies_of(
        run_emulator(emulator, requests, LAUNCHES[-1]), 2)
    assert (d_err, a_err, d_syncs, a_syncs) == ("", "", 0, 0)
    for status in d_status, a_status:
        assert corrupt_payload_error(status) == CORRUPT.format(2) + "bad magic (not a zipccl payload)"
    decoded = np.frombuffer(d_out, np.uint8).reshape(rows, -1)
    assert (decoded[2] == 0xFF).all() and decoded[[0, 1, 3]].tobytes() == x.reshape(rows, -1)[[0, 1, 3]].tobytes()
    assert set(a_out) == {0xFF}
    full = r6.max_stream_bytes(size // rows, dtype)
    replies = emulate(emulator, [
        (row_request(SIZES_OP, dtype, size, rows, 0, 1, body=x.tobytes())[0] + (256,), x.tobytes()),
        row_request(ENCODE_RAW_OP, dtype, size, rows, 0, 1, 1, full - 1, x.tobytes()),
        row_request(SIZES_OP, dtype, size, 0, 0, 1, body=x.tobytes())])
    assert re.fullmatch(r"zipccl: stream_sizes: workspace of \d+ bytes, \d+ needed", replies[0][0])
    assert [err for err, _ in replies[1:]] == ["zipccl: encode_rows: raw streams need their full capacity",
                                               "zipccl: the row ops need at least one row"]


@pytest.mark.parametrize("dtype", DTYPES)
def test_encode_rows_returns_the_lengths_of_the_streams_it_writes(emulator, dtype):
    """The static transfer's encode (ops.encode_rows(lengths=True)): the streams at the full capacity,
    byte-identical to the reference, and each one's length in the extra uint32 result, with no
    host sync."""
    requests, expected = [], []
    for i, (size, rows, unit, leaves, buffers) in enumerate(ROW_LAYOUTS):
        x = flat_of(dtype, size, seed=i)
        streams = [r6.compress(r) for r in ref.cut_rows(x, rows, unit)]
        full = r6.max_stream_bytes(-(-size // rows), dtype)
        requests.append(row_request(ENCODE_LENGTHS_OP, dtype, size, rows, unit, leaves, buffers, full, x.tobytes()))
        expected.append((b"".join(s + bytes(full - len(s)) for s in streams),
                         np.array([len(s) for s in streams], np.uint32).tobytes()))
    for (err, out, lengths, syncs), (payload, want) in zip(replies_of(run_emulator(emulator, requests, LAUNCHES[-1]),
                                                                      len(requests)), expected):
        assert (err, syncs) == ("", 0) and out == payload and lengths.tobytes() == want


# ---------------------------------------------------------------------------- races and lockstep

def test_threads_and_blocks_do_not_race(tsan_emulator):
    """ThreadSanitizer over two SMs, two CUDA blocks at once: what one thread writes and another
    reads is ordered by __syncthreads, a warp intrinsic or a kernel boundary, and the results stay bit
    exact (the codec's handlers and the collectives' row ops). Small on purpose: under
    ThreadSanitizer every CUDA thread is a thread it tracks and every barrier a context switch of
    hundreds, so the cost is the launches' threads, not the values (65,537 values an item on four SMs
    of three blocks took ~10 minutes on a 2-core Zen 3 VM; 4,097 on two of two, ~2)."""
    dtype, n, k = "float32", r6.BLOCK + 1, 2
    items, streams = items_of(dtype, n)[:4], streams_of(dtype, n)[:4]
    cap = r6.max_stream_bytes(n, dtype)
    rows = decompress_request(streams, dtype, n, cap)
    payload = np.frombuffer(rows[1], np.uint8).reshape(2, k, cap)
    flat = items.reshape(-1)[: 4 * n - 5]  # the row ops: interleaved rows of three leaves, padded
    cut = ref.cut_rows(flat, 4, r6.BLOCK)
    row_streams = [r6.compress(r) for r in cut]
    row_cap = max(map(len, row_streams))
    (c_err, c_out), (d_err, d_out), (a_err, a_out), (e_err, e_out), (r_err, r_out) = emulate(
        tsan_emulator, [compress_request(items), rows, accumulate_request(payload, dtype, n, dtype),
                        row_request(ENCODE_OP, dtype, flat.size, 4, r6.BLOCK, 3, 2, row_cap, flat.tobytes()),
                        row_request(DECODE_ROWS_OP, dtype, flat.size, 4, r6.BLOCK, 3, 4, row_cap,
                                    b"".join(s + bytes(row_cap - len(s)) for s in row_streams))], (2, 2))
    assert (c_err, d_err, a_err, e_err, r_err) == ("", "", "", "", "")
    assert e_out == b"".join(s + bytes(row_cap - len(s)) for s in row_streams) and r_out == flat.tobytes()
    sizes = np.frombuffer(c_out[:16], np.uint32)
    got = np.frombuffer(c_out[16:], np.uint8).reshape(4, cap)
    assert [r[:s].tobytes() for r, s in zip(got, sizes)] == streams
    assert d_out == items.tobytes()
    assert_same_sums(np.frombuffer(a_out, dtype), np.concatenate([ref.accumulate(list(r), dtype)
                                                                  for r in items.reshape(2, k, n)]))


def test_an_injected_race_is_reported(tsan_emulator):
    """CodeKernel's lanes or-ing the stage words they share with a neighbour by plain loads and
    stores instead of atomicOr (ZC_INJECTED(1)): ThreadSanitizer must stop the run. Up to three
    runs: on a loaded machine one of them may miss it."""
    for _ in range(3):
        run = run_emulator(tsan_emulator, [compress_request(items_of("float32", 65537)[:2])], (1, 1), inject=1)
        if "ThreadSanitizer: data race" in run.stderr.decode():
            break
    assert run.returncode != 0
    assert "ThreadSanitizer: data race" in run.stderr.decode()


def test_a_lane_that_skips_a_warp_intrinsic_is_reported(emulator):
    """Lane 5 of each GroupKernel warp leaves before the warp's reductions of its block's ref
    (ZC_INJECTED(2)): its warp must not wait forever, and the message names the lane and the
    intrinsic."""
    run = run_emulator(emulator, [compress_request(items_of("float32", 4097)[:1])], (1, 1), inject=2)
    assert run.returncode == 3
    assert re.search(r"wait at __shfl_xor_sync; lanes that left the kernel: \[5\]", run.stderr.decode()), \
        run.stderr.decode()[-2000:]
