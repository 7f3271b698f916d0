"""Reading XLA:GPU's compiled program: the schedule of its HLO and its thunk sequence.

`analyze(hlo_text)` parses the optimised, scheduled HLO (`compiled.as_text()`): in a scheduled
module each computation's instruction order is the order its thunks run. It returns a `Schedule`:
the collectives with their bytes, whether they are asynchronous (a start and a done) and what
compute XLA put between the two (what overlaps the transfer), and the host round trips
(`conditional`, `while` without a known trip count, ragged_all_to_all across hosts).

`read_thunks(text, metadata)` parses a `thunk_sequence*.txt` dump: which thunks a command buffer
(a CUDA graph) captured.
"""

from __future__ import annotations

import dataclasses
import json
import re

import numpy as np

COLLECTIVES = ("all-gather", "all-reduce", "all-to-all", "reduce-scatter", "collective-permute",
               "ragged-all-to-all", "collective-broadcast")
# instructions that launch no kernel of their own: not counted as compute overlapping a transfer
NOT_COMPUTE = {"parameter", "constant", "get-tuple-element", "tuple", "bitcast", "after-all", "opt-barrier",
               "add-dependency", "domain", "partition-id", "replica-id"}
_BYTES = {"pred": 1, "s4": 0.5, "u4": 0.5, "s8": 1, "u8": 1, "s16": 2, "u16": 2, "f16": 2, "bf16": 2,
          "s32": 4, "u32": 4, "f32": 4, "s64": 8, "u64": 8, "f64": 8, "c64": 8, "c128": 16}
_INSTRUCTION = re.compile(r"^\s*(ROOT\s+)?%([\w.\-]+) = (.*?) ([a-z][a-z0-9\-]*)\((.*)$")
_COMPUTATION = re.compile(r"^(ENTRY\s+)?%([\w.\-]+) \(.*\{\s*$")
_CALLS = re.compile(r"\b(calls|to_apply|body|condition|true_computation|false_computation)=%([\w.\-]+)")


def shape_bytes(shape: str) -> int:
    """Bytes of an HLO shape, tuples summed: "(u8[8,16]{1,0}, f32[])" -> 132."""
    total = 0.0
    for dtype, dims in re.findall(r"\b([a-z]+\d*\w*)\[([\d,]*)\]", shape):
        size = _BYTES.get(dtype, 1 if dtype.startswith("f8") else 0)  # f8e4m3fn, f8e5m2, ...; token[]: 0
        total += size * int(np.prod([int(d) for d in dims.split(",") if d] or [1]))
    return int(total)


@dataclasses.dataclass
class Instruction:
    name: str
    opcode: str
    shape: str
    operands: list[str]
    attributes: str  # everything after the operand list, as printed

    def called(self) -> list[tuple[str, str]]:
        """(how, computation) for each computation this instruction calls."""
        out = [(how, c) for how, c in _CALLS.findall(self.attributes)]
        m = re.search(r"branch_computations=\{([^}]*)\}", self.attributes)
        if m:
            out += [("branch", c) for c in re.findall(r"%([\w.\-]+)", m.group(1))]
        return out

    def backend_config(self) -> dict:
        """The JSON backend config ({} when absent or not JSON, as custom calls' attribute dictionaries)."""
        m = re.search(r"backend_config=(\{.*\})\s*$", self.attributes)
        if not m:
            return {}
        try:
            return json.loads(m.group(1))
        except json.JSONDecodeError:
            return {}

    def target(self) -> str | None:
        m = re.search(r'custom_call_target="([^"]+)"', self.attributes)
        return m.group(1) if m else None

    def label(self) -> str:
        """How a compute instruction is named in reports: a custom call by its target, others by name."""
        return self.target() or self.name


def _split_operands(rest: str) -> tuple[list[str], str]:
    """The operand names of "a, %b), attrs..." and the text after the closing parenthesis."""
    depth = 1
    for i, ch in enumerate(rest):
        depth += {"(": 1, ")": -1}.get(ch, 0)
        if depth == 0:
            return re.findall(r"%([\w.\-]+)", rest[:i]), rest[i + 1:]
    return re.findall(r"%([\w.\-]+)", rest), ""


def parse(hlo_text: str) -> tuple[str, dict[str, list[Instruction]]]:
    """(entry computation's name, {computation: its instructions in order})."""
    computations: dict[str, list[Instruction]] = {}
    entry, current = None, None
    for line in hlo_text.splitlines():
        m = _COMPUTATION.match(line)
        if m:
            current = computations.setdefault(m.group(2), [])
            entry = m.group(2) if m.group(1) else entry
            continue
        if line.startswith("}"):
            current = None
            continue
        m = _INSTRUCTION.match(line) if current is not None else None
        if m:
            operands, attributes = _split_operands(m.group(5))
            current.append(Instruction(m.group(2), m.group(4), m.group(3), operands, attributes))
    if entry is None:
        raise ValueError("no ENTRY computation in the HLO text")
    return entry, computations


