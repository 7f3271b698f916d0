"""Prefix codes as the format uses them (docs/FORMAT.md §4, §6): deterministic Huffman lengths limited
to 12 bits, canonical codes written LSB first, decode tables, and a bit reader. Shared by the
numpy reference (reference.py) and the study tools (bench/static_codes.py)."""

from __future__ import annotations

import numpy as np

MAX_CODE_LEN = 12


class CorruptPayload(ValueError):
    """The bytes are not a valid stream for the requested dtype and shape."""


def huffman_lengths(counts: np.ndarray) -> np.ndarray:
    """§6: the deterministic two-queue Huffman code lengths (unlimited)."""
    used = [s for s in range(len(counts)) if counts[s] > 0]
    lengths = np.zeros(len(counts), np.int64)
    if len(used) == 1:
        lengths[used[0]] = 1
        return lengths
    leaves = sorted(used, key=lambda s: (counts[s], s))
    weight = [int(counts[s]) for s in leaves]  # nodes 0..n-1 are the leaves, in that order
    parent = [0] * (2 * len(leaves) - 1)
    li, ni = 0, len(leaves)  # fronts of the leaf queue and the node queue

    def take():
        nonlocal li, ni
        if li < len(leaves) and (ni >= len(weight) or weight[li] <= weight[ni]):
            li += 1
            return li - 1
        ni += 1
        return ni - 1

    while len(weight) < 2 * len(leaves) - 1:
        a, b = take(), take()
        parent[a] = parent[b] = len(weight)
        weight.append(weight[a] + weight[b])
    depth = [0] * len(weight)
    for node in range(len(weight) - 2, -1, -1):
        depth[node] = depth[parent[node]] + 1
    for i, s in enumerate(leaves):
        lengths[s] = depth[i]
    return lengths


def code_lengths(counts: np.ndarray) -> np.ndarray:
    """§6: Huffman lengths, flattening the counts until no code is over 12 bits."""
    counts = np.asarray(counts, np.int64).copy()
    while True:
        lengths = huffman_lengths(counts)
        if lengths.max() <= MAX_CODE_LEN:
            return lengths
        k = min(int(lengths.max()) - MAX_CODE_LEN, 16)  # divided by 2^k, rounded up
        counts = np.where(counts > 0, (counts + (1 << k) - 1) >> k, 0)


def canonical_codes(lengths: np.ndarray) -> np.ndarray:
    """§4: canonical codes, bit-reversed so they are written value-LSB first."""
    codes = np.zeros(len(lengths), np.int64)
    code = 0
    for length in range(1, MAX_CODE_LEN + 1):
        for s in range(len(lengths)):
            if lengths[s] == length:
                codes[s] = int(f"{code:0{length}b}"[::-1], 2)
                code += 1
        code <<= 1
    return codes


def decode_lut(lengths: np.ndarray) -> tuple[list, list]:
    """Symbol and length for every 12-bit window (read LSB first); length 0 = no code."""
    sym = np.zeros(1 << MAX_CODE_LEN, np.int64)
    size = np.zeros(1 << MAX_CODE_LEN, np.int64)
    for s, code in enumerate(canonical_codes(lengths)):
        if lengths[s]:
            window = code + (np.arange(1 << (MAX_CODE_LEN - lengths[s])) << lengths[s])
            sym[window], size[window] = s, lengths[s]
    return sym.tolist(), size.tolist()



def pack_bits(values: np.ndarray, widths: np.ndarray) -> bytes:
    """Write each value's `width` low bits, LSB first, zero padded to a byte."""
    total = int(widths.sum())
    if total == 0:
        return b""
    starts = np.repeat(np.cumsum(widths) - widths, widths)
    bits = (np.repeat(values, widths) >> (np.arange(total) - starts)) & 1
    return np.packbits(bits.astype(np.uint8), bitorder="little").tobytes()



class BitReader:
    """Reads bits [pos, stop) of value, LSB first; a code's window reads past stop as 0."""

    def __init__(self, value: int, pos: int, stop: int):
        self.value, self.pos, self.stop = value, pos, stop

    def take(self, width: int) -> int:
        if self.pos + width > self.stop:
            raise CorruptPayload("corrupt block bitstream")
        self.pos += width
        return (self.value >> (self.pos - width)) & ((1 << width) - 1)

    def symbol(self, lut) -> int:
        """One prefix code's symbol through its decode table (decode_lut)."""
        window = (self.value >> self.pos) & ((1 << min(self.stop - self.pos, MAX_CODE_LEN)) - 1)
        if not lut[1][window]:
            raise CorruptPayload("corrupt block bitstream")
        self.take(lut[1][window])
        return lut[0][window]

