"""The CUDA codec's handlers and kernels run on the CPU the way a GPU runs them, against the reference.

tests/cuda_emulation.cc compiles ffi/zipccl_cuda.cu with g++ (tests/cuda_host_shim.h stands in for
the CUDA runtime) and calls the real Compress, Decompress and DecompressAccumulate handlers on host
buffers, each with the workspace its size function asks for (every array followed by a gap that
ASan reports), and the timing function of `python -m zipccl_jax selftest`. Every handler call is
checked to make no host synchronisation (the shim counts stream and event waits and host<->device
copies); a decoder's verdict is read from the status words it returns, as zipccl_jax.ops reads them,
and a corrupt item's output must be poisoned (all-one bytes). Every CUDA thread is a std::thread; several CUDA blocks of a launch run at once, each with
its own shared memory (garbage at the start of every block); the 32 lanes of a warp meet in lockstep
at every warp intrinsic (__shfl*_sync, __ballot_sync, __syncwarp) and exchange their values there;
__syncthreads is a real barrier; shared-memory atomics are atomic. A lane that skips an intrinsic its
warp reaches, or a thread that leaves the kernel while its block waits at __syncthreads, fails the run
with a message naming them. Grids are sized, as on a GPU, from the emulated device's SM count, so one
SM makes every kernel loop over its work and four SMs make blocks race.

Under AddressSanitizer and UBSan the runs check the kernels' bookkeeping byte for byte: offsets,
table placement, per-item and per-row indexing, scratch sizes, error reporting, the handlers' argument
checks; under ThreadSanitizer, that the threads of a block and the blocks of a grid order their
shared and global reads and writes (an injected race must be reported). What needs a GPU stays
unchecked: the device's weaker memory model (the emulation's barriers are sequentially consistent),
warp scheduling and speed, device memory errors (compute-sanitizer, with tests/test_cuda.py), GPU
arithmetic (NaN payloads of sums) and XLA's capture of the handlers into command buffers."""

import re
import shutil
import struct
import subprocess
import zlib
from functools import lru_cache
from pathlib import Path

import jax
import ml_dtypes
import numpy as np
import pytest

from zipccl_jax import reference as ref
from zipccl_jax.ops import corrupt_payload_error
from test_codec_cpu import mutate
from test_reference import KINDS, make

ROOT = Path(__file__).resolve().parents[1]
DTYPES = [ml_dtypes.bfloat16, np.float16, np.float32]
CODES = {np.dtype(ml_dtypes.bfloat16): 1, np.dtype(np.float16): 2, np.dtype(np.float32): 3}
SIZES = [0, 1, 4095, 4096, 4097, 65537]  # 65537: 17 blocks in two groups
# (SMs, resident CUDA blocks): the emulated device. One SM: grids of 16 or 32 CUDA blocks that loop
# over their work, one block at a time; several SMs: bigger grids, several blocks racing at once.
LAUNCHES = [(1, 1), (4, 3)]
COMPRESS, DECOMPRESS, ACCUMULATE, TIME = 0, 1, 2, 3
CORRUPT = "zipccl: corrupt payload (stream {}): "
TRUNCATED = "truncated payload (shorter than its header says)"


def build(directory, sanitizers):
    """The emulator, built with -fsanitize=sanitizers (about a minute)."""
    compiler = shutil.which("g++") or shutil.which("c++")
    assert compiler, "a C++ compiler is needed to build the CUDA emulation"
    exe = directory / "cuda_emulation"
    subprocess.run([compiler, "-std=c++20", "-O1", "-g", f"-fsanitize={sanitizers}", "-fno-sanitize-recover=all",
                    "-DZIPCCL_HOST_EMULATION", f"-I{ROOT / 'ffi'}", f"-I{ROOT / 'tests'}",
                    "-isystem", jax.ffi.include_dir(), str(ROOT / "tests" / "cuda_emulation.cc"), "-pthread",
                    "-o", str(exe)], check=True, timeout=600)
    return exe


@pytest.fixture(scope="module")
def emulator(tmp_path_factory):
    return build(tmp_path_factory.mktemp("asan"), "address,undefined")


@pytest.fixture(scope="module")
def tsan_emulator(tmp_path_factory):
    return build(tmp_path_factory.mktemp("tsan"), "thread")


