"""Wire bytes against the codec: what a compressed collective puts on the wire,
against what the codec alone makes of the same chunks.

    XLA_FLAGS=--xla_force_host_platform_device_count=8 python -m zipccl_jax bench wire [--json out.json]

A sized transfer (one phase of a collective: collectives/_transfer.py sized_transfer)
sends every stream at one capacity, the smallest ladder rung that holds the
largest stream of all devices. From the exact stream sizes (the CPU codec on
the real chunks, headers included) this module computes, per device, the
codec-alone bytes and the wire bytes of the scheme before this benchmark
(contiguous chunks, 9 rungs), of the library's (psum's chunks interleaved, a
denser ladder) and of alternatives:

- layout: a psum chooses its reduce-scatter chunks, so chunk j can take the
  blocks j, j + n, j + 2n, ... of the bucket (interleaved), and every chunk
  then mixes all leaves. psum_scatter and all_to_all must send slice j to
  device j, and all_gather and ppermute send one stream per device: their
  chunks are given;
- ladder: the 9 rungs before, rungs spaced geometrically above the
  format's fixed part, rungs fitted to the ratios measured on other data;
- the split transfer: a head of F bytes per stream (F: the sign and low
  mantissa bits the format stores raw) sent without sizing, only the tail
  laddered. In bytes that is a ladder whose rungs all lie above F;
- sizing: one consensus per phase (the library's on the CPU), or one per shift
  of a square phase sent as n - 1 ppermutes, or each stream at its exact length
  plus a 4-byte length (ragged_all_to_all), or the CUDA transfer: each stream at
  a capacity fixed when tracing (the GPU model's expected ratio and a margin)
  plus the excess of a longer one and its 4-byte length (static + spill).

wire_data.py gathers the real tensors and checks the simulation of the
library's scheme against the library's own Stats, byte for byte.
"""

from __future__ import annotations

import dataclasses
import functools
import os

import numpy as np

from .. import reference, strategy
from ..collectives._transfer import static_capacity
from ..collectives.psum import interleave_unit
from ..dtypes import DTYPE_CODES
from .codec import zipccl_bytes

TARGET = 0.97  # wire bytes at least this fraction of efficient: codec bytes / wire bytes
MAX_RUNGS = 64
COMPILE_ELEMENTS = 1 << 20  # per device, for the compile-cost table
SPLIT_TAIL_LOW = 0.25  # the split's lowest tail rung, as a fraction of the tail's capacity
BAND = 0.2  # banded ladders: fine rungs +-20% around the expected compressed size,
COARSE = 1.15  # and steps of 15% outside


def fixed_fraction(dtype) -> float:
    """The share of each value's bits the format stores beside its code (FORMAT.md §1, §3: the low
    bits of every value but a zero). No coded stream of nonzero values is smaller."""
    elem_bytes, _, low_bits = reference.LAYOUTS[DTYPE_CODES[np.dtype(dtype).name]]
    return low_bits / (8 * elem_bytes)


def stream_sizes(rows: np.ndarray) -> np.ndarray:
    """The length of the codec's stream of each row of rows [..., m] (bytes, header included)."""
    flat = rows.reshape(-1, rows.shape[-1])
    return np.array([zipccl_bytes(r) for r in flat], np.int64).reshape(rows.shape[:-1])


# ---------------------------------------------------------------------------
# phases and layouts


@dataclasses.dataclass(frozen=True)
class Phase:
    """One sized transfer: sizes[d, j] is the byte length of device d's stream
    j, copies[d, j] how many links it crosses (an all_to_all chunk 1, or 0
    for the device's own; an all_gather stream n - 1). Every stream holds
    `elems` values of `dtype`."""

    sizes: np.ndarray
    copies: np.ndarray
    elems: int
    dtype: str

    @property
    def raw(self) -> int:
        return self.elems * np.dtype(self.dtype).itemsize

    @property
    def capacity(self) -> int:
        return self.raw + reference.HEADER_BYTES


def scatter_phase(rows: np.ndarray) -> Phase:
    """rows [n, n, m]: device d's chunk j goes to device j (all_to_all, reduce-scatter)."""
    n = rows.shape[0]
    return Phase(stream_sizes(rows), 1 - np.eye(n, dtype=np.int64), rows.shape[-1], rows.dtype.name)


