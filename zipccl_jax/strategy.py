"""When to compress, which algorithm, and how many bytes to send.

Every compressed collective asks `plan()` for its decision among the plans
it can run (plan_names): XLA's own collective on the operand ("raw"), a
rank-ordered algorithm moving the raw bits ("uncompressed", psum only) or
moving compressed streams ("compressed"), and for psum the algorithm,
reduce-scatter+all-gather or all-gather+local-reduce. It compares, per plan:

1. the times `autotune(mesh, data=...)` measured in situ for a call of the
   same collective, axes, dtype and bytes (the job's own buckets, each plan
   run with the real collectives: insitu.py), where they exist;
2. else the modelled times of what each plan runs (modelled_terms):
   - raw psum / psum_scatter: XLA's own all-reduce / reduce-scatter (in
     float32 on CPU, so 4 bytes per 16-bit value there): reduce_latency +
     the bytes each device sends / reduce_bandwidth;
   - raw all_gather, all_to_all, ppermute: the operand's bits,
     latency + the bytes each device receives / link_bandwidth;
   - uncompressed psum (what compress=False runs for a rank-ordered plan):
     per phase latency (no consensus: the size is known), the raw bytes
     received / link_bandwidth, and packing and unpacking STORED_RAW streams
     (the float32 sum included) at copy_rate;
   - compressed, per phase (one sized transfer each: 2 for
     reduce-scatter+all-gather, 1 otherwise): consensus_latency (the pmax
     that agrees on the size) + latency, the bytes received at the ladder
     rung the expected ratio lands on / link_bandwidth; and the codec: the
     size pass (each stream's exact length before the pmax, at size_rate:
     a full compress until the codec offers an analysis-only count, so
     size_rate defaults to compress_rate), the compress at the rung
     (compress_rate) and the decode, fused with the sum (decompress_rate);
   - compressed, in a module lowered for CUDA alone (`static=True`: the
     static transfer of collectives/_transfer.py), per phase two
     transfers' latencies (the bulk at its fixed capacity, carrying the spill
     lengths; the spill), the bulk's bytes (static_fraction of the raw ones) /
     link_bandwidth, no size pass (the encoder returns the lengths), the
     compress and the decode.

Where the figures come from, for each mesh axis the collective runs over
(the first that applies):

1. `strategy=CostModel(...)` passed to the call (which also ignores the
   times measured in situ);
2. what `zipccl_jax.autotune` installed in this process for that axis, or for
   every axis ("*", from `autotune(mesh=None)`): each figure measured with
   the collective the plans run (autotune.py);
3. in a single-process job only, the profile file at $ZIPCCL_PROFILE (default
   ~/.cache/zipccl_jax/profile.json, what `python -m zipccl_jax calibrate`
   writes). A multi-process job ignores it: nothing guarantees that every host
   has the same file, and processes that decide differently run different
   programs. There `autotune(mesh, path=...)` loads a profile and agrees on it;
4. the platform default (PLATFORM_DEFAULTS): assumed figures, not measured.

Codec rates, ratios, the ladder and the times measured in situ come from the
same chain per platform. A collective over several axes uses the slowest: the
largest of each fixed cost and the smallest of each bandwidth.
$ZIPCCL_STRATEGY=auto|raw|compressed overrides the default for the whole
process (read at each decision); a per-call `strategy=` wins over it
("raw": XLA's collective; "compressed": the compressed plans; Pinned(name):
that plan). Every decision is recorded with its reason, its modelled (and
measured) time and the figures behind it (`last_plans()`). Decisions are
deterministic functions of the arguments and the installed figures, which
autotune makes identical on every process.
"""

from __future__ import annotations

import collections
import dataclasses
import functools
import os
import typing
from pathlib import Path

import numpy as np

from . import profile as profile_file
from .dtypes import is_compressible

