"""The version-6 CUDA kernels (ffi/cuda6_codec.cuh) run on the CPU the way a GPU runs them, against
the numpy reference (zipccl_jax/reference.py) byte for byte.

tests/cuda6_emulation.cc compiles the kernels with g++ (tests/cuda_host_shim.h for the CUDA runtime:
a std::thread per CUDA thread, warps in lockstep at their intrinsics, real __syncthreads, several
CUDA blocks resident at once) under AddressSanitizer and UBSan, each input and output its own
allocation of exactly its size. Compress must write the reference's stream (every encoder choice:
refs, family members and flips, group codes at own or group refs, raw blocks, STORED_RAW); decompress
must return every bit of the elements, and for a mutated stream the reference's verdict: accepted with
the same bits, or rejected with the same category (the message's first three words) and, where the
reference names one, the same failing block. ThreadSanitizer checks that blocks and threads order
their shared and global accesses. With nvcc on PATH the kernels compile for sm_90 within their
register and shared-memory budgets (docs/GPU.md, "Version 6 kernels: predictions")."""

import os
import re
import shutil
import struct
import subprocess
import zlib
from functools import lru_cache
from pathlib import Path

import jax
import numpy as np
import pytest

from zipccl_jax import reference as r6
from zipccl_jax.bench.data import DTYPES, gaussian, random_bits, special_values
from zipccl_jax.dtypes import DTYPE_CODES
from test_codec_cpu import mutate

ROOT = Path(__file__).resolve().parents[1]
CODES = DTYPE_CODES  # dtype name -> the format's dtype code
LAUNCHES = [(1, 1), (4, 3)]  # (SMs, resident CUDA blocks): one at a time; several racing
COMPRESS, DECOMPRESS = 0, 1
NO_ERROR = (1 << 64) - 1


def build(directory, sanitizers, source="cuda6_emulation.cc"):
    """An emulator (tests/<source>: cuda6_emulation.cc, the kernels', or cuda_emulation.cc, the
    handlers'), built with -fsanitize=sanitizers (about a minute)."""
    compiler = shutil.which("g++") or shutil.which("c++")
    assert compiler, "a C++ compiler is needed to build the CUDA emulation"
    exe = directory / Path(source).stem
    subprocess.run([compiler, "-std=c++20", "-O1", "-g", f"-fsanitize={sanitizers}", "-fno-sanitize-recover=all",
                    "-DZIPCCL_HOST_EMULATION", f"-I{ROOT / 'ffi'}", f"-I{ROOT / 'tests'}",
                    "-isystem", jax.ffi.include_dir(), str(ROOT / "tests" / source), "-pthread",
                    "-o", str(exe)], check=True, timeout=600)
    return exe


@pytest.fixture(scope="module")
def emulator(tmp_path_factory):
    return build(tmp_path_factory.mktemp("asan6"), "address,undefined")


def run(exe, requests, launch):
    """requests: [(op, dtype code, n, input bytes)] -> [reply]: a compress's stream; a decompress's
    (verdict word, output bytes)."""
    data = b"".join(struct.pack("<4q", op, code, n, len(body)) + body for op, code, n, body in requests)
    out = subprocess.run([str(exe), *map(str, launch)], input=data, capture_output=True, timeout=600)
    assert out.returncode == 0, f"exit {out.returncode}: " + out.stderr.decode()[-3000:]
    replies, pos = [], 0
    for op, *_ in requests:
        verdict = None
        if op == DECOMPRESS:
            (verdict,) = struct.unpack_from("<Q", out.stdout, pos)
            pos += 8
        (size,) = struct.unpack_from("<q", out.stdout, pos)
        body = out.stdout[pos + 8 : pos + 8 + size]
        pos += 8 + size
        replies.append(body if op == COMPRESS else (verdict, body))
    assert pos == len(out.stdout)
    return replies


@lru_cache(maxsize=None)
def status_messages():
    """Status code -> message, from ffi/zipccl_format.h (the enum and error_message's cases)."""
    text = (ROOT / "ffi" / "zipccl_format.h").read_text()
    codes = {name: int(v) for name, v in re.findall(r"\b(kErr\w+) = (\d+),", text)}
    return {codes[name]: msg for name, msg in re.findall(r'case (kErr\w+): return "([^"]+)";', text)}