def gather_phase(parts: np.ndarray) -> Phase:
    """parts [n, m]: device d's one stream goes to every other device (all_gather)."""
    n = parts.shape[0]
    return Phase(stream_sizes(parts)[:, None], np.full((n, 1), n - 1), parts.shape[-1], parts.dtype.name)


def chunk_order(size: int, n: int, interleave: bool, unit: int | None = None) -> np.ndarray:
    """Positions of a bucket of `size` values (a multiple of n) in chunk order:
    chunk j is [j * size / n, (j + 1) * size / n) of the result. Interleaved,
    chunk j holds the units (default: zip_psum's, psum.interleave_unit) j,
    j + n, j + 2n, ... of the largest prefix that is a multiple of n units,
    then its contiguous share of the rest: reference.row_order, the layout
    the codec's handlers read and write."""
    return reference.row_order(size, n, (unit or interleave_unit(size, n)) if interleave else 0).reshape(-1)


def psum_phases(flat: np.ndarray, interleave: bool) -> list[Phase]:
    """flat [n, size]: each device's bucket -> zip_psum's reduce-scatter and
    all-gather phases (collectives/psum.py _psum_flat: zero-padded to a
    multiple of n, the reduced chunks are the float32 rank-ordered sums
    rounded once), in contiguous chunks (before) or interleaved (the library's)."""
    n, size = flat.shape
    padded = np.pad(flat, ((0, 0), (0, -size % n)))
    order = chunk_order(padded.shape[1], n, interleave)
    total = reference.accumulate(list(padded), padded.dtype)
    return [scatter_phase(padded[:, order].reshape(n, n, -1)), gather_phase(total[order].reshape(n, -1))]


@dataclasses.dataclass
class Case:
    """One kind of real traffic through one collective: its phases in
    contiguous chunks ("given": the only layout of all_gather, psum_scatter
    and all_to_all) and, where the collective chooses its chunks (psum),
    interleaved as the library now lays them out."""

    data: str
    collective: str
    given: list[Phase]
    interleaved: list[Phase] | None = None

    @property
    def name(self) -> str:
        return f"{self.data} / {self.collective}"

    @property
    def dtype(self) -> str:
        return self.given[0].dtype

    @property
    def devices(self) -> int:
        return self.given[0].sizes.shape[0]

    def phases(self, interleave: bool) -> list[Phase]:
        return self.interleaved if interleave and self.interleaved is not None else self.given


# ---------------------------------------------------------------------------
# ladders and schemes


@dataclasses.dataclass(frozen=True)
class Ladder:
    """Rungs as fractions of a stream's raw bytes (the top one, 1.0, is raw
    plus header), placed as strategy.capacities places them. With head > 0,
    the split transfer: head * raw bytes (8-aligned) go without sizing and
    the fractions apply to the rest."""

    name: str
    fractions: tuple
    head: float = 0.0

    def rungs(self, phase: Phase) -> tuple[int, ...]:
        h = int(self.head * phase.raw) // 8 * 8
        return tuple(h + r for r in strategy.capacities(phase.capacity - h, phase.raw - h, self.fractions))

    def fit(self, phase: Phase, need: int) -> int:
        """The smallest rung that holds `need` bytes."""
        rungs = self.rungs(phase)
        return rungs[int(np.searchsorted(rungs, need))]


BEFORE = Ladder("9 rungs (before)", (0.58, 0.62, 0.66, 0.69, 0.72, 0.77, 0.83, 0.9, 1.0))
SIXTEEN = Ladder("16 rungs (the library's until the size pass)", (0.56, 0.581, 0.602, 0.624, 0.647, 0.671, 0.696,
                                                                 0.722, 0.748, 0.776, 0.805, 0.834, 0.865, 0.897,
                                                                 0.93, 1.0))
LIBRARY = Ladder("library", strategy.DEFAULT_LADDER)


def geometric(k: int, dtype) -> Ladder:
    """k rungs in geometric progression from the fixed fraction to 1 (data-agnostic)."""
    low = fixed_fraction(dtype)
    return Ladder(f"geometric {k}", tuple(low ** (1 - i / k) for i in range(1, k + 1)))


def split(k: int, dtype) -> Ladder:
    """The split transfer: the fixed fraction as the unsized head; k tail
    rungs geometric from SPLIT_TAIL_LOW of the tail's capacity to all of it."""
    tail = (1.0,) if k == 1 else tuple(SPLIT_TAIL_LOW ** (1 - i / (k - 1)) for i in range(k))
    return Ladder(f"split {k}", tail, head=fixed_fraction(dtype))