PROFILE_ENV = "ZIPCCL_PROFILE"
STRATEGY_ENV = "ZIPCCL_STRATEGY"
STRATEGIES = ("auto", "raw", "compressed")  # strategy= also takes a CostModel or a Pinned plan
COLLECTIVES = ("psum", "all_gather", "psum_scatter", "all_to_all", "ppermute")

# Capacities (fractions of the raw bytes) the compressed transfer can use; the
# smallest one every device's streams fit is sent. The top rung is raw. Steps
# of 1.0% (geometric from 0.56 to 0.93, where bf16, fp16 and fp32 land: 1.7%
# left the demo LM's gradients at 0.965-0.968 of the codec's bytes under
# format version 3, 1.0% gives 0.973-0.974), and of 3.4% from 0.30 to 0.56,
# where data with many exact zeros lands since format version 3 (ReLU
# activations, MoE empty slots: FORMAT.md §2): a rung is a switch branch of
# custom calls and one collective, cheap to compile since no branch slices a
# payload (docs/BENCHMARKS.md, "Wire bytes against the codec").
_SPARSE_RUNGS = (0.297, 0.307, 0.317, 0.328, 0.339, 0.351, 0.363, 0.375, 0.388, 0.401, 0.414, 0.429, 0.443, 0.458,
                 0.474, 0.49, 0.507, 0.524, 0.542)
DEFAULT_LADDER = _SPARSE_RUNGS + tuple(round(0.56 * (0.93 / 0.56) ** (i / 51), 4) for i in range(52)) + (1.0,)

# The raw psum / psum_scatter path is XLA's reduction, in float32 on CPU
# (collectives/psum.py): a 16-bit operand travels as 4 bytes per value there.
_WIDENED = ("psum", "psum_scatter")
PSUM_ALGORITHMS = ("reduce_scatter+all_gather", "all_gather+local_reduce")


def plan_name(compress: bool, algorithm: str) -> str:
    """What last_plans(), Pinned and the measured times call a plan:
    "raw all_reduce" / "raw direct" (XLA's own collective on the operand),
    "uncompressed <psum algorithm>" (the rank-ordered algorithm moving the raw
    bits: what compress=False runs for it), "compressed <algorithm>"."""
    if compress:
        return f"compressed {algorithm}"
    return f"uncompressed {algorithm}" if algorithm in PSUM_ALGORITHMS else f"raw {algorithm}"


def plan_names(collective: str) -> tuple[str, ...]:
    """The plans a collective can run, in the order that breaks ties (the
    simpler first)."""
    if collective == "psum":
        return ("raw all_reduce", *(plan_name(c, a) for c in (False, True) for a in PSUM_ALGORITHMS))
    return ("raw direct", "compressed direct")


@dataclasses.dataclass(frozen=True)
class Pinned:
    """strategy=Pinned(name): run the plan of that name (plan_names()),
    whatever the figures say, e.g. zip_psum(g, "data",
    strategy=Pinned("uncompressed all_gather+local_reduce")). A dtype the
    codec does not take, or an axis of size 1, still goes raw. autotune
    times each candidate plan in situ this way."""

    plan: str


class Terms(typing.NamedTuple):
    """A plan's modelled seconds per device, by what it runs (module docstring)."""

    fixed: float  # the collectives' fixed costs (per sized transfer: consensus + latency)
    wire: float  # bytes on the wire / bandwidth
    size_pass: float  # compressed plans: each stream's exact length, before the consensus
    encode: float  # compress at the rung; uncompressed plans: pack STORED_RAW streams
    decode: float  # decode (fused with the sum); uncompressed plans: unpack (and sum) them

    @property
    def total(self) -> float:
        return sum(self)


class Figures(typing.NamedTuple):
    """A CostModel's link figures with the optional ones resolved."""

    latency: float
    link_bandwidth: float
    consensus_latency: float
    reduce_latency: float
    reduce_bandwidth: float