def run_emulator(exe, requests, launch, inject=0):
    data = b"".join(struct.pack("<8q", *(list(h) + [0] * (8 - len(h)))) + body for h, body in requests)
    return subprocess.run([str(exe), *map(str, launch), str(inject)], input=data, capture_output=True, timeout=300)


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
    wording), "" when every stream decoded. A corrupt item's output must be all-one bytes (NaN)."""
    if message or header[0] not in (DECOMPRESS, ACCUMULATE) or not status.size:
        return message
    assert status.max() <= 12, f"status words hold only the decoder's codes: {status}"
    rows = header[4] if header[0] == ACCUMULATE else 1
    corrupt = status.reshape(-1, rows).any(axis=1)
    items = np.frombuffer(out, np.uint8).reshape(len(corrupt), -1)
    assert all((item == 0xFF).all() for item in items[corrupt]), "a corrupt item's output is not poisoned"
    return corrupt_payload_error(status, rows) or ""


def emulate(exe, requests, launch=LAUNCHES[-1]):
    """Runs requests (header tuple, input bytes) -> [(error message, output bytes)]. The handlers
    must not synchronise with the host."""
    replies = replies_of(run_emulator(exe, requests, launch), len(requests))
    for (header, _), (_, _, _, syncs) in zip(requests, replies):
        assert syncs == 0, f"request {header} made {syncs} host synchronisations"
    return [(verdict(h, m, out, st), out) for (h, _), (m, out, st, _) in zip(requests, replies)]


def compress_request(items):
    """items: [batch, n], into rows of the worst-case length."""
    batch, n = items.shape
    return (COMPRESS, CODES[items.dtype], n, batch, ref.max_stream_bytes(n, items.dtype)), items.tobytes()


def decompress_request(streams, dtype, n, cap=None):
    """Streams padded with random bytes to a common row length, cap or the longest."""
    cap = max(map(len, streams)) if cap is None else cap
    pad = np.random.default_rng(cap).integers(0, 256, cap, np.uint8).tobytes()
    return (DECOMPRESS, CODES[np.dtype(dtype)], n, len(streams), cap), b"".join(s + pad[len(s) :] for s in streams)


@lru_cache(maxsize=None)
def items_of(dtype, n):
    """One item per test kind, [len(KINDS), n]."""
    return np.stack([make(kind, n, dtype, seed=n + i) for i, kind in enumerate(KINDS)])


@lru_cache(maxsize=None)
def streams_of(dtype, n):
    return [ref.compress(x) for x in items_of(dtype, n)]


@pytest.mark.parametrize("launch", LAUNCHES, ids=lambda l: f"sms{l[0]}_resident{l[1]}")
@pytest.mark.parametrize("dtype", DTYPES, ids=lambda d: np.dtype(d).name)
def test_compress_is_byte_identical_to_reference(emulator, dtype, launch):
    """A batch of every data kind per size, in one handler call each."""
    replies = emulate(emulator, [compress_request(items_of(dtype, n)) for n in SIZES], launch)
    for n, (err, out) in zip(SIZES, replies):
        assert err == ""
        batch, cap = len(KINDS), ref.max_stream_bytes(n, dtype)
        sizes = np.frombuffer(out[: 4 * batch], np.uint32)
        rows = np.frombuffer(out[4 * batch :], np.uint8).reshape(batch, cap)
        for kind, size, row, expected in zip(KINDS, sizes, rows, streams_of(dtype, n)):
            assert row[:size].tobytes() == expected, (kind, n)


@pytest.mark.parametrize("launch", LAUNCHES, ids=lambda l: f"sms{l[0]}_resident{l[1]}")
@pytest.mark.parametrize("dtype", DTYPES, ids=lambda d: np.dtype(d).name)
def test_reference_streams_decode_bit_exact(emulator, dtype, launch):
    """Each size's streams of every kind as one batch, padded with garbage to the worst case."""
    requests = [decompress_request(streams_of(dtype, n), dtype, n, ref.max_stream_bytes(n, dtype)) for n in SIZES]
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
    return (ACCUMULATE, CODES[np.dtype(dtype)], n, batch, k, cap, CODES[np.dtype(out_dtype)]), payload.tobytes()