def expected_ratio(dtype) -> float:
    """The cost model's expected ratio of the dtype (strategy.CostModel.ratios)."""
    return strategy.CostModel().ratio(dtype)


def banded(k: int, dtype) -> Ladder:
    """k rungs: steps of COARSE outside the band of +-BAND around the dtype's
    expected compressed size (1 / expected_ratio), down to the fixed
    fraction and up to raw; the rest geometric inside the band, where the
    ratios fall."""
    centre, floor = 1 / expected_ratio(dtype), fixed_fraction(dtype)
    low, high = centre * (1 - BAND), min(centre * (1 + BAND), 1.0)
    steps = [(i, f) for i in range(1, k) for f in (low / COARSE**i, high * COARSE**i) if floor < f < 1.0]
    coarse = [f for _, f in sorted(steps)[: max(0, k - 3)]]  # nearest the band first; the band keeps 2 rungs
    inside = k - len(coarse) - (high < 1.0)  # the band's top may be raw
    band = [low * (high / low) ** (i / max(1, inside - 1)) for i in range(inside)]
    return Ladder(f"banded {k}", tuple(sorted({min(f, 1.0) for f in coarse + band} | {1.0})))


def fitted(k: int, dtype, needs: list[tuple[float, float, float]]) -> Ladder:
    """k rungs (the top one 1.0) placed to minimise the bytes sent for
    `needs` (needs() of other cases), in units of the dtype's expected
    compressed size, so that data of one dtype places rungs for another."""
    scale = expected_ratio(dtype)
    rungs = _fitted(tuple(sorted(needs)), MAX_RUNGS)[k - 1]
    return Ladder(f"fitted {k}", tuple(sorted({min(1.0, r / scale) for r in rungs} | {1.0})))


@functools.lru_cache(maxsize=16)
def _fitted(needs: tuple, kmax: int) -> list[tuple]:
    """The best rungs below the top for sorted needs ((need, bytes, top) per
    phase, a need at or above its top pays the top), for 1..kmax rungs in
    all, by dynamic programming: best[j, b] is the cost of the needs up to b
    with j rungs below the top, the last at needs[b]."""
    below = [(x, w) for x, w, top in needs if x < top]
    xs = np.array([x for x, _ in below])
    cum = np.concatenate([[0.0], np.cumsum([w for _, w in below])])
    paid = np.concatenate([[0.0], np.cumsum([w * top for x, w, top in needs if x < top])])
    m = xs.size
    best, back = np.full((kmax, m), np.inf), np.zeros((kmax, m), int)
    if kmax > 1:
        best[1] = xs * cum[1:]
    for j in range(2, kmax):
        for b in range(1, m):
            options = best[j - 1, :b] + xs[b] * (cum[b + 1] - cum[1 : b + 1])
            back[j, b] = int(np.argmin(options))
            best[j, b] = options[back[j, b]]
    ladders = []
    for k in range(1, kmax + 1):
        totals = best[1:k] + (paid[m] - paid[1:])
        rungs = []
        if totals.size and totals.min() < paid[m]:
            j, b = np.unravel_index(int(np.argmin(totals)), totals.shape)
            for j in range(j + 1, 0, -1):
                rungs.append(float(xs[b]))
                b = back[j, b]
        ladders.append(tuple(sorted(rungs)))
    return ladders


def needs(case: Case, interleave: bool) -> list[tuple[float, float, float]]:
    """Per phase, in units of the dtype's expected compressed size: what its
    largest stream needs (as a rung fraction, strategy.capacities), the raw
    bytes its streams send, and the top rung (raw)."""
    scale = expected_ratio(case.dtype)
    return [((p.sizes.max() - reference.HEADER_BYTES + 0.5) / p.raw * scale, float(p.raw * p.copies.sum()), scale)
            for p in case.phases(interleave)]


@dataclasses.dataclass(frozen=True)
class Scheme:
    """How a collective's phases are sized: a ladder (None: each phase at its
    largest stream exactly, a bound), the interleaved layout where the
    collective chooses its chunks, one consensus per phase ("phase") or per
    shift of a square phase ("shift": n - 1 ppermutes), or each stream at its
    own length ("ragged": ragged_all_to_all), or at the static capacity with
    the excess spilled at its length ("static": every collective in a module
    lowered for CUDA, collectives/_transfer.py static_transfer)."""

    name: str
    ladder: Ladder | None
    interleave: bool = False
    sizing: str = "phase"

    def collectives(self, case: Case) -> str:
        """The collectives one phase runs, besides its consensus (a pmax)."""
        if self.sizing == "shift" and case.given[0].sizes.shape[1] > 1:
            return f"{case.devices - 1} ppermutes"
        if self.sizing == "ragged":
            return "2 (lengths, then ragged_all_to_all)"
        if self.sizing == "static":
            return "2 (static bulk with the spill lengths, ragged spill; no consensus)"
        return "2 (head unsized)" if self.ladder is not None and self.ladder.head else "1"