@dataclasses.dataclass(frozen=True)
class CostModel:
    """Figures of the cost model: times in seconds, rates in bytes per second
    per device. The field defaults are the CPU platform default. `source`
    (not part of equality) says where the figures come from. The last three
    fields are optional: None stands for `latency` (consensus_latency,
    reduce_latency) or `link_bandwidth` (reduce_bandwidth), so a model given
    as CostModel(latency=..., link_bandwidth=...) keeps its meaning."""

    latency: float = 100e-6  # fixed cost of a byte transfer (all_to_all, all_gather, ppermute)
    link_bandwidth: float = 1.25e9  # bytes one device receives per second in a byte transfer over the axis
    compress_rate: float = 2e9  # codec input bytes per second on one device
    decompress_rate: float = 3e9
    ratios: tuple = (("bfloat16", 1.5), ("float16", 1.18), ("float32", 1.2))
    ladder: tuple = DEFAULT_LADDER
    psum_algorithm: str | None = None  # force "reduce_scatter+all_gather" or "all_gather+local_reduce"
    source: str = dataclasses.field(default="a CostModel given per call", compare=False)
    consensus_latency: float | None = None  # the tiny pmax every sized transfer pays once
    reduce_latency: float | None = None  # XLA's all-reduce (raw psum, psum_scatter): fixed cost
    reduce_bandwidth: float | None = None  # and bytes each device sends per second
    # The size pass before the consensus, in codec input bytes per second. None:
    # compress_rate, because today's size pass is a full compress (the lengths
    # kept, the streams dropped); when the codec offers an analysis-only count
    # (codec_cpu.h: stream_bytes) autotune's measure of the same op rises with it.
    size_rate: float | None = None
    copy_rate: float = 5e9  # packing / unpacking STORED_RAW streams (uncompressed plans), bytes per second

    def ratio(self, dtype) -> float:
        return dict(self.ratios).get(np.dtype(dtype).name, 1.0)

    def figures(self) -> Figures:
        return Figures(self.latency, self.link_bandwidth,
                       self.latency if self.consensus_latency is None else self.consensus_latency,
                       self.latency if self.reduce_latency is None else self.reduce_latency,
                       self.link_bandwidth if self.reduce_bandwidth is None else self.reduce_bandwidth)

    def size_pass_rate(self) -> float:
        return self.compress_rate if self.size_rate is None else self.size_rate


PLATFORM_DEFAULTS = {
    # Assumed, not measured: hosts linked by 10 Gbit/s Ethernet (1.25 GB/s per
    # device; 100 us per collective over gloo/TCP, for the pmax of the size
    # consensus, a byte transfer and XLA's all-reduce alike), one core per
    # device running the codec at 2 GB/s compress, 3 GB/s decompress: the bf16
    # AVX-512 speeds in docs/BENCHMARKS.md (a CPU without AVX-512 codes ~0.75
    # GB/s), its size pass a full compress, and STORED_RAW streams packed and
    # summed at 5 GB/s. At these figures a large bf16 psum goes uncompressed
    # (rank-ordered: bf16 on the wire, where XLA's all-reduce moves float32);
    # autotune finds slower links where compression pays.
    "cpu": CostModel(consensus_latency=100e-6, reduce_latency=100e-6, reduce_bandwidth=1.25e9,
                     source="cpu default (assumed 10 Gbit/s link)"),
    # Assumed, not measured: a 200 Gbit/s NIC per GPU between hosts (25 GB/s),
    # 20 us per NCCL collective, a CUDA codec at 100 / 200 GB/s (no GPU
    # timing of it exists yet; published GPU codecs reach 250-2,000 GB/s) and
    # STORED_RAW copies at 500 GB/s.
    # At these figures everything goes raw: compression needs a measured link.
    "gpu": CostModel(latency=20e-6, link_bandwidth=25e9, compress_rate=100e9, decompress_rate=200e9,
                     consensus_latency=20e-6, reduce_latency=20e-6, reduce_bandwidth=25e9, copy_rate=500e9,
                     source="gpu default (assumed 200 Gbit/s link, codec not measured)"),
}