def category(message):
    return " ".join(message.split()[:3])


def silu(n, dtype, seed):
    g = gaussian(n, "float32", seed=seed)
    return (g / (1 + np.exp(-g))).astype(dtype)


@np.errstate(over="ignore")
def kinds(dtype):
    """Every kind of data the encoder treats differently, each a few blocks to a few groups."""
    B = r6.BLOCK
    mixed = gaussian(3 * B + 77, dtype, seed=3)  # specials inside coded blocks: escapes and zeros
    specials = special_values(dtype)
    wide = specials.astype(np.float32)
    odd = specials[~np.isfinite(wide) | (np.abs(wide) < np.finfo(np.float32).tiny)]
    mixed[::37] = np.resize(odd, mixed[::37].size)
    scales = gaussian(6 * B + 5, "float32", seed=5) * np.exp2(np.arange(6 * B + 5) // B * 9 - 30)
    half_raw = np.concatenate([gaussian(2 * B, dtype, seed=6), random_bits(2 * B + 9, dtype, seed=7)])
    return {
        "gaussian": gaussian(r6.GROUP_BLOCKS * B + 2 * B + 1234, dtype, seed=2),  # 2 groups, a partial block
        "relu": np.maximum(gaussian(3 * B + 31, dtype, seed=4), 0),
        "negative relu": -np.maximum(gaussian(2 * B, dtype, seed=4), 0),  # the family's flips
        "silu": silu(r6.GROUP_BLOCKS * B + 5, dtype, seed=8),
        "mixed": mixed,
        "specials": np.tile(specials, 30),
        "scales": scales.astype(dtype),  # a ref a block; subnormals and Infs where the dtype has them
        "random bits": random_bits(2 * B + 1, dtype),  # STORED_RAW
        "half raw": half_raw,  # raw blocks in a coded stream
        "zeros": np.zeros(B + 3, dtype),
        "empty": np.zeros(0, dtype),
        "one": gaussian(1, dtype, seed=9),
        "4095": gaussian(4095, dtype, seed=10),
        "4097": gaussian(4097, dtype, seed=11),
    }


def bits(x):
    return np.ascontiguousarray(x).view(np.uint16 if x.itemsize == 2 else np.uint32)


def descriptors(stream, n):
    if stream[6] & r6.FLAG_STORED_RAW:
        return []
    return [r6.read_descriptor(stream, b) for b in range(-(-n // r6.BLOCK))]


@pytest.mark.parametrize("launch", LAUNCHES, ids=["1sm", "4sm"])
@pytest.mark.parametrize("dtype", DTYPES)
def test_compress_writes_the_reference_stream_and_decompress_every_bit(emulator, dtype, launch):
    cases = kinds(dtype)
    code = CODES[dtype]
    requests = [(COMPRESS, code, x.size, x.tobytes()) for x in cases.values()]
    expected = {name: r6.compress(x) for name, x in cases.items()}
    requests += [(DECOMPRESS, code, x.size, expected[name]) for name, x in cases.items()]
    replies = run(emulator, requests, launch)
    seen = {"group": 0, "own-ref group": 0, "group-ref group": 0, "flip": 0, "raw block": 0, "stored raw": 0}
    for i, (name, x) in enumerate(cases.items()):
        stream, (verdict, out) = replies[i], replies[len(cases) + i]
        assert stream == expected[name], f"{name}: {len(stream)} bytes, the reference {len(expected[name])}"
        assert verdict == NO_ERROR, (name, hex(verdict))
        np.testing.assert_array_equal(np.frombuffer(out, bits(x).dtype), bits(x), err_msg=name)
        d = descriptors(stream, x.size)
        seen["stored raw"] += bool(stream[6])
        seen["raw block"] += sum(b["raw"] for b in d)
        seen["flip"] += sum(b["flip"] for b in d)
        for g in range(0, len(d), r6.GROUP_BLOCKS):
            group = [b for b in d[g : g + r6.GROUP_BLOCKS] if b["code"] == r6.GROUP_CODE]
            seen["group"] += bool(group)
            refs = {b["ref"] for b in group}
            seen["group-ref group" if len(refs) == 1 and len(group) > 1 else "own-ref group"] += bool(group)
    # the data exercised every choice the encoder makes (in the reference's stream, so in ours)
    assert all(seen.values()), seen


def family_coded(dtype):
    """A valid stream of 8 blocks, block c coded under the family's combo c (member c >> 1, flip
    c & 1; no group code), each on the data among a few kinds that the combo codes best: the
    encoder takes a member only where it wins, so its streams need not hold every combo."""
    lay = r6.Layout(CODES[dtype])
    g = gaussian(r6.BLOCK, "float32", seed=31)
    data = [g, np.maximum(g, 0), -np.maximum(g, 0), 1 + g / 20, -1 - g / 20, g / (1 + np.exp(-g))]
    blocks, descs, records, end = [], [], [], 0
    for c in range(2 * r6.MEMBERS):
        best = None
        for v in (d.astype(dtype) for d in data):
            s, q, low = r6.split(lay, v)
            ref = r6.block_ref(lay, q)
            lengths = r6.block_code(c >> 1, c & 1, None)
            size = r6._coded_size(lay, r6.symbols(lay, s, q, low, ref), lengths)
            if size < v.nbytes and (best is None or size < best[0]):
                best = (size, v, r6.encode_body(lay, s, q, low, ref, lengths), ref)
        assert best is not None, (dtype, c)
        _, v, record, ref = best
        end += len(record)
        blocks.append(v), records.append(record)
        descs.append(r6.descriptor(end, dict(ref=ref, code=c >> 1, flip=c & 1, raw=False, table=None)))
    x = np.concatenate(blocks)
    return x, r6.header(CODES[dtype], 0, x.size) + b"".join(descs) + b"".join(records)


@pytest.mark.parametrize("dtype", DTYPES)
def test_every_family_code_decodes(emulator, dtype):
    """Each of the family's 8 codes (4 members, each also with the sign read inverted) through the
    decoder's per-dtype tables (Tables::fam, built at compile time), bit for bit."""
    x, stream = family_coded(dtype)
    assert [d["code"] * 2 + d["flip"] for d in descriptors(stream, x.size)] == list(range(2 * r6.MEMBERS))
    np.testing.assert_array_equal(bits(r6.decompress(stream, dtype, x.size)), bits(x))
    ((verdict, out),) = run(emulator, [(DECOMPRESS, CODES[dtype], x.size, stream)], LAUNCHES[1])
    assert verdict == NO_ERROR, hex(verdict)
    np.testing.assert_array_equal(np.frombuffer(out, bits(x).dtype), bits(x))


# Streams to corrupt: a group's table and its own-coded blocks, escapes inside coded blocks, raw
# blocks among coded ones, a float32 group; each a few blocks so that the reference decodes fast.
@np.errstate(over="ignore")
def hostile_cases():
    B = r6.BLOCK
    mixed = gaussian(2 * B + 100, "float16", seed=21)
    mixed[::29] = np.resize(special_values("float16"), mixed[::29].size)
    return {
        "bf16 group": gaussian(3 * B + 333, "bfloat16", seed=20),
        "fp16 mixed": mixed,
        "bf16 half raw": np.concatenate([gaussian(B, "bfloat16", seed=22), random_bits(B + 7, "bfloat16", seed=23)]),
        "fp32 silu": silu(2 * B + 1, "float32", seed=24),
    }


def reference_verdict(stream, dtype, n):
    try:
        return "", r6.decompress(stream, dtype, n)
    except r6.CorruptPayload as e:
        return str(e), None


def check_verdicts(replies, cases, streams):
    messages = status_messages()
    rejected = 0
    for (name, dtype, n), stream, (verdict, out) in zip(cases, streams, replies):
        message, y = reference_verdict(stream, dtype, n)
        if not message:
            assert verdict == NO_ERROR, (name, hex(verdict))
            np.testing.assert_array_equal(np.frombuffer(out, bits(y).dtype), bits(y), err_msg=name)
            continue
        rejected += 1
        assert verdict != NO_ERROR, (name, message)
        status = verdict & 0xFF
        assert category(messages[status]) == category(message), (name, message, messages[status], hex(verdict))
        block = re.search(r"\(block (\d+)", message)
        if block:  # the reference names the failing block: it must be ours
            assert verdict >> 8 == int(block.group(1)) + 1, (name, message, hex(verdict))
    return rejected


@pytest.mark.parametrize("launch", LAUNCHES, ids=["1sm", "4sm"])
def test_mutated_streams_get_the_references_verdict(emulator, launch):
    rng = np.random.default_rng(zlib.crc32(b"cuda6") + launch[0])
    cases, streams, requests = [], [], []
    for name, x in hostile_cases().items():
        stream = r6.compress(x)
        for _ in range(60):
            bad = mutate(stream, rng)
            cases.append((name, x.dtype, x.size))
            streams.append(bad)
            requests.append((DECOMPRESS, CODES[x.dtype.name], x.size, bad))
    replies = run(emulator, requests, launch)
    rejected = check_verdicts(replies, cases, streams)
    assert rejected > len(cases) // 3, rejected  # the mutations reached the checks


def test_hostile_headers_tables_and_descriptors(emulator):
    """Targeted corruptions of each structure, each a category the reference names."""
    x = gaussian(3 * r6.BLOCK + 333, "bfloat16", seed=20)
    s = bytearray(r6.compress(x))
    nb = -(-x.size // r6.BLOCK)
    data = r6.HEADER_BYTES + r6.DESC_BYTES * nb
    assert r6.read_descriptor(bytes(s), 0)["table"], "the case needs a group table"

    def edit(at, value):
        t = bytearray(s)
        t[at : at + len(value)] = value
        return bytes(t)

    def desc(b, **fields):
        d = dict(r6.read_descriptor(bytes(s), b), **fields)
        v = d["end"] | d["ref"] << 32 | d["code"] << 42 | d["flip"] << 46 | d["raw"] << 47 | d["table"] << 48
        return edit(r6.HEADER_BYTES + r6.DESC_BYTES * b, (v | d["reserved"] << 49).to_bytes(8, "little"))

    lengths = r6.unpack_table(bytes(s[data : data + r6.TABLE_BYTES]))
    longest = int(np.argmax(np.where(lengths < 12, lengths, 0)))
    lengths[longest] += 1  # a code with a Kraft sum under 1: the last windows start no code
    bad = [
        edit(data, r6.pack_table(lengths)),
        edit(0, b"ZCCM"), edit(4, b"\x05"), edit(5, b"\x02"), edit(6, b"\x02"), edit(7, b"\x0b"),
        edit(8, (x.size + 1).to_bytes(8, "little")), bytes(s[:15]), bytes(s[: data - 1]), bytes(s[:-1]),
        edit(data, b"\xdd"),  # a length over 12
        edit(data, b"\x11" * r6.TABLE_BYTES),  # a Kraft sum over 1
        edit(data, b"\x00" * r6.TABLE_BYTES),  # no code
        desc(1, reserved=1), desc(1, code=7), desc(2, table=1), desc(0, table=0), desc(1, raw=1),
        desc(2, end=0), desc(1, ref=1023), desc(0, end=100), bytes(s) + b"\x00",
        edit(data + r6.TABLE_BYTES, b"\xff"),  # block 0's width field and first deviation
    ]
    cases = [("hostile", x.dtype, x.size)] * len(bad)
    replies = run(emulator, [(DECOMPRESS, 1, x.size, t) for t in bad], LAUNCHES[-1])
    # each rejected as the reference rejects it, but the appended byte (§2 reads nothing past the records)
    assert check_verdicts(replies, cases, bad) == len(bad) - 1


@np.errstate(over="ignore")
def fast_path_cases():
    """The decoder's fast path (docs/GPU.md, "Second version"): long codes and escapes inside full
    lanes, family and group codes; fp16, whose refs are all under 123 (a family-coded block's values
    are checked one by one there, a group-coded one's where the code holds classes its ref cannot
    have)."""
    B = r6.BLOCK
    rng = np.random.default_rng(60)
    narrow = rng.choice([1.0, 1.19, 1.41, 1.68, -1.0, -1.19], 3 * B + 17)  # member 1 (narrow): long codes
    rare = rng.random(narrow.size) < 0.03
    narrow[rare] *= np.exp2(-rng.integers(2, 25, rare.sum()))
    tails = gaussian(r6.GROUP_BLOCKS * B // 4 + 300, "float32", seed=61)
    tails[::53] *= np.exp2(rng.integers(-40, 12, tails[::53].size))  # rare classes: long group codes
    fp16 = gaussian(2 * B + 45, "float16", seed=62)
    specials = special_values("float16")
    wide = specials.astype(np.float32)
    fp16[::41] = np.resize(specials[~np.isfinite(wide) | (np.abs(wide) < 6e-5)], fp16[::41].size)
    family = gaussian(B, "float32", seed=63)
    family[::53] *= np.exp2(-rng.integers(8, 28, family[::53].size))  # one block: the family's long codes
    mixed = gaussian(2 * B + 3, "bfloat16", seed=64)
    specials = special_values("bfloat16")
    wide = specials.astype(np.float32)
    mixed[::97] = np.resize(specials[~np.isfinite(wide) | (np.abs(wide) < np.finfo(np.float32).tiny)], mixed[::97].size)
    return {"bf16 narrow": narrow.astype("bfloat16"), "bf16 tails": tails.astype("bfloat16"),
            "fp16 specials": fp16, "bf16 family": family.astype("bfloat16"), "bf16 escapes": mixed,
            "fp32 tails": tails[: 2 * B + 9].copy()}


def group_lengths(stream, nb, b):
    """Block b's group code (a code length a symbol), or None if block b does not take its group's
    code."""
    d = r6.read_descriptor(stream, b)
    if d["raw"] or d["code"] != r6.GROUP_CODE:
        return None
    first = b - b % r6.GROUP_BLOCKS
    at = r6.HEADER_BYTES + r6.DESC_BYTES * nb + (r6.read_descriptor(stream, first - 1)["end"] if first else 0)
    return r6.unpack_table(stream[at : at + r6.TABLE_BYTES])


def group_safe_ref(stream, nb, b):
    """The lowest ref at which every class of block b's group code gives a normal q (its largest
    distance + 4; from it up the decoder checks no value: docs/GPU.md, "Sixth version"), or None
    if block b does not take its group's code."""
    lengths = group_lengths(stream, nb, b)
    if lengths is None:
        return None
    cls = np.nonzero(lengths)[0] & 127
    cls = cls[(cls != r6.CLASS_ZERO) & (cls < r6.CLASS_ESC)]
    return int(cls.max()) - 1 + 4 if cls.size else 0


def test_fast_path_values_and_verdicts_at_lane_ends(emulator):
    """Every bit of streams whose full lanes hold escapes and long codes, then targeted corruptions:
    each block's ref moved (classes whose q is not normal, a ref at q_max, a group-coded block's
    just under and at the ref from which its values go unchecked), a bit flipped in the lane
    lengths and in the lanes (lanes that end early or late), the last bytes cut."""
    rng = np.random.default_rng(64)
    cases, streams, requests = [], [], []
    for name, x in fast_path_cases().items():
        stream = r6.compress(x)
        code = CODES[x.dtype.name]
        requests.append((DECOMPRESS, code, x.size, stream))
        cases.append((name, x.dtype, x.size)), streams.append(stream)
        nb = -(-x.size // r6.BLOCK)
        data = r6.HEADER_BYTES + r6.DESC_BYTES * nb
        q_max = {1: 1020, 2: 124, 3: 1020}[code]
        bad = []
        for b in range(nb):
            d = r6.read_descriptor(stream, b)
            if d["raw"]:
                continue
            at = r6.HEADER_BYTES + r6.DESC_BYTES * b
            word = int.from_bytes(stream[at : at + 8], "little")
            safe = group_safe_ref(stream, nb, b)
            for ref in {d["ref"] - 1, d["ref"] + 1, d["ref"] - 7, 3, 4, 122, 123, q_max - 1, q_max,
                        *(() if safe is None else (safe - 1, safe))}:
                if 0 <= ref < 1 << (10 if code != 2 else 7):
                    w = (word & ~(0x3FF << 32)) | ref << 32
                    bad.append(stream[:at] + w.to_bytes(8, "little") + stream[at + 8 :])
            start = data + (r6.read_descriptor(stream, b - 1)["end"] if b else 0) + (r6.TABLE_BYTES if d["table"] else 0)
            for off in [0, 1, 2, 3, 5, 8, 13, 21] + list(rng.integers(0, data + d["end"] - start, 12)):
                t = bytearray(stream)
                t[start + int(off)] ^= 1 << int(rng.integers(0, 8))
                bad.append(bytes(t))
        bad += [stream[:-k] for k in (1, 2, 3, 4, 5)]
        for t in bad:
            requests.append((DECOMPRESS, code, x.size, t))
            cases.append((name, x.dtype, x.size)), streams.append(t)
    replies = run(emulator, requests, LAUNCHES[-1])
    rejected = check_verdicts(replies, cases, streams)
    assert rejected > len(cases) // 3, rejected


def test_no_data_race_under_threadsanitizer(tmp_path):
    """Two groups and a partial one, on two SMs of two CUDA blocks at once (under ThreadSanitizer the
    cost is the launches' threads: four SMs of four took ~2.5 minutes of CI's time)."""
    exe = build(tmp_path, "thread")
    for dtype in ("bfloat16", "float32"):
        xs = [gaussian(r6.GROUP_BLOCKS * r6.BLOCK + 4097, dtype, seed=30), silu(3 * r6.BLOCK + 1, dtype, seed=31)]
        code = CODES[dtype]
        replies = run(exe, [(COMPRESS, code, x.size, x.tobytes()) for x in xs] +
                      [(DECOMPRESS, code, x.size, r6.compress(x)) for x in xs], (2, 2))
        for i, x in enumerate(xs):
            assert replies[i] == r6.compress(x)
            assert replies[len(xs) + i][0] == NO_ERROR
            assert replies[len(xs) + i][1] == x.tobytes()


def test_symbol_indices_match_symbol_of(tmp_path):
    """The compress kernels' table indices (cuda6_device.cuh SymbolIndex: exact, and the one-min
    index of the per-block tables whose escape entry sits at the block's limit) give format6.h
    symbol_of's symbol for every bf16 and fp16 value (fp32: every sign and q) at every ref."""
    exe = tmp_path / "cuda6_symbol_index"
    subprocess.run([shutil.which("g++") or "c++", "-std=c++20", "-O1", "-DZIPCCL_HOST_EMULATION",
                    f"-I{ROOT / 'ffi'}", f"-I{ROOT / 'tests'}", str(ROOT / "tests" / "cuda6_symbol_index.cc"),
                    "-pthread", "-o", str(exe)], check=True, timeout=300)
    out = subprocess.run([str(exe)], capture_output=True, text=True, timeout=300)
    assert out.returncode == 0 and out.stdout.startswith("ok "), out.stdout + out.stderr


def test_group_code_lengths_match_code_lengths(tmp_path):
    """GroupKernel's group-code lengths (the one-thread merge, the depths by pointer jumping, the
    flattening rounds) are zipccl_format.h code_lengths's on deep (Fibonacci), tied, tiny and random
    counts, under AddressSanitizer and UBSan."""
    exe = tmp_path / "cuda6_group_code"
    subprocess.run([shutil.which("g++") or "c++", "-std=c++20", "-O1", "-fsanitize=address,undefined",
                    "-fno-sanitize-recover=all", "-DZIPCCL_HOST_EMULATION", f"-I{ROOT / 'ffi'}", f"-I{ROOT / 'tests'}",
                    str(ROOT / "tests" / "cuda6_group_code.cc"), "-pthread", "-o", str(exe)], check=True, timeout=600)
    out = subprocess.run([str(exe)], capture_output=True, text=True, timeout=300)
    assert out.returncode == 0 and out.stdout.startswith("ok "), out.stdout + out.stderr[-3000:]


def test_cuda_build_compiles_for_sm90_within_budget(tmp_path):
    nvcc = shutil.which("nvcc")
    if nvcc is None:
        pytest.skip("no nvcc on PATH")
    src = tmp_path / "cuda6.cu"
    src.write_text('#include <cuda_runtime.h>\n#include "cuda6_codec.cuh"\nnamespace c6 = zipccl::cuda6;\n'
                   "void f(int d, const void* x, int64_t n, uint8_t* o, unsigned long long* l, void* w,"
                   " const c6::Tables* t) { c6::Compress(d, x, n, o, l, w, t, 0); }\n"
                   "void g(int d, const uint8_t* i, int64_t s, int64_t n, void* y, unsigned long long* v,"
                   " const c6::Tables* t) { c6::Decompress(d, i, s, n, y, v, t, 132, 0); }\n")
    out = subprocess.run([nvcc, "-O3", "-std=c++17", "-arch=sm_90", "-Xptxas", "-v", f"-I{ROOT / 'ffi'}", "-c",
                          str(src), "-o", str(tmp_path / "cuda6.o")], capture_output=True, text=True, timeout=300)
    assert out.returncode == 0, out.stderr[-3000:]
    kernels = re.findall(r"Compiling entry function '(\w+)'", out.stderr)
    # (GroupKernel's 8-byte stack frame: the call of the 64-bit division that finds its item; no spill)
    usage = re.findall(r"Used (\d+) registers, used \d+ barriers(?:, \d+ bytes cumulative stack size)?(?:, (\d+) bytes smem)?",
                       out.stderr)
    # Scan; Group, Code, Decode, Accumulate (two: several blocks a round or not) and WarpCodes (the
    # reduce step, in cuda6_codec.cuh's Accumulate) for each dtype
    assert len(usage) == len(kernels) == 19, out.stderr
    assert not re.search(r"[1-9]\d* bytes spill stores", out.stderr), out.stderr
    for name, (regs, smem) in zip(kernels, usage):  # the occupancy docs/GPU.md predicts from
        # AccumulateKernel: two CTAs an SM by registers (where its dynamic shared memory allows) and no
        # static shared memory (its static_assert: 8 rows of float32 fit 227 KB); GroupKernel two (its
        # dynamic shared memory: GroupShared's static_assert, 99 KB); four for the others
        limit, smem_limit = (128, 0) if "AccumulateKernel" in name else (64, 40 * 1024)
        assert int(regs) <= limit and int(smem or 0) <= smem_limit, (name, regs, smem)


def test_bit_selects_ptx_table_is_the_select():
    """BitSelect's device form is inline PTX, which the host emulation does not run (it runs the C++
    form): its lop3 table, read as PTX defines it (the function of 0xF0, 0xCC, 0xAA given to the
    operands in their order), selects b's bits where m is set and a's elsewhere."""
    src = (ROOT / "ffi" / "cuda6_device.cuh").read_text()
    m = re.search(r'asm\("lop3\.b32 %0, %1, %2, %3, (0x[0-9A-Fa-f]+);" : "=r"\(r\) : '
                  r'"r"\((\w+)\), "r"\((\w+)\), "r"\((\w+)\)\)', src)
    assert m, "BitSelect's lop3 not found"
    val = dict(zip(m.groups()[1:], (0xF0, 0xCC, 0xAA)))
    assert int(m.group(1), 16) == (val["a"] & ~val["m"] | val["b"] & val["m"]) & 0xFF


def test_the_timing_tool_round_trips_under_emulation(tmp_path):
    """tools/v6_cuda/time6.cu (what tools/v6_cuda/measure.sh times on a GPU), built for the emulation."""
    exe = tmp_path / "time6"
    subprocess.run([shutil.which("g++") or "c++", "-std=c++20", "-O1", "-DZIPCCL_HOST_EMULATION", "-x", "c++",
                    str(ROOT / "tools" / "v6_cuda" / "time6.cu"), "-pthread", "-o", str(exe)], check=True, timeout=300)
    data = tmp_path / "data.bf16"
    data.write_bytes(gaussian(5000, "bfloat16", seed=40).tobytes())
    for args, rows in ((["bf16", "gaussian", "20000"], "3"), (["fp16", "relu", "9000"], None),
                       (["fp32", "gaussian", "40000"], "9"), (["bf16", "file", "12345", "1", str(data)], None)):
        env = dict(os.environ, **({"ROWS": rows} if rows else {}))  # ROWS: the reduce step (both kernels) too
        out = subprocess.run([str(exe), *args, *([] if args[1] == "file" else ["1"])], capture_output=True,
                             text=True, timeout=300, env=env)
        assert out.returncode == 0 and out.stdout.strip().endswith("bit-exact"), (args, out.stdout, out.stderr)
        assert (f"sum of {rows} rows of {int(args[2]) // int(rows or 1)}" in out.stdout) == bool(rows), out.stdout
