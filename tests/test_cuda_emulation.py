"""The CUDA codec's handlers and kernels run on the CPU the way a GPU runs them, against the reference.

tests/cuda_emulation.cc compiles ffi/zipccl_cuda.cu with g++ (tests/cuda_host_shim.h stands in for
the CUDA runtime) and calls the real Compress, Decompress and DecompressAccumulate handlers on host
buffers. Every CUDA thread is a std::thread; several CUDA blocks of a launch run at once, each with
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
warp scheduling and speed, device memory errors (compute-sanitizer, with tests/test_cuda.py) and GPU
arithmetic (NaN payloads of sums)."""

import hashlib
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
from test_codec_cpu import mutate
from test_reference import KINDS, make

ROOT = Path(__file__).resolve().parents[1]
DTYPES = [ml_dtypes.bfloat16, np.float16, np.float32]
CODES = {np.dtype(ml_dtypes.bfloat16): 1, np.dtype(np.float16): 2, np.dtype(np.float32): 3}
SIZES = [0, 1, 4095, 4096, 4097, 65537]  # 65537: 17 blocks in two groups
# (SMs, resident CUDA blocks): the emulated device. One SM: grids of 16 or 32 CUDA blocks that loop
# over their work, one block at a time; several SMs: bigger grids, several blocks racing at once.
LAUNCHES = [(1, 1), (4, 3)]
COMPRESS, DECOMPRESS, ACCUMULATE = 0, 1, 2
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
    data = b"".join(struct.pack("<7q", *(list(h) + [0] * (7 - len(h)))) + body for h, body in requests)
    return subprocess.run([str(exe), *map(str, launch), str(inject)], input=data, capture_output=True, timeout=300)


def emulate(exe, requests, launch=LAUNCHES[-1]):
    """Runs requests (header tuple, input bytes) -> [(error message, output bytes)]."""
    run = run_emulator(exe, requests, launch)
    assert run.returncode == 0, run.stderr.decode()[-3000:]
    replies, pos = [], 0
    while pos < len(run.stdout):
        fields = []
        for _ in range(2):
            (size,) = struct.unpack_from("<q", run.stdout, pos)
            fields.append(run.stdout[pos + 8 : pos + 8 + size])
            pos += 8 + size
        replies.append((fields[0].decode(), fields[1]))
    assert len(replies) == len(requests)
    return replies


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
    """Bit for bit, except that a NaN's payload is not part of the guarantee (FORMAT.md §8)."""
    nan = np.isnan(expected.astype(np.float32))
    assert np.array_equal(np.isnan(got.astype(np.float32)), nan)
    got, expected = got.copy(), expected.copy()
    got[nan] = expected[nan] = 0
    assert got.tobytes() == expected.tobytes()


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


def test_a_body_size_past_the_end_is_reported_as_truncated(emulator):
    """FORMAT.md §1: every body and table area is bounded before any block is decoded, by the
    reference as by the CUDA decoder (version 2 left the reference to meet the bitstream first)."""
    dtype, n = np.float32, 9000
    s = bytearray(ref.compress(make("gauss", n, dtype)))
    s[16] = (s[16] + 1) % 256  # block 0's body one byte longer: the table areas now overrun
    with pytest.raises(ref.CorruptPayload, match="truncated"):
        ref.decompress(bytes(s), dtype, n)
    (err, _), = emulate(emulator, [decompress_request([bytes(s)], dtype, n)])
    assert err == CORRUPT.format(0) + TRUNCATED


def test_first_corrupt_stream_is_named_and_the_others_still_decode(emulator):
    """Decompress names the first bad stream of a batch (the first in launch order, here row order);
    accumulate names the bad payload row, item * k + j."""
    dtype, n = np.float32, 9000
    streams = [ref.compress(make(kind, n, dtype)) for kind in ["gauss", "low_precision", "mixed_precision", "wide"]]
    bad_mode = bytearray(streams[2])
    bad_mode[16 + 2] = 21  # block 0's width: at most 20
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
    (err, _), = emulate(emulator, [accumulate_request(payload, dtype, n, dtype)])
    assert err == CORRUPT.format(4) + "corrupt block descriptor (bad mode)"


@pytest.mark.parametrize("version", [1, 2])
def test_earlier_versions_decode(emulator, version):
    """FORMAT.md, Earlier versions: the CUDA decoder reads them too, each stream in its own row."""
    from test_reference import _v_streams

    for name, v in _v_streams(version).items():
        (err, out), = emulate(emulator, [decompress_request([v.stream], v.dtype, v.size)])
        assert err == "" and hashlib.sha256(out).hexdigest() == v.sha256, name


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
    exact."""
    dtype, n, k = np.float32, 65537, 2
    items, streams = items_of(dtype, n)[:4], streams_of(dtype, n)[:4]
    cap = ref.max_stream_bytes(n, dtype)
    rows = decompress_request(streams, dtype, n, cap)
    payload = np.frombuffer(rows[1], np.uint8).reshape(2, k, cap)
    (c_err, c_out), (d_err, d_out), (a_err, a_out) = emulate(
        tsan_emulator, [compress_request(items), rows, accumulate_request(payload, dtype, n, dtype)], (4, 3))
    assert (c_err, d_err, a_err) == ("", "", "")
    sizes = np.frombuffer(c_out[:16], np.uint32)
    got = np.frombuffer(c_out[16:], np.uint8).reshape(4, cap)
    assert [r[:s].tobytes() for r, s in zip(got, sizes)] == streams
    assert d_out == items.tobytes()
    assert_same_sums(np.frombuffer(a_out, dtype), np.concatenate([ref.accumulate(list(r), dtype)
                                                                  for r in items.reshape(2, k, n)]))


def test_an_injected_race_is_reported(tsan_emulator):
    """EncodeKernel without the __syncthreads between clearing its staged body and the lanes' atomicOr
    into it (ZC_INJECTED(1)): ThreadSanitizer must stop the run."""
    run = run_emulator(tsan_emulator, [compress_request(items_of(np.float32, 4097)[:2])], (1, 1), inject=1)
    assert run.returncode != 0
    assert "ThreadSanitizer: data race" in run.stderr.decode()


def test_a_lane_that_skips_a_warp_intrinsic_is_reported(emulator):
    """Lane 5 of each EmaxKernel warp leaves before the warp's shuffles (ZC_INJECTED(2)): its warp
    must not wait forever, and the message names the lane and the intrinsic."""
    run = run_emulator(emulator, [compress_request(items_of(np.float32, 4097)[:1])], (1, 1), inject=2)
    assert run.returncode == 3
    assert ("wait at __shfl_xor_sync; lanes that left the kernel: [5]" in run.stderr.decode()), run.stderr.decode()