@dataclasses.dataclass(frozen=True)
class Plan:
    """What a collective will do, why, and the figures behind it (the slowest
    of its axes'): `model` holds every figure, the fields below the common ones."""

    collective: str
    compress: bool  # the codec runs
    algorithm: str  # raw psum: "all_reduce" (XLA's); raw others: "direct"; else the algorithm
    reason: str  # one readable line
    raw_bytes: int
    axis_size: int
    axes: tuple
    source: str  # the link model used: autotune, a profile file, or the platform default
    latency: float
    link_bandwidth: float
    compress_rate: float
    decompress_rate: float
    ratio: float
    consensus_latency: float = 0.0
    reduce_latency: float = 0.0
    reduce_bandwidth: float = 0.0
    modelled: float = 0.0  # seconds the model gives the chosen plan
    dtype: str = ""
    widened: bool = False  # a raw psum / psum_scatter of 16-bit floats that XLA runs in float32 (CPU)
    model: CostModel | None = None
    terms: Terms | None = None  # the chosen plan's modelled time, by what it runs
    measured: tuple = ()  # (plan name, seconds) of every candidate, where measured in situ decided

    @property
    def name(self) -> str:
        """"raw all_reduce", "uncompressed all_gather+local_reduce", "compressed ..." (plan_name)."""
        return plan_name(self.compress, self.algorithm)

    @property
    def measured_seconds(self) -> float | None:
        """The in-situ time of the chosen plan, or None where the model decided."""
        return dict(self.measured).get(self.name)


_PLANS: collections.deque = collections.deque(maxlen=10_000)  # bounded: traces repeat in long jobs


def last_plans(clear: bool = False) -> list[Plan]:
    """The plans made since the last clear (one per collective planned; the
    newest 10,000 are kept)."""
    plans = list(_PLANS)
    if clear:
        _PLANS.clear()
    return plans


# ---------------------------------------------------------------------------
# installed figures and where a model comes from

_LINKS: dict = {}  # (platform, axis) -> (profile.Link, source)
_CODECS: dict = {}  # platform -> (profile.Profile, source): codec rates, ratios, ladder
_MEASURED: dict = {}  # (platform, measured_key) -> ({plan name: seconds}, source)


def install(profile: profile_file.Profile, source: str = "autotune") -> None:
    """Makes profile's figures this process's default: its links and its
    plans measured in situ (each added to, or replacing, what was installed
    for the same axis or call), its codec, ratios and ladder."""
    for axis, link in profile.links:
        _LINKS[(profile.platform, axis)] = (link, source)
    for m in profile.measured:
        _MEASURED[(profile.platform, m.key)] = (dict(m.seconds), source)
    _CODECS[profile.platform] = (profile, source)


def uninstall() -> None:
    """Forgets every installed figure: back to the profile file or the defaults."""
    _LINKS.clear()
    _CODECS.clear()
    _MEASURED.clear()


def profile_path() -> Path:
    return Path(os.environ.get(PROFILE_ENV, Path.home() / ".cache" / "zipccl_jax" / "profile.json"))


def platform_family(platform: str | None) -> str:
    """"cpu" or "gpu" for a JAX platform name (None: jax.default_backend())."""
    if platform is None:
        import jax

        platform = jax.default_backend()
    family = {"cpu": "cpu", "gpu": "gpu", "cuda": "gpu", "rocm": "gpu"}.get(platform)
    if family is None:
        raise ValueError(f"zipccl: no cost model for platform {platform!r}; expected cpu, cuda, rocm or gpu")
    return family


def _file_profile(platform: str):
    """(Profile, source) from $ZIPCCL_PROFILE for a single-process job, else None."""
    import jax

    path = profile_path()
    if jax.process_count() > 1 or not path.is_file():
        return None
    stat = path.stat()
    prof = _read_profile(path, stat.st_mtime_ns, stat.st_size)
    return (prof, f"profile {path}") if prof.platform == platform else None


@functools.lru_cache(maxsize=8)
def _read_profile(path: Path, mtime_ns: int, size: int) -> profile_file.Profile:  # read once per version
    return profile_file.read(path)


