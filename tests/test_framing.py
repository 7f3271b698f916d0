"""bench framing: a stream taken apart field by field adds up to the stream,
whatever its groups chose (sign coding, implied zeros, own refs, coded byte
planes, raw blocks, STORED_RAW)."""

import jax.numpy as jnp
import numpy as np
import pytest

import zipccl_jax as zc
from zipccl_jax import reference as ref
from zipccl_jax.bench import data, framing

N = 5 * ref.BLOCK * ref.GROUP_BLOCKS // 2 + 123  # 2.5 groups, a short last block


def stream(x):
    c = zc.compress(jnp.asarray(x))
    return np.asarray(c.payload).tobytes()[: int(c.nbytes)]


def masks(buf, n):
    nb = -(-n // ref.BLOCK)
    at = ref.HEADER_BYTES + ref.DESC_BYTES * nb
    return {buf[at + ref.GROUP_RECORD_BYTES * g] for g in range(-(-nb // ref.GROUP_BLOCKS))}


def mixed(dtype):
    """Groups that choose differently: Gaussian, ReLU'd (zeros, skewed signs), a block of random bits (raw)."""
    x = data.gaussian(N, dtype, seed=3)
    third = N // 3
    x[third: 2 * third] = np.maximum(x[third: 2 * third], 0)
    x[:ref.BLOCK] = data.random_bits(ref.BLOCK, dtype, seed=4)
    return x


@pytest.mark.parametrize("dtype", ["bfloat16", "float16", "float32"])
def test_the_parts_add_up_to_the_stream(dtype):
    x = mixed(dtype)
    buf = stream(x)
    bits = framing.account(x, buf)
    nb, ng = -(-N // ref.BLOCK), -(-N // (ref.BLOCK * ref.GROUP_BLOCKS))
    assert sum(bits[p] for p in framing.PARTS) == 8 * len(buf)
    assert bits["header"] == 128 and bits["descriptors"] == 8 * ref.DESC_BYTES * nb and bits["group records"] == 24 * ng
    assert bits["raw blocks"] == 8 * ref.BLOCK * x.itemsize  # the random block, and only it
    assert 0 <= bits["padding"] < 8 * nb
    assert bits["symbol codes"] >= bits["symbol entropy"] > 0.5 * bits["symbol codes"]
    assert {m & (ref.MASK_SIGN | ref.MASK_ZEROS) for m in masks(buf, N)} >= {ref.MASK_SIGN | ref.MASK_ZEROS}


def test_a_coded_byte_plane_and_escapes_are_counted():
    # float16 whose low byte takes 4 values (a coded plane), with Inf and NaN (escaped exponents)
    rng = np.random.default_rng(0)
    bits16 = (rng.normal(size=N).astype(np.float16).view(np.uint16) & 0xFF00) | rng.choice([0, 1, 2, 0x80], N)
    bits16[::1000] = 0x7C00
    x = bits16.astype(np.uint16).view(np.float16)
    buf = stream(x)
    assert all(m & 1 for m in masks(buf, N))
    bits = framing.account(x, buf)
    assert bits["coded planes"] > 0 and bits["escaped exponents"] == 5 * len(range(0, N, 1000))
    assert sum(bits[p] for p in framing.PARTS) == 8 * len(buf)
    assert bits["coded planes"] < 2.1 * N  # ~1.75 bits a byte of 4 values, not 8


def test_a_stored_raw_stream_is_all_raw_and_another_version_is_refused():
    x = data.random_bits(1000, "bfloat16", seed=1)
    buf = stream(x)
    assert buf[6] & ref.FLAG_STORED_RAW
    bits = framing.account(x, buf)
    assert bits["raw blocks"] == 8 * 2000 and sum(bits[p] for p in framing.PARTS) == 8 * len(buf)
    with pytest.raises(ValueError, match="version 2 stream"):
        framing.account(x, buf[:4] + b"\x02" + buf[5:])


def test_a_stream_of_other_data_does_not_add_up():
    x = data.gaussian(N, "bfloat16", seed=5)
    buf = stream(x)
    other = x.copy()
    other[3 * ref.BLOCK: 4 * ref.BLOCK] *= 1024  # block 3's exponents are not what its body codes
    with pytest.raises(AssertionError, match="block 3 does not add up"):
        framing.account(other, buf)


def test_the_command_prints_a_row_per_dataset(capsys):
    framing.main(["--data", "gaussian bfloat16", "--no-zipnn"])
    out = capsys.readouterr().out.splitlines()
    assert out[0] == "bits per value" and out[1].startswith("| data | total | framing | header |")
    cells = out[3].split(" | ")
    assert cells[0] == "| gaussian bfloat16" and 10.3 < float(cells[1]) < 10.7  # 16 / 1.52
    with pytest.raises(SystemExit, match="no data named"):
        framing.main(["--data", "nonsense float16"])