def phase_wire(phase: Phase, scheme: Scheme) -> np.ndarray:
    """Bytes each device sends in this phase."""
    sizes, copies = phase.sizes, phase.copies
    fit = (lambda need: need) if scheme.ladder is None else (lambda need: scheme.ladder.fit(phase, need))  # noqa: E731
    n, streams = sizes.shape
    if scheme.sizing == "ragged":  # ragged_all_to_all: every stream at its length, plus its int32 length
        return ((sizes + 4) * copies).sum(1).astype(float)
    if scheme.sizing == "static":  # the CUDA transfer: at least the static capacity, the spill's length exchanged
        c = static_capacity(strategy.PLATFORM_DEFAULTS["gpu"], phase.dtype, phase.elems)
        return ((np.maximum(sizes, c) + 4) * copies).sum(1).astype(float)
    if scheme.sizing == "shift" and streams > 1:
        d, wire = np.arange(n), np.zeros(n)
        for k in range(1, n):
            j = (d + k) % n
            wire += fit(int(sizes[d, j].max())) * copies[d, j]
        return wire
    return fit(int(sizes.max())) * copies.sum(1).astype(float)


def evaluate(case: Case, scheme: Scheme) -> dict:
    """Per device: the codec's bytes of the library's chunks and of the
    scheme's own, the bytes the scheme sends and the uncompressed
    algorithm's; their ratios over all devices."""
    given = case.given
    codec = sum((p.sizes * p.copies).sum(1) for p in given)
    raw = sum(p.raw * p.copies.sum(1) for p in given)
    phases = case.phases(scheme.interleave)
    own = sum((p.sizes * p.copies).sum(1) for p in phases)
    wire = sum(phase_wire(p, scheme) for p in phases)
    return {"codec ratio": raw.sum() / codec.sum(), "layout codec ratio": raw.sum() / own.sum(),
            "wire ratio": raw.sum() / wire.sum(), "efficiency": codec.sum() / wire.sum(),
            "own efficiency": own.sum() / wire.sum(), "worst device": float(np.min(codec / wire)),
            "wire B/device": wire.tolist()}


def best_layout(case: Case) -> bool:
    return case.interleaved is not None


def library_scheme(case: Case) -> Scheme:
    """What the library does now: psum interleaved, strategy.DEFAULT_LADDER."""
    return Scheme(f"library: {'interleaved' if best_layout(case) else 'given chunks'}, "
                  f"{len(LIBRARY.fractions)} rungs", LIBRARY, best_layout(case))


FAMILIES = ("geometric", "split", "banded", "fitted")


def family_ladder(family: str, k: int, case: Case, cases: list[Case]) -> Ladder:
    """k rungs of a family; "fitted" to the needs of the other cases (not this one)."""
    if family == "fitted":
        return fitted(k, case.dtype, [x for c in cases if c is not case for x in needs(c, best_layout(c))])
    return {"geometric": geometric, "split": split, "banded": banded}[family](k, case.dtype)


def rungs_needed(family: str, case: Case, cases: list[Case], target: float = TARGET) -> int | None:
    """The fewest rungs k of a family such that every ladder of k to
    MAX_RUNGS rungs reaches `target` against the codec on the scheme's own
    chunks (best layout); None if even MAX_RUNGS does not."""
    needed = None
    for k in range(MAX_RUNGS, 1, -1):
        scheme = Scheme(family, family_ladder(family, k, case, cases), best_layout(case))
        if evaluate(case, scheme)["own efficiency"] < target:
            break
        needed = k
    return needed


def merge(cases: list[Case]) -> Case:
    """One case of the phases of several (samples of the same traffic)."""
    first = cases[0]
    interleaved = None if first.interleaved is None else [p for c in cases for p in c.interleaved]
    return Case(first.data, first.collective, [p for c in cases for p in c.given], interleaved)


# ---------------------------------------------------------------------------
# the benchmark