def _link(platform: str, axis, file):
    """(Link or None, source) for one axis: installed, the file, else the default."""
    for key in (axis, profile_file.ANY_AXIS):
        if (platform, key) in _LINKS:
            return _LINKS[(platform, key)]
    if file and file[0].link(axis):
        return file[0].link(axis), file[1]
    return None, PLATFORM_DEFAULTS[platform].source


def _check_strategy(strategy) -> None:
    if not (strategy is None or isinstance(strategy, (CostModel, Pinned)) or strategy in STRATEGIES):
        raise ValueError("zipccl: strategy must be None, 'auto', 'raw', 'compressed', a CostModel or a Pinned plan, "
                         f"got {strategy!r}")


def _link_figures(link: profile_file.Link | None, default: Figures) -> Figures:
    if link is None:
        return default
    return Figures(link.latency, link.bandwidth, link.latency if link.consensus is None else link.consensus,
                   link.latency if link.reduce_latency is None else link.reduce_latency,
                   link.bandwidth if link.reduce_bandwidth is None else link.reduce_bandwidth)


def _slowest(figures: list[Figures]) -> Figures:
    """Per figure the slowest: the largest fixed cost, the smallest bandwidth."""
    return Figures(*(min(col) if name.endswith("bandwidth") else max(col)
                     for name, col in zip(Figures._fields, zip(*figures))))


def model_for(axes, strategy=None, *, platform: str | None = None) -> CostModel:
    """The CostModel a collective over `axes` uses: `strategy` itself when it
    is a CostModel, else the figures installed, in the profile file, or the
    platform's default (module docstring), the slowest of the axes' links."""
    _check_strategy(strategy)
    if isinstance(strategy, CostModel):
        return strategy
    platform = platform_family(platform)
    default = PLATFORM_DEFAULTS[platform]
    file = _file_profile(platform)
    codec, codec_source = _CODECS.get(platform) or file or (None, default.source)
    links = {axis: _link(platform, axis, file) for axis in axes}
    figures = _slowest([_link_figures(link, default.figures()) for link, _ in links.values()] or [default.figures()])
    sources = {source for _, source in links.values()} | {codec_source}
    source = sources.pop() if len(sources) == 1 else "; ".join(
        [f"link {axis!r}: {source}" for axis, (_, source) in links.items()] + [f"codec: {codec_source}"])
    base = default if codec is None else CostModel(
        compress_rate=codec.compress_rate, decompress_rate=codec.decompress_rate, size_rate=codec.size_rate,
        copy_rate=codec.copy_rate or default.copy_rate,
        ratios=tuple({**dict(default.ratios), **dict(codec.ratios)}.items()), ladder=codec.ladder or DEFAULT_LADDER)
    return dataclasses.replace(base, **figures._asdict(), source=source)


def measured_for(collective: str, nbytes: int, dtype, axes, axis_size: int, *,
                 platform: str | None = None) -> tuple[dict, str] | None:
    """({plan name: seconds}, source) that autotune measured in situ for a
    call of this collective, bytes, dtype, axes and axis size, or over axis
    "*" of that size (installed, else in a single-process job's profile
    file), or None."""
    platform = platform_family(platform)
    keys = [profile_file.Measured.key_of(collective, a, axis_size, np.dtype(dtype).name, nbytes)
            for a in (tuple(axes), (profile_file.ANY_AXIS,))]  # "*": autotune(mesh=None), over all devices
    file = None if platform in _CODECS else _file_profile(platform)
    for key in keys:
        if (platform, key) in _MEASURED:
            return _MEASURED[(platform, key)]
        for m in file[0].measured if file else ():
            if m.key == key:
                return dict(m.seconds), file[1]
    return None


# ---------------------------------------------------------------------------
# the decision