@pytest.mark.parametrize("launch", LAUNCHES, ids=lambda l: f"sms{l[0]}_resident{l[1]}")
@pytest.mark.parametrize("dtype", DTYPES, ids=lambda d: np.dtype(d).name)
def test_accumulate_matches_reference(emulator, dtype, launch):
    """Items of 3 rows each, summed in row order to the payload dtype and to float32."""
    k, requests, expected = 3, [], []
    for n in SIZES:
        streams = streams_of(dtype, n)
        cap = ref.max_stream_bytes(n, dtype)
        batch = len(streams) // k
        payload = np.frombuffer(decompress_request(streams[: batch * k], dtype, n, cap)[1], np.uint8)
        payload = payload.reshape(batch, k, cap)
        for out_dtype in (dtype, np.float32):
            requests.append(accumulate_request(payload, dtype, n, out_dtype))
            # the reference's sums of the decoded rows (streams_of decode to items_of: test_reference)
            rows = items_of(dtype, n)[: batch * k].reshape(batch, k, n)
            expected.append(np.concatenate([ref.accumulate(list(r), out_dtype) for r in rows]))
    for (err, out), sums in zip(emulate(emulator, requests, launch), expected):
        assert err == ""
        assert_same_sums(np.frombuffer(out, sums.dtype), sums)


MUTATED = [pytest.param(dtype, kind, n, id=f"{np.dtype(dtype).name}-{kind}") for dtype in DTYPES for kind, n in
           [("gauss", 9000), ("specials_in_gauss", 4097), ("low_precision", 9000), ("mixed_precision", 9000),
            ("random_bits", 300)]]


@pytest.mark.parametrize("dtype,kind,n", MUTATED)
def test_mutated_payloads_get_the_reference_verdict(emulator, dtype, kind, n):
    """Each mutated stream alone in a row of its own length: the same accept/reject as the reference,
    the same bits when accepted, and when rejected the reference's error naming stream 0."""
    x = make(kind, n, dtype)
    stream = ref.compress(x)
    rng = np.random.default_rng(zlib.crc32(f"{np.dtype(dtype).name}-{kind}".encode()))
    bad = [mutate(stream, rng) for _ in range(50)]
    replies = emulate(emulator, [decompress_request([b], dtype, n) for b in bad])
    rejected = 0
    for b, (err, out) in zip(bad, replies):
        try:
            expected = ref.decompress(b, dtype, n).tobytes()
        except ref.CorruptPayload as reason:
            assert err == CORRUPT.format(0) + str(reason)
            rejected += 1
        else:
            assert err == "" and out == expected, err
    assert rejected > 5