def replica_groups(attributes: str) -> list[list[int]]:
    """The device groups of a collective: explicit {{0,1},{2,3}}, the iota form [2,8]<=[16] or
    [2,8]<=[8,2]T(1,0), the mesh form of newer XLA (mesh['x'=2,'d'=8] {'d'}: groups along the named
    axes of an iota mesh), or source_target_pairs (one group per pair)."""
    m = re.search(r"replica_groups=mesh\[([^\]]*)\]\s*\{([^}]*)\}", attributes)
    if m:
        axes = re.findall(r"'(\w+)'=(\d+)", m.group(1))
        names, sizes = [a for a, _ in axes], [int(n) for _, n in axes]
        grouped = [names.index(a) for a in re.findall(r"'(\w+)'", m.group(2))]
        order = [i for i in range(len(names)) if i not in grouped] + grouped
        ids = np.arange(int(np.prod(sizes))).reshape(sizes).transpose(order)
        return ids.reshape(-1, int(np.prod([sizes[i] for i in grouped] or [1]))).tolist()
    m = re.search(r"replica_groups=\[([\d,]+)\]<=\[([\d,]+)\](?:T\(([\d,]+)\))?", attributes)
    if m:
        dims = [int(d) for d in m.group(2).split(",")]
        ids = np.arange(int(np.prod(dims))).reshape(dims)
        if m.group(3):
            ids = ids.transpose([int(d) for d in m.group(3).split(",")])
        return ids.reshape([int(d) for d in m.group(1).split(",")]).tolist()
    m = re.search(r"(?:replica_groups|source_target_pairs)=\{(\{[\d,{} ]*\})\}", attributes)
    if m:
        return [[int(v) for v in g.split(",") if v] for g in re.findall(r"\{([\d,]*)\}", m.group(1))]
    return []


@dataclasses.dataclass
class Collective:
    op: str                      # "all-reduce", "all-gather", ..., as XLA names it
    name: str                    # its start instruction (or the instruction, when synchronous)
    computation: str             # where it sits
    context: str                 # "entry", "branch of %conditional.2", "body of %while.3", ...
    bytes: int                   # what each device contributes: the operands' bytes
    has_done: bool               # a separate start and done (XLA's asynchronous form)
    is_sync: bool                # backend config's is_sync: XLA runs it on the compute stream
    overlaps: list[str]          # compute scheduled between start and done (fusions by name, custom calls by target)
    in_flight_with: list[str]    # other collectives started or finished between its start and done
    groups: list[list[int]]

    @property
    def asynchronous(self) -> bool:
        return self.has_done and not self.is_sync

    @property
    def top_level(self) -> bool:
        return self.context == "entry"


@dataclasses.dataclass
class Schedule:
    entry: str
    computations: dict[str, list[Instruction]]
    collectives: list[Collective]
    conditionals: list[str]
    whiles: dict[str, int | None]   # name -> known trip count (None: unknown, a host round trip per iteration)
    host_round_trips: list[str]

    def summary(self, min_bytes: int = 64 << 10) -> dict:
        payload = payload_transfers(self, min_bytes)
        return {"conditionals": len(self.conditionals), "whiles": len(self.whiles),
                "collectives": len(self.collectives), "payload transfers": len(payload),
                "asynchronous": sum(c.asynchronous for c in payload),
                "overlapped": sum(bool(c.overlaps) for c in payload),
                "inside a branch or loop": sum(not c.top_level for c in payload),
                "host round trips": len(self.host_round_trips)}


def _scheduled(entry: str, computations: dict[str, list[Instruction]]) -> dict[str, str]:
    """{computation: context} for the computations that run as sequences of thunks: the entry,
    conditional branches, while bodies and conditions, called computations. Fusion bodies,
    reducers and async wrappers (reported through their start) are not among them."""
    contexts, todo = {entry: "entry"}, [entry]
    while todo:
        for ins in computations.get(todo.pop(), []):
            for how, callee in ins.called():
                wrapped = ins.opcode in ("fusion", "fusion-start", "async-start")
                if wrapped or how == "to_apply" and ins.opcode != "call":
                    continue
                if callee not in contexts:
                    where = {"branch": "branch", "true_computation": "branch", "false_computation": "branch",
                             "body": "body", "condition": "condition"}.get(how, "callee")
                    contexts[callee] = f"{where} of %{ins.name}"
                    todo.append(callee)
    return contexts


def _collective(ins: Instruction, computations) -> Instruction | None:
    """The collective an instruction starts or is: itself for all-reduce-start or all-reduce, the
    wrapped one for an async-start or a fusion around a collective (jax 0.11.2's XLA makes some
    all-reduces Triton collective fusions: fusion-start/fusion-done), else None."""
    if ins.opcode.removesuffix("-start") in COLLECTIVES:
        return ins
    if ins.opcode in ("async-start", "fusion-start", "fusion"):
        for _, callee in ins.called():
            inner = [i for i in computations.get(callee, []) if i.opcode in COLLECTIVES]
            if inner:
                return inner[0]
    return None