def _forced(strategy) -> tuple[str | None, str]:
    """("raw" / "compressed" / a pinned plan's name / None, what forced it)
    for a strategy argument that is not a CostModel; None reads $ZIPCCL_STRATEGY."""
    if strategy is None:
        value = os.environ.get(STRATEGY_ENV, "").strip().lower()
        if not value:
            return None, ""
        if value not in STRATEGIES:
            raise ValueError(f"zipccl: ${STRATEGY_ENV} must be one of {', '.join(STRATEGIES)} (or unset), got "
                             f"{os.environ[STRATEGY_ENV]!r}")
        return (None if value == "auto" else value), f"{STRATEGY_ENV}={value}"
    if isinstance(strategy, Pinned):
        return strategy.plan, f"strategy=Pinned({strategy.plan!r})"
    if isinstance(strategy, CostModel) or strategy == "auto":
        return None, ""
    return strategy, f"strategy={strategy!r}"


def _algorithms(collective: str, nbytes: int, n: int) -> dict:
    """Per rank-ordered algorithm, per device: (sized transfers, bytes
    received, bytes encoded, bytes decoded), for an operand of nbytes per device."""
    share = nbytes * (n - 1) / n
    if collective == "psum":
        return {"reduce_scatter+all_gather": (2, 2 * share, nbytes + nbytes / n, 2 * nbytes),
                "all_gather+local_reduce": (1, nbytes * (n - 1), nbytes, n * nbytes)}
    if collective == "all_gather":
        return {"direct": (1, nbytes * (n - 1), nbytes, n * nbytes)}
    if collective == "ppermute":
        return {"direct": (1, nbytes, nbytes, nbytes)}
    return {"direct": (1, share, nbytes, nbytes)}  # psum_scatter, all_to_all


def wire_fraction(model: CostModel, dtype) -> float:
    """The fraction of the raw bytes a compressed transfer is expected to
    send: the smallest ladder rung at or above 1 / ratio."""
    need = 1.0 / model.ratio(dtype)
    return min((f for f in model.ladder if f >= need), default=1.0)


# The static transfer's capacity (GPUs: collectives/_transfer.py) sits this far above the bytes the
# expected ratio gives: data that compress as expected fill it and spill nothing; a margin sends up to
# this much more than the codec's bytes, a stream over it spills its excess by a synchronous transfer.
STATIC_MARGIN = 0.01
STATIC_TRANSFERS = 2  # per sized transfer: the bulk (with the spill lengths), the spill (usually empty)


def static_fraction(model: CostModel, dtype) -> float:
    """The fraction of the raw bytes a static transfer sends at a fixed size
    (the rest of a longer stream spills): 1 / the expected ratio, plus STATIC_MARGIN."""
    return min(1.0, (1.0 + STATIC_MARGIN) / model.ratio(dtype))


def widens(collective: str, dtype, platform: str | None = None) -> bool:
    """Whether the raw plan of `collective` moves a 16-bit float as float32:
    XLA:CPU's all-reduce and reduce-scatter (the raw psum / psum_scatter)."""
    return (collective in _WIDENED and is_compressible(dtype) and np.dtype(dtype).itemsize < 4
            and platform_family(platform) == "cpu")