def schemes(case: Case, cases: list[Case], rungs: list[int]) -> list[Scheme]:
    """The schemes reported for a case: before (contiguous, 9 rungs), the
    library's, the bounds of one size per phase (and per shift), and ladders
    of `rungs` rungs in the best layout."""
    best = best_layout(case)
    out = [Scheme("before: contiguous, 9 rungs", BEFORE)]
    if best:
        out.append(Scheme("interleaved, 9 rungs", BEFORE, True))
    out.append(Scheme(f"{'interleaved' if best else 'given chunks'}, 16 rungs", SIXTEEN, best))
    out.append(library_scheme(case))
    out.append(Scheme("largest stream (bound)", None, best))
    if case.given[0].sizes.shape[1] > 1:
        out.append(Scheme("largest per shift (bound)", None, best, "shift"))
        out.append(Scheme("ragged: each stream exact + 4 B", None, best, "ragged"))
    out.append(Scheme("static + spill (every collective on CUDA)", None, best, "static"))
    for k in rungs:
        for family in FAMILIES:
            ladder = family_ladder(family, k, case, cases)
            out.append(Scheme(ladder.name, ladder, best))
    return out


def scheme_row(case: Case, scheme: Scheme) -> dict:
    r = evaluate(case, scheme)
    return {"data": case.data, "collective": case.collective, "scheme": scheme.name,
            "rungs": len(scheme.ladder.fractions) if scheme.ladder else "-",
            "collectives/phase": scheme.collectives(case), "codec ratio": r["codec ratio"],
            "wire ratio": r["wire ratio"], "eff. vs contiguous": r["efficiency"],
            "eff. vs chunks sent": r["own efficiency"],
            "worst device": r["worst device"]}


def tables(cases: list[Case], rungs: list[int]) -> tuple[list[dict], list[dict]]:
    """The efficiency of each scheme on each case, and the rungs each ladder family needs."""
    rows = [scheme_row(c, s) for c in cases for s in schemes(c, cases, rungs)]
    needed = [{"family": f, **{c.name: rungs_needed(f, c, cases) or "-" for c in cases}} for f in FAMILIES]
    return rows, needed


def run(args) -> dict:
    """`bench wire`: gathers the traffic and checks the simulation of the
    library's scheme against the library's Stats (wire_data.py), prints the tables."""
    from . import report, wire_data
    from .devices import choose, describe
    from .train import config_from_args

    n = 8
    devices, note = choose(n, need=n)
    cfg = config_from_args(args)
    cases, checks = wire_data.gather(cfg, args.captures, args.examples, n)
    rows, needed = tables(cases, args.rungs)
    compile_rows = wire_data.compile_cost(n, COMPILE_ELEMENTS, {
        "9 rungs": BEFORE.fractions, "16 rungs": SIXTEEN.fractions, "library": LIBRARY.fractions,
        "geometric 64": geometric(64, "bfloat16").fractions})
    print(f"## Wire bytes against the codec on {describe(devices)}: LM {cfg}, gradients at steps {args.captures}\n")
    if note:
        print(f"({note})\n")
    print("The library's scheme, simulated from the exact stream sizes vs its Stats.wire_bytes:\n")
    print(report.table(checks) + "\n")
    print("Per device, all phases: codec ratio = raw / the codec's bytes on contiguous chunks; efficiency ="
          f" codec bytes / wire bytes (target {TARGET}) against the codec on contiguous chunks and on the"
          " chunks the scheme sends (interleaved, for psum); worst device: vs contiguous.\n")
    print(report.table(rows) + "\n")
    print(f"Fewest rungs k such that every ladder of k to {MAX_RUNGS} rungs of the family reaches {TARGET} against"
          " the scheme's own chunks (best layout; '-': not even 64):\n")
    print(report.table(needed) + "\n")
    print(f"zip_psum of {COMPILE_ELEMENTS:,} bf16 values per device (load average {os.getloadavg()[0]:.1f}):\n")
    print(report.table(compile_rows))
    if args.json:
        report.save_json(args.json, config=dataclasses.asdict(cfg), captures=args.captures, checks=checks,
                         rows=rows, rungs_needed=needed, compile=compile_rows)
    if not all(c["equal on every device"] for c in checks):
        raise SystemExit("bench wire: the simulation of the library's scheme no longer matches its Stats")
    return {"checks": checks, "rows": rows, "rungs_needed": needed, "compile": compile_rows}