@pytest.mark.parametrize("kind", ["gauss", "sparse"])  # sparse: sign-coded groups with implied zeros
@pytest.mark.parametrize("dtype", DTYPES, ids=lambda d: np.dtype(d).name)
def test_a_changed_ref_decodes_as_the_reference_decodes_it(emulator, dtype, kind):
    """Group 0's first ref (the first byte of its table area, FORMAT.md §5.5) set to 1 makes every
    class above 1 an exponent under 1: rejected, as the reference rejects it, though every lane still
    ends where it must (checked once per block by the fast lane decoder, not at a lane's end). The ref
    raised by one moves every coded exponent up by one, and 255 past float16's exponent field (whose
    bits then spill as the reference's arithmetic spills them): accepted, the reference's bits."""
    n = 9000
    stream = ref.compress(make(kind, n, dtype))
    table_at = ref.body_offset(stream, n, -(-n // ref.BLOCK))  # the bodies' end: group 0's table area
    changed = [bytearray(stream) for _ in range(3)]
    for s, r in zip(changed, (1, stream[table_at] + 1, 255)):
        s[table_at] = r
    with pytest.raises(ref.CorruptPayload) as reason:
        ref.decompress(bytes(changed[0]), dtype, n)
    expected = [ref.decompress(bytes(s), dtype, n).tobytes() for s in changed[1:]]
    assert make(kind, n, dtype).tobytes() not in expected
    (err_low, _), *accepted = emulate(emulator, [decompress_request([bytes(s)], dtype, n) for s in changed])
    assert err_low == CORRUPT.format(0) + str(reason.value) and "bitstream" in err_low
    assert accepted == [("", out) for out in expected]


def test_a_lane_ending_on_a_window_with_no_code_gets_the_reference_verdict(emulator):
    """A one-symbol group's code is "0" alone: a window starting with a 1 has no code. Block 0 of 4,095
    bfloat16 values in [1, 1.2) rebuilt with 2-bit length deviations (a valid body the encoder would
    not choose, decoded bit-exact) ends lane 15's last bit on the body's last bit; a header saying 4,096
    then asks lane 15 for one more element, whose window is the table area's ref (127: bits 1...). The
    reference reads the lane's end as zeros, finds "0" with no bits left: a corrupt bitstream. The
    fast lane decoder, which reads past a lane's end and checks only where it ends, must still see
    that the window had no code."""
    dtype, n = ml_dtypes.bfloat16, 4095
    x = (1 + np.random.default_rng(5).random(n) * 0.2).astype(dtype)
    stream = ref.compress(x)
    body_at, end_at = ref.body_offset(stream, n, 0), ref.body_offset(stream, n, 1)
    starts = ref.lane_starts(stream[body_at:end_at])
    per = (starts[1] - starts[0]) // 256  # bits per element, the same for all: one symbol
    lanes = int.from_bytes(stream[body_at:end_at], "little") >> starts[0]
    lane_bits = 16 * 256 * per - per
    head = ref.head_bits(2)
    size, rest = divmod(head + lane_bits, 8)
    assert rest == 0 and (8 * size - head) // 16 == 256 * per - 1  # every deviation but lane 15's is +1
    body = 7 | 2 << 3 | sum(1 << (8 + 2 * k) for k in range(15)) | (lanes & ((1 << lane_bits) - 1)) << head
    rebuilt = (stream[: ref.HEADER_BYTES] + size.to_bytes(2, "little") + stream[ref.HEADER_BYTES + 2 : body_at] +
               body.to_bytes(size, "little") + stream[end_at:])
    assert stream[end_at] & 1 and ref.decompress(rebuilt, dtype, n).tobytes() == x.tobytes()
    longer = rebuilt[:8] + (n + 1).to_bytes(8, "little") + rebuilt[16:]
    with pytest.raises(ref.CorruptPayload, match="bitstream") as reason:
        ref.decompress(longer, dtype, n + 1)
    (err, out), = emulate(emulator, [decompress_request([rebuilt], dtype, n)])
    assert err == "" and out == x.tobytes()
    (err, _), = emulate(emulator, [decompress_request([longer], dtype, n + 1)])
    assert err == CORRUPT.format(0) + str(reason.value)


def test_a_body_size_past_the_end_is_reported_as_truncated(emulator):
    """FORMAT.md §1: every body and table area is bounded before any block is decoded, by the
    reference as by the CUDA decoder."""
    dtype, n = np.float32, 9000
    s = bytearray(ref.compress(make("gauss", n, dtype)))
    s[16] = (s[16] + 1) % 256  # block 0's body one byte longer: the table areas now overrun
    with pytest.raises(ref.CorruptPayload, match="truncated"):
        ref.decompress(bytes(s), dtype, n)
    (err, _), = emulate(emulator, [decompress_request([bytes(s)], dtype, n)])
    assert err == CORRUPT.format(0) + TRUNCATED


def test_offsets_of_a_stream_longer_than_one_scan_step(emulator):
    """ValidateKernel places bodies and table areas with a block scan over kScanPer x 128 sizes a
    step (ffi/cuda_decode.cuh): a stream of 1,025 blocks takes two steps, the second carrying the
    first's total. Decoded bit for bit; its last body one byte longer makes the table areas overrun
    the stream: truncated, as the reference says. (The stream from the CPU codec, byte-identical to
    the reference and faster.)"""
    from zipccl_jax import _zipccl_cpu as cpu

    dtype, n = ml_dtypes.bfloat16, 1025 * 4096 + 1
    x = make("gauss", n, dtype, seed=5)
    out = np.zeros(ref.max_stream_bytes(n, dtype), np.uint8)
    stream = out[: cpu.compress_into(x.view(np.uint8), CODES[np.dtype(dtype)], out)].tobytes()
    (err, got), = emulate(emulator, [decompress_request([stream], dtype, n)])
    assert err == "" and got == x.tobytes()
    bad = bytearray(stream)
    last = 16 + 2 * 1025  # the last (1,026th) block's u16 descriptor, after the 16-byte header (FORMAT.md §2)
    bad[last] = (bad[last] + 1) % 256
    with pytest.raises(ref.CorruptPayload, match="truncated"):
        ref.decompress(bytes(bad), dtype, n)
    (err, _), = emulate(emulator, [decompress_request([bytes(bad)], dtype, n)])
    assert err == CORRUPT.format(0) + TRUNCATED


def test_first_corrupt_stream_is_named_and_the_others_still_decode(emulator):
    """Decompress names the first bad stream of a batch (row order); accumulate names the first item
    with a bad row, as the CPU codec does, and poisons only that item's sums."""
    dtype, n = np.float32, 9000
    streams = [ref.compress(make(kind, n, dtype)) for kind in ["gauss", "low_precision", "mixed_precision", "wide"]]
    bad_mode = bytearray(streams[2])
    bad_mode[16 + 2 * 3 + 3] = 7 | 21 << 3  # block 0's body starts with its width field: at most 20
    batch = [streams[0], streams[1], bytes(bad_mode), streams[3], b"ZCCX" + streams[0][4:]]
    for b in batch[2], batch[4]:
        with pytest.raises(ref.CorruptPayload):
            ref.decompress(b, dtype, n)
    cap = ref.max_stream_bytes(n, dtype)
    (err, out), = emulate(emulator, [decompress_request(batch, dtype, n, cap)])
    assert err == CORRUPT.format(2) + "corrupt block descriptor (bad mode)"
    got = np.frombuffer(out, dtype).reshape(5, n)
    for i in [0, 1, 3]:
        assert got[i].tobytes() == ref.decompress(batch[i], dtype, n).tobytes()
    rows = np.frombuffer(decompress_request(batch, dtype, n, cap)[1], np.uint8).reshape(5, cap)
    payload = np.stack([rows[[0, 1, 3]], rows[[0, 2, 1]]])  # [2 items, k = 3, cap]: row 1 * 3 + 1 is bad
    (err, out), = emulate(emulator, [accumulate_request(payload, dtype, n, dtype)])
    assert err == CORRUPT.format(1) + "corrupt block descriptor (bad mode)"
    first = [ref.decompress(batch[i], dtype, n) for i in [0, 1, 3]]
    assert_same_sums(np.frombuffer(out, dtype)[:n], ref.accumulate(first, dtype))


def test_headers_of_empty_streams_are_checked(emulator):
    """n = 0: no element to decode, but a bad header is still refused, by decompress and accumulate
    alike (the CPU codec checks them too)."""
    good = ref.compress(np.zeros(0, np.float32))
    bad = b"ZCCX" + good[4:]
    with pytest.raises(ref.CorruptPayload) as reason:
        ref.decompress(bad, np.float32, 0)
    payload = np.frombuffer(good + bad, np.uint8).reshape(1, 2, len(good))
    replies = emulate(emulator, [decompress_request([good, bad], np.float32, 0),
                                 accumulate_request(payload, np.float32, 0, np.float32)])
    assert [err for err, _ in replies] == [CORRUPT.format(1) + str(reason.value), CORRUPT.format(0) + str(reason.value)]


def test_a_short_workspace_is_refused(emulator):
    """Each handler checks the workspace result against what it carves out of it. The size functions
    leave 255 bytes for aligning the buffer's start: 256 fewer can never be enough."""
    x = make("gauss", 5000, np.float32)
    (_, code, n, batch, cap), body = compress_request(x[None])
    payload = np.frombuffer(ref.compress(x) + bytes(cap - len(ref.compress(x))), np.uint8)
    requests = [((COMPRESS, code, n, batch, cap, 0, 0, 256), body),
                ((DECOMPRESS, code, n, 1, cap, 0, 0, 256), payload.tobytes()),
                ((ACCUMULATE, code, n, 1, 1, cap, code, 256), payload.tobytes())]
    for op, (err, _) in zip(["compress", "decompress", "accumulate"], emulate(emulator, requests)):
        size, needed = map(int, re.fullmatch(f"zipccl: {op}: workspace of (\\d+) bytes, (\\d+) needed", err).groups())
        assert size == needed - 256


def test_the_selftest_timing_runs_and_round_trips(emulator):
    """zipccl_cuda::TimeCodec, which `python -m zipccl_jax selftest` calls on a GPU: its events read
    the host clock here, so only the bookkeeping is checked (sizes, round trip, positive times)."""
    x = make("gauss", 65537, ml_dtypes.bfloat16)
    replies = replies_of(run_emulator(emulator, [((TIME, 1, x.size, 2), x.tobytes())], (4, 3)), 1)
    (err, out, _, syncs), = replies
    assert err == "" and syncs >= 1  # it waits for its last event: not a handler
    ms, (compressed, round_trip) = struct.unpack_from("<3d", out), struct.unpack_from("<2q", out, 24)
    assert all(0 < t < 60_000 for t in ms), ms
    assert compressed == len(ref.compress(x)) and round_trip == 1


def test_the_gpu_benchmarks_row_timing_runs_its_rows(emulator):
    """zipccl_cuda::TimeRows (`python -m zipccl_jax bench gpu`'s reduce step): the bucket cut into
    8 rows, compressed as one batch and decoded and summed; the rows' bytes are the reference's
    streams' and every row decodes. A bucket that does not cut into the rows is refused."""
    x = make("gauss", 8 * 4100, ml_dtypes.bfloat16)
    replies = replies_of(run_emulator(emulator, [((9, 1, x.size, 2, 8), x.tobytes()), ((9, 1, x.size - 1, 2, 8),
                                                                                     x[:-1].tobytes())], (4, 3)), 2)
    (err, out, _, _), (bad, _, _, _) = replies
    assert err == ""
    ms, (compressed, decoded) = struct.unpack_from("<3d", out), struct.unpack_from("<2q", out, 24)
    assert all(0 < t < 60_000 for t in ms), ms
    assert compressed == sum(len(ref.compress(r)) for r in x.reshape(8, -1)) and decoded == 1
    assert "time_rows: bad arguments (the elements must cut into the rows)" in bad


def test_handlers_refuse_bad_arguments_with_clear_errors(emulator):
    x = make("gauss", 100, np.float32)[None]
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


def test_threads_and_blocks_do_not_race(tsan_emulator):
    """ThreadSanitizer over four SMs, three CUDA blocks at once: what one thread writes and another
    reads is ordered by __syncthreads, a warp intrinsic or a kernel boundary, and the results stay bit
    exact (the codec's handlers and the collectives' row ops)."""
    dtype, n, k = np.float32, 65537, 2
    items, streams = items_of(dtype, n)[:4], streams_of(dtype, n)[:4]
    cap = ref.max_stream_bytes(n, dtype)
    rows = decompress_request(streams, dtype, n, cap)
    payload = np.frombuffer(rows[1], np.uint8).reshape(2, k, cap)
    flat = items.reshape(-1)[: 4 * n - 5]  # the row ops: interleaved rows of three leaves, padded
    cut = ref.cut_rows(flat, 4, ref.BLOCK)
    row_streams = [ref.compress(r) for r in cut]
    row_cap = max(map(len, row_streams))
    (c_err, c_out), (d_err, d_out), (a_err, a_out), (e_err, e_out), (r_err, r_out) = emulate(
        tsan_emulator, [compress_request(items), rows, accumulate_request(payload, dtype, n, dtype),
                        row_request(ENCODE_OP, dtype, flat.size, 4, ref.BLOCK, 3, 2, row_cap, flat.tobytes()),
                        row_request(DECODE_ROWS_OP, dtype, flat.size, 4, ref.BLOCK, 3, 4, row_cap,
                                    b"".join(s + bytes(row_cap - len(s)) for s in row_streams))], (4, 3))
    assert (c_err, d_err, a_err, e_err, r_err) == ("", "", "", "", "")
    assert e_out == b"".join(s + bytes(row_cap - len(s)) for s in row_streams) and r_out == flat.tobytes()
    sizes = np.frombuffer(c_out[:16], np.uint32)
    got = np.frombuffer(c_out[16:], np.uint8).reshape(4, cap)
    assert [r[:s].tobytes() for r, s in zip(got, sizes)] == streams
    assert d_out == items.tobytes()
    assert_same_sums(np.frombuffer(a_out, dtype), np.concatenate([ref.accumulate(list(r), dtype)
                                                                  for r in items.reshape(2, k, n)]))


def test_an_injected_race_is_reported(tsan_emulator):
    """BodyKernel's lanes writing the words they share with a neighbour by plain stores instead of
    atomicOr (ZC_INJECTED(1)): ThreadSanitizer must stop the run. 16 blocks of 16 lanes each, so
    that many shared words are written by two threads (TSan sees a race only where its history of a
    word still holds the other thread's store: with one block of them it missed it once in ten runs).
    Up to three runs: on a loaded machine one of them has been seen to miss it."""
    for _ in range(3):
        run = run_emulator(tsan_emulator, [compress_request(items_of(np.float32, 65537)[:2])], (1, 1), inject=1)
        if "ThreadSanitizer: data race" in run.stderr.decode():
            break
    assert run.returncode != 0
    assert "ThreadSanitizer: data race" in run.stderr.decode()


def test_a_lane_that_skips_a_warp_intrinsic_is_reported(emulator):
    """Lane 5 of each EmaxKernel warp leaves before the warp's shuffles (ZC_INJECTED(2)): its warp
    must not wait forever, and the message names the lane and the intrinsic."""
    run = run_emulator(emulator, [compress_request(items_of(np.float32, 4097)[:1])], (1, 1), inject=2)
    assert run.returncode == 3
    assert ("wait at __shfl_xor_sync; lanes that left the kernel: [5]" in run.stderr.decode()), run.stderr.decode()


@pytest.mark.parametrize("dtype", DTYPES, ids=lambda d: np.dtype(d).name)
def test_sums_of_nans_carry_the_reference_bits_although_the_gpu_add_canonicalises(emulator, dtype):
    """Rows of NaNs of random payloads and signs (quiet and signalling) and infinities of both signs,
    summed by both accumulate kernels (zipccl_decompress_accumulate, the collectives'
    decode_accumulate_rows) to the dtype and to float32. The emulated float add is a GPU's: every
    NaN it makes is 0x7FFFFFFF (tests/cuda_host_shim.h). The kernels apply §8's NaN rule and give the
    reference's bits; the same kernels adding with the GPU's add alone (ZC_INJECTED(3), what they did
    before the rule) give other bits at the NaN sums, so this test can fail."""
    k, n = 4, 4097
    rows = np.stack([make("nans", n, dtype, seed=s) for s in range(k)])
    streams = [ref.compress(r) for r in rows]
    cap = max(map(len, streams))
    payload = np.frombuffer(b"".join(s + bytes(cap - len(s)) for s in streams), np.uint8)
    requests, expected = [], []
    for out_dtype in (dtype, np.float32):
        requests.append(accumulate_request(payload.reshape(1, k, cap), dtype, n, out_dtype))
        requests.append(((ACCUMULATE_ROWS_OP, CODES[np.dtype(dtype)], n, k, CODES[np.dtype(out_dtype)], 1,
                          (1 << 32) | cap), payload.tobytes()))
        expected += [ref.accumulate(list(rows), out_dtype)] * 2
    sums = [s.astype(np.float32) for s in expected[2:]]
    assert np.isnan(sums[0]).mean() > 0.5 and len({int(v) for v in sums[0].view(np.uint32)[np.isnan(sums[0])]}) > 100
    for (err, out), want in zip(emulate(emulator, requests), expected):
        assert err == ""
        assert_same_sums(np.frombuffer(out, want.dtype), want)
    naive = replies_of(run_emulator(emulator, requests, LAUNCHES[-1], inject=3), len(requests))
    for (err, out, _, _), want in zip(naive, expected):
        assert err == "" and out != want.tobytes()


# ---------------------------------------------------------------------------- the collectives' row ops

SIZES_OP, ENCODE_OP, ENCODE_RAW_OP, DECODE_ROWS_OP, ACCUMULATE_ROWS_OP, ENCODE_LENGTHS_OP = 4, 5, 6, 7, 8, 10
# (elements, rows, unit, leaves, buffers): contiguous rows in one leaf and in 20 leaves (more than a kernel
# takes at once), interleaved blocks with padding, a row shorter than its unit
ROW_LAYOUTS = [(4 * 4100, 4, 0, 1, 2), (4 * 4100, 4, 0, 20, 4), (2 * 4 * ref.BLOCK + 4 * 300 + 3, 4, ref.BLOCK, 3, 1),
               (2 * 1000, 2, ref.BLOCK, 2, 2)]


def flat_of(dtype, size, seed):
    """Mixed kinds end to end: Gaussian, random bits (a stored-raw row), specials."""
    parts = [make(k, size // 3 + 1, dtype, seed=seed + i) for i, k in enumerate(["gauss", "random_bits", "specials"])]
    return np.concatenate(parts)[:size]


def row_request(op, dtype, size, rows, unit, leaves, buffers=1, cap=0, body=b""):
    return (op, CODES[np.dtype(dtype)], size, rows, unit, leaves, (buffers << 32) | cap), body


@pytest.mark.parametrize("launch", LAUNCHES, ids=lambda l: f"sms{l[0]}_resident{l[1]}")
@pytest.mark.parametrize("dtype", DTYPES, ids=lambda d: np.dtype(d).name)
def test_row_ops_are_byte_identical_to_the_reference(emulator, dtype, launch):
    requests, checks = [], []
    for i, (size, rows, unit, leaves, buffers) in enumerate(ROW_LAYOUTS):
        x = flat_of(dtype, size, seed=i)
        cut = ref.cut_rows(x, rows, unit)
        m = cut.shape[1]
        streams = [ref.compress(r) for r in cut]
        cap, full = max(map(len, streams)) + 3, ref.max_stream_bytes(m, dtype)
        payload = b"".join(s + bytes(cap - len(s)) for s in streams)
        raw = b"".join(ref.header(CODES[np.dtype(dtype)], ref.FLAG_STORED_RAW, m) + r.tobytes() for r in cut)
        requests += [row_request(SIZES_OP, dtype, size, rows, unit, leaves, body=x.tobytes()),
                     row_request(ENCODE_OP, dtype, size, rows, unit, leaves, buffers, cap, x.tobytes()),
                     row_request(ENCODE_RAW_OP, dtype, size, rows, unit, leaves, buffers, full, x.tobytes()),
                     row_request(DECODE_ROWS_OP, dtype, size, rows, unit, leaves, buffers, cap, payload)]
        checks += [np.array([len(s) for s in streams], np.uint32).tobytes(), payload, raw, x.tobytes()]
        for out_dtype in (dtype, np.float32):
            req = (ACCUMULATE_ROWS_OP, CODES[np.dtype(dtype)], m, rows, CODES[np.dtype(out_dtype)], leaves,
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
    dtype, size, rows = np.float32, 4 * 5000, 4
    x = flat_of(dtype, size, seed=7)
    streams = [ref.compress(r) for r in ref.cut_rows(x, rows)]
    cap = max(map(len, streams))
    payload = bytearray(b"".join(s + bytes(cap - len(s)) for s in streams))
    payload[2 * cap + 16 + 2 * 2 + 3] = 7 | 21 << 3  # row 2 (the second buffer's first), block 0's width field: <= 20
    code = CODES[np.dtype(dtype)]
    requests = [row_request(DECODE_ROWS_OP, dtype, size, rows, 0, 1, 2, cap, bytes(payload)),
                ((ACCUMULATE_ROWS_OP, code, size // rows, rows, code, 1, (2 << 32) | cap), bytes(payload))]
    (d_err, d_out, d_status, d_syncs), (a_err, a_out, a_status, a_syncs) = replies_of(
        run_emulator(emulator, requests, LAUNCHES[-1]), 2)
    assert (d_err, a_err, d_syncs, a_syncs) == ("", "", 0, 0)
    for status in d_status, a_status:
        assert corrupt_payload_error(status) == CORRUPT.format(2) + "corrupt block descriptor (bad mode)"
    decoded = np.frombuffer(d_out, np.uint8).reshape(rows, -1)
    assert (decoded[2] == 0xFF).all() and decoded[[0, 1, 3]].tobytes() == x.reshape(rows, -1)[[0, 1, 3]].tobytes()
    assert set(a_out) == {0xFF}
    full = ref.max_stream_bytes(size // rows, dtype)
    replies = emulate(emulator, [
        (row_request(SIZES_OP, dtype, size, rows, 0, 1, body=x.tobytes())[0] + (256,), x.tobytes()),
        row_request(ENCODE_RAW_OP, dtype, size, rows, 0, 1, 1, full - 1, x.tobytes()),
        row_request(SIZES_OP, dtype, size, 0, 0, 1, body=x.tobytes())])
    assert re.fullmatch(r"zipccl: stream_sizes: workspace of \d+ bytes, \d+ needed", replies[0][0])
    assert [err for err, _ in replies[1:]] == ["zipccl: encode_rows: raw streams need their full capacity",
                                               "zipccl: the row ops need at least one row"]


@pytest.mark.parametrize("dtype", DTYPES, ids=lambda d: np.dtype(d).name)
def test_encode_rows_returns_the_lengths_of_the_streams_it_writes(emulator, dtype):
    """The static transfer's encode (ops.encode_rows(lengths=True)): the streams at the full capacity,
    byte-identical to the reference, and each one's length in the extra uint32 result, with no
    host sync; a raw encode asked for lengths is refused by name."""
    requests, expected = [], []
    for i, (size, rows, unit, leaves, buffers) in enumerate(ROW_LAYOUTS):
        x = flat_of(dtype, size, seed=i)
        streams = [ref.compress(r) for r in ref.cut_rows(x, rows, unit)]
        full = ref.max_stream_bytes(-(-size // rows), dtype)
        requests.append(row_request(ENCODE_LENGTHS_OP, dtype, size, rows, unit, leaves, buffers, full, x.tobytes()))
        expected.append((b"".join(s + bytes(full - len(s)) for s in streams),
                         np.array([len(s) for s in streams], np.uint32).tobytes()))
    for (err, out, lengths, syncs), (payload, want) in zip(replies_of(run_emulator(emulator, requests, LAUNCHES[-1]),
                                                                      len(requests)), expected):
        assert (err, syncs) == ("", 0) and out == payload and lengths.tobytes() == want