def modelled_terms(collective: str, nbytes: int, dtype, axis_size: int, model: CostModel, *,
                   widened: bool = False, codec: bool = True, static: bool = False) -> dict:
    """(compress, algorithm) -> Terms: the modelled seconds per device of each
    plan, for an operand of nbytes per device (module docstring). widened:
    the raw plan moves float32 for a 16-bit dtype. psum's uncompressed plans
    are (False, algorithm). codec=False: the compressed plans as
    compress=False runs them (no codec, no consensus: STORED_RAW streams at
    the top rung; all_gather, all_to_all and ppermute: their raw plan).
    static: the compressed plans as the static transfer runs them (CUDA)."""
    f, n = model.figures(), axis_size
    share = nbytes * (n - 1) / n
    wide = 4 / np.dtype(dtype).itemsize if widened else 1.0
    if collective == "psum":
        terms = {(False, "all_reduce"): Terms(f.reduce_latency, 2 * share * wide / f.reduce_bandwidth, 0, 0, 0)}
    elif collective == "psum_scatter":
        terms = {(False, "direct"): Terms(f.reduce_latency, share * wide / f.reduce_bandwidth, 0, 0, 0)}
    else:
        received = _algorithms(collective, nbytes, n)["direct"][1]
        terms = {(False, "direct"): Terms(f.latency, received / f.link_bandwidth, 0, 0, 0)}
    fraction = static_fraction(model, dtype) if static else wire_fraction(model, dtype)
    for algo, (steps, wire, encoded, decoded) in _algorithms(collective, nbytes, n).items():
        plain = Terms(steps * f.latency, wire / f.link_bandwidth, 0.0, encoded / model.copy_rate,
                      decoded / model.copy_rate)
        if collective == "psum":
            terms[(False, algo)] = plain
        if not codec and collective in ("all_gather", "all_to_all", "ppermute"):
            plain = terms[(False, "direct")]  # compress=False sends these raw (their raw plan)
        terms[(True, algo)] = plain if not codec else Terms(
            steps * (STATIC_TRANSFERS * f.latency if static else f.consensus_latency + f.latency),
            wire * fraction / f.link_bandwidth, 0.0 if static else encoded / model.size_pass_rate(),
            encoded / model.compress_rate, decoded / model.decompress_rate)
    return terms


def modelled_times(collective: str, nbytes: int, dtype, axis_size: int, model: CostModel, *,
                   widened: bool = False, codec: bool = True, static: bool = False) -> dict:
    """(compress, algorithm) -> modelled seconds (modelled_terms, summed)."""
    return {k: t.total for k, t in modelled_terms(collective, nbytes, dtype, axis_size, model, widened=widened,
                                                  codec=codec, static=static).items()}


def plan(collective: str, nbytes: int, dtype, axes, axis_size: int, strategy=None, *,
         platform: str | None = None, raw_because: str | None = None, static: bool = False) -> Plan:
    """Decides among the plans a collective can run (plan_names) by the times
    measured in situ for this call where autotune measured them, else by the
    modelled times; records the Plan. raw_because: the call can run XLA's own
    collective only, for this reason (whatever the strategy). static: the
    compressed plans run the static transfer (a module lowered for CUDA alone)."""
    if collective not in COLLECTIVES:
        raise ValueError(f"zipccl: unknown collective {collective!r}; expected one of {', '.join(COLLECTIVES)}")
    axes, order = tuple(axes), plan_names(collective)
    model = model_for(axes, strategy, platform=platform)
    if model.psum_algorithm not in (None, *PSUM_ALGORITHMS):
        raise ValueError(f"zipccl: unknown psum_algorithm {model.psum_algorithm!r}; expected one of "
                         f"{', '.join(PSUM_ALGORITHMS)}")
    forced, forced_by = _forced(strategy)
    if forced not in (None, *STRATEGIES, *order):
        raise ValueError(f"zipccl: {collective} has no plan {forced!r}; its plans: {', '.join(order)}")
    dtype, n = np.dtype(dtype), axis_size
    widened = widens(collective, dtype, platform)
    terms = modelled_terms(collective, nbytes, dtype, n, model, widened=widened, static=static)
    why = ""
    if raw_because:
        forced, why = "raw", raw_because
    elif not is_compressible(dtype):
        forced, why = "raw", f"dtype {dtype.name} is not compressed"
    elif n == 1:
        forced, why = "raw", "axis of size 1: nothing crosses a link"

    def allowed(compress, algo):
        name = plan_name(compress, algo)
        return ((forced is None or forced == name or forced == "compressed" and compress
                 or forced == "raw" and name.startswith("raw "))
                and (algo not in PSUM_ALGORITHMS or model.psum_algorithm in (None, algo)))

    candidates = sorted((k for k in terms if allowed(*k)), key=lambda k: order.index(plan_name(*k)))
    found = None if isinstance(strategy, CostModel) or why else measured_for(collective, nbytes, dtype, axes, n,
                                                                                platform=platform)
    measured = {name: t for name, t in found[0].items() if name in order} if found else {}
    measured = measured if all(plan_name(*k) in measured for k in candidates) else {}
    seconds = {k: measured[plan_name(*k)] if measured else t.total for k, t in terms.items()
               if not measured or plan_name(*k) in measured}
    compress, algo = min(candidates, key=seconds.get)  # ties: the first in plan_names' order
    if not why:
        how = f"measured in situ ({found[1]})" if measured else "modelled"
        why = (f"{forced_by}: " if forced else "") + _comparison((compress, algo), seconds, how) + (
            f" (modelled {_duration(terms[(compress, algo)].total)})" if measured else "")
    f, chosen = model.figures(), terms[(compress, algo)]
    result = Plan(collective, compress, algo, f"{why}; {_figures_line(collective, axes, model, dtype, widened)}",
                  nbytes, n, axes, model.source, f.latency, f.link_bandwidth, model.compress_rate,
                  model.decompress_rate, model.ratio(dtype), f.consensus_latency, f.reduce_latency, f.reduce_bandwidth,
                  chosen.total, dtype.name, widened, model, chosen,
                  tuple(sorted(measured.items(), key=lambda kv: order.index(kv[0]))))
    _PLANS.append(result)
    return result