def analyze(hlo_text: str, devices_per_host: int | None = None) -> Schedule:
    """The schedule of a compiled XLA:GPU program (compiled.as_text()). devices_per_host, when
    known, lets a ragged_all_to_all whose groups span hosts be reported as a host round trip."""
    entry, computations = parse(hlo_text)
    contexts = _scheduled(entry, computations)
    shapes = {i.name: i.shape for instrs in computations.values() for i in instrs}
    collectives, conditionals, whiles, trips = [], [], {}, []
    for comp, context in contexts.items():
        seq = computations[comp]
        for pos, ins in enumerate(seq):
            if ins.opcode == "conditional":
                conditionals.append(ins.name)
                trips.append(f"conditional %{ins.name} ({context}): branch index copied to the host")
            elif ins.opcode == "while":
                n = ins.backend_config().get("known_trip_count", {}).get("n")
                whiles[ins.name] = int(n) if n is not None else None
                if n is None:
                    trips.append(f"while %{ins.name} ({context}): unknown trip count, the host reads the "
                                 "condition every iteration")
            inner = _collective(ins, computations)
            if inner is None:
                continue
            op = inner.opcode.removesuffix("-start")
            done = next((j for j in range(pos + 1, len(seq)) if ins.name in seq[j].operands
                         and seq[j].opcode.endswith("-done")), None)
            between = seq[pos + 1:done] if done is not None else []
            config = (ins.backend_config().get("collective_backend_config")
                      or inner.backend_config().get("collective_backend_config", {}))
            groups = replica_groups(inner.attributes)
            collectives.append(Collective(
                op=op, name=ins.name, computation=comp, context=context,
                bytes=sum(shape_bytes(shapes.get(o, "")) for o in ins.operands),
                has_done=done is not None, is_sync=bool(config.get("is_sync", False)),
                overlaps=[i.label() for i in between if i.opcode not in NOT_COMPUTE
                          and _collective(i, computations) is None and not i.opcode.endswith("-done")],
                in_flight_with=[i.name for i in between
                                if _collective(i, computations) or i.opcode.endswith("-done")],
                groups=groups))
            if op == "ragged-all-to-all" and devices_per_host and any(
                    len({d // devices_per_host for d in g}) > 1 for g in groups):
                trips.append(f"ragged-all-to-all %{ins.name}: groups span hosts, NCCL send/recv after copying "
                             "the sizes to the host (two host waits)")
    return Schedule(entry, computations, collectives, conditionals, whiles, trips)


def payload_transfers(schedule: Schedule, min_bytes: int = 64 << 10) -> list[Collective]:
    """The collectives that carry at least min_bytes per device (not flags, sizes or losses)."""
    return [c for c in schedule.collectives if c.bytes >= min_bytes]


def assert_no_host_round_trip(schedule: Schedule) -> None:
    """Fails, listing them, when the program makes the host wait: conditionals, loops of unknown
    trip count, ragged_all_to_all across hosts."""
    assert not schedule.host_round_trips, "host round trips:\n" + "\n".join(schedule.host_round_trips)


def assert_payload_async_at_top_level(schedule: Schedule, min_bytes: int = 64 << 10) -> None:
    """Fails when a payload transfer sits in a branch or loop or is not a start/done pair. (XLA marks
    is_sync a pair alone in its program with nothing to overlap: that is allowed.)"""
    bad = [f"{c.op} %{c.name} ({c.context}, {c.bytes} B, start/done={c.has_done})"
           for c in payload_transfers(schedule, min_bytes) if not (c.top_level and c.has_done)]
    assert not bad, "payload transfers not asynchronous at the top level:\n" + "\n".join(bad)


# ---------------------------------------------------------------------------
# thunk sequences (XLA dumps: thunk_sequence*.txt and thunk_metadata.txt)


@dataclasses.dataclass
class Thunk:
    id: int
    kind: str                   # "kCustomCall", "kAllReduce", "kCommandBuffer", ...
    name: str                   # the HLO instruction it runs (from thunk_metadata), "" when unknown
    depth: int                  # nesting: 0 top level, deeper inside command buffers, branches, loops
    in_command_buffer: bool


def read_thunks(sequence: str, metadata: str = "") -> list[Thunk]:
    """The thunks of a thunk_sequence dump, each with the HLO instruction it runs (via the
    thunk_metadata dump's thunk_id -> profile_annotation) and whether a command buffer holds it."""
    names = {int(i): n for n, i in re.findall(r'profile_annotation: "([^"]*)"\s*thunk_id: (\d+)', metadata)}
    thunks, buffers = [], []   # buffers: indentation of the command buffers we are inside
    for line in sequence.splitlines():
        m = re.match(r"^(\s*)(\d+): (k\w+)", line)
        if not m:
            continue
        indent, tid, kind = len(m.group(1)), int(m.group(2)), m.group(3)
        buffers = [b for b in buffers if b < indent]
        thunks.append(Thunk(tid, kind, names.get(tid, ""), indent // 4, bool(buffers)))
        if kind == "kCommandBuffer":
            buffers.append(indent)
    return thunks