def _comparison(chosen, seconds: dict, how: str) -> str:
    """"<plan>, <how> <time> vs <other plan> <time>, ..." (the others fastest first)."""
    others = sorted((t, plan_name(*k)) for k, t in seconds.items() if k != chosen)
    return f"{plan_name(*chosen)}, {how} {_duration(seconds[chosen])}" + (
        " vs " + ", ".join(f"{name} {_duration(t)}" for t, name in others) if others else "")


def _figures_line(collective: str, axes: tuple, model: CostModel, dtype, widened: bool) -> str:
    """The figures behind a plan, as the reason's second half."""
    f = model.figures()
    reduce = f", all-reduce {_duration(f.reduce_latency)} + {_rate(f.reduce_bandwidth)}" + (
        " (float32)" if widened else "") if collective in _WIDENED else ""
    return (f"{axes} from {model.source}: consensus {_duration(f.consensus_latency)}, transfer "
            f"{_duration(f.latency)} + {_rate(f.link_bandwidth)}{reduce}, codec {_rate(model.compress_rate)} / "
            f"{_rate(model.decompress_rate)} (size pass {_rate(model.size_pass_rate())}, stored copy "
            f"{_rate(model.copy_rate)}), {dtype.name} ratio {model.ratio(dtype):.3f} "
            f"(sends {wire_fraction(model, dtype):.0%})")


def modelled_time(p: Plan, codec: bool = True) -> float:
    """Seconds the model gives plan p; codec=False: the same plan run with
    compress=False (a compressed plan's transfers at the top rung, no codec)."""
    return modelled_times(p.collective, p.raw_bytes, p.dtype, p.axis_size, p.model, widened=p.widened,
                          codec=codec)[(p.compress, p.algorithm)]


def _duration(seconds: float) -> str:
    return f"{seconds * 1e6:.0f} us" if seconds < 1e-3 else f"{seconds * 1e3:.3g} ms" if seconds < 1 else \
        f"{seconds:.3g} s"


def _rate(per_second: float) -> str:
    return f"{per_second / 1e6:.3g} MB/s" if per_second < 1e9 else f"{per_second / 1e9:.3g} GB/s"


def capacities(capacity: int, raw_bytes: int, ladder=DEFAULT_LADDER) -> tuple[int, ...]:
    """The ladder in bytes per stream: increasing, 8-byte aligned, the top one
    the full stream capacity (raw plus header), so every stream fits."""
    header = capacity - raw_bytes
    rungs = sorted({min(capacity, -(-int(header + f * raw_bytes) // 8) * 8) for f in ladder if f < 1.0})
    return tuple(r for r in rungs if r < capacity) + (capacity,)
