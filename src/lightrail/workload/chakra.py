"""Chakra execution traces (MLCommons; what ASTRA-sim consumes) in and out of lightrail.

A trace is one ``PREFIX.RANK.et`` file per rank: a length-delimited ``GlobalMetadata`` message, then
``Node`` messages (schema: ``chakra/schema/protobuf/et_def.proto`` of the ``mlc-chakra`` package). We read
the nodes a network simulator needs and keep their dependencies:

- ``COMP_NODE``: ``duration_micros`` of compute;
- ``COMM_COLL_NODE``: attributes ``comm_type`` (CollectiveCommType), ``comm_size`` (bytes of each rank's
  buffer, lightrail's ``nbytes``) and ``pg_name`` (the process group; empty = every rank);
- ``COMM_SEND_NODE`` / ``COMM_RECV_NODE``: ``comm_src``, ``comm_dst``, ``comm_tag``, ``comm_size``;
- anything else (metadata, memory) takes no time but keeps its place in the dependency graph.

Process groups come from ASTRA-sim's communicator-group file (``PREFIX.json``: ``{"pg": [ranks...]}``,
its ``--comm-group-configuration``) when the folder has one; otherwise a group is the set of ranks whose
traces name it. Reading is an importer's I/O; :func:`encode_rank` turns nodes back into file bytes for
``report/export.py`` to write.
"""

from __future__ import annotations

import io
import json
import re
from collections import Counter
from dataclasses import dataclass, field, replace
from pathlib import Path

from lightrail.defaults import Kind
from lightrail.errors import ScenarioError, UnsupportedError

__all__ = ["TraceNode", "ChakraTrace", "read_chakra", "decode_rank", "encode_rank", "program_to_trace",
           "CHAKRA_KINDS"]

CHAKRA_KINDS = {"ALL_REDUCE": Kind.ALLREDUCE, "REDUCE": Kind.REDUCE, "ALL_GATHER": Kind.ALLGATHER,
                "BROADCAST": Kind.BROADCAST, "ALL_TO_ALL": Kind.ALLTOALL, "REDUCE_SCATTER": Kind.REDUCESCATTER,
                "REDUCE_SCATTER_BLOCK": Kind.REDUCESCATTER, "BARRIER": Kind.ALLREDUCE}
"""Chakra's CollectiveCommType names and the collective lightrail runs for each (a barrier is an
all-reduce of nothing: its steps' start-ups). GATHER and SCATTER have no lightrail schedule."""

_FILE = re.compile(r"^(?P<prefix>.+)\.(?P<rank>\d+)\.et$")


@dataclass(frozen=True, slots=True)
class TraceNode:
    """One node of a rank's trace, reduced to what the simulator needs."""

    id: int
    name: str
    op: str
    """``compute``, ``collective``, ``send``, ``recv`` or ``other`` (no time)."""
    deps: tuple[int, ...] = ()
    """Data and control dependencies: nodes of the same rank that must finish first."""
    seconds: float = 0.0
    kind: Kind | None = None
    nbytes: float = 0.0
    group: str = ""
    peer: int = -1
    """The other rank of a send (its destination) or receive (its source)."""
    tag: int = 0


@dataclass(frozen=True)
class ChakraTrace:
    """Per rank, its nodes in file order; and the ranks of every process group."""

    ranks: tuple[tuple[TraceNode, ...], ...]
    groups: dict[str, tuple[int, ...]] = field(default_factory=dict)
    source: str = ""

    @property
    def world(self) -> int:
        return len(self.ranks)

    def ops(self) -> dict[str, int]:
        """Node counts by op over all ranks (collectives also by kind, ``collective:allreduce``)."""
        counts: Counter = Counter()
        for nodes in self.ranks:
            for node in nodes:
                counts[node.op] += 1
                if node.kind is not None and node.op == "collective":
                    counts[f"collective:{node.kind.value}"] += 1
        return dict(sorted(counts.items()))

    def bytes_by_kind(self) -> dict[str, float]:
        """Bytes of communication nodes by op (collectives by kind), over all ranks."""
        out: Counter = Counter()
        for nodes in self.ranks:
            for node in nodes:
                if node.op == "collective":
                    out[f"collective:{node.kind.value}"] += node.nbytes
                elif node.op in ("send", "recv"):
                    out[node.op] += node.nbytes
        return dict(sorted(out.items()))

    def group_of(self, node: TraceNode) -> tuple[int, ...]:
        return self.groups.get(node.group, tuple(range(self.world)))

    def to_dict(self) -> dict:
        return {"source": self.source, "ranks": self.world, "ops": self.ops(), "bytes": self.bytes_by_kind(),
                "groups": {k: list(v) for k, v in sorted(self.groups.items())},
                "compute_s_per_rank": [sum(n.seconds for n in nodes) for nodes in self.ranks]}


# -- decoding --------------------------------------------------------------------------------------------------

def _messages(data: bytes, where: str):
    """The length-delimited messages of a file (varint length, then the bytes: protolib's framing)."""
    pos = 0
    while pos < len(data):
        size = shift = 0
        while True:
            if pos >= len(data):
                raise ScenarioError("truncated length prefix", field=where, fix="re-export the trace")
            b = data[pos]
            pos += 1
            size |= (b & 0x7F) << shift
            shift += 7
            if not b & 0x80:
                break
            if shift > 63:
                raise ScenarioError("corrupt length prefix", field=where, fix="is this a Chakra .et file?")
        if pos + size > len(data):
            raise ScenarioError("truncated message", field=where, fix="re-export the trace")
        yield data[pos:pos + size]
        pos += size


def _attrs(node) -> dict:
    out = {}
    for attr in node.attr:
        which = attr.WhichOneof("value")
        if which is not None:
            out[attr.name] = getattr(attr, which)
    return out


def _schema():
    """Chakra's protobuf classes; a missing install is one clear error, not a traceback."""
    try:
        from chakra.schema.protobuf.et_def_pb2 import CollectiveCommType, GlobalMetadata, Node, NodeType
    except ImportError as e:
        raise UnsupportedError(f"Chakra traces need mlc-chakra and protobuf ({e})", field="chakra",
                               fix="pip install --no-deps mlc-chakra && pip install 'lightrail[chakra]' "
                                   "(make setup does both)") from None
    return CollectiveCommType, GlobalMetadata, Node, NodeType


def decode_rank(data: bytes, *, where: str = "trace") -> tuple[TraceNode, ...]:
    """The nodes of one rank's ``.et`` bytes; errors name ``where`` and the node."""
    from google.protobuf.message import DecodeError

    CollectiveCommType, GlobalMetadata, Node, NodeType = _schema()
    messages = _messages(data, where)
    try:
        GlobalMetadata().ParseFromString(next(messages, b""))
    except DecodeError:
        raise ScenarioError("no Chakra global metadata at the start", field=where,
                            fix="is this a Chakra .et file?") from None
    nodes = []
    for raw in messages:
        node = Node()
        try:
            node.ParseFromString(raw)
        except DecodeError:
            raise ScenarioError(f"node {len(nodes)} does not decode", field=where,
                                fix="is this a Chakra .et file?") from None
        at = _attrs(node)
        label = f"{where}: node {node.id} ({node.name or NodeType.Name(node.type)})"
        deps = tuple(dict.fromkeys([*node.data_deps, *node.ctrl_deps]))
        base = {"id": int(node.id), "name": node.name, "deps": deps}
        if node.type == NodeType.Value("COMP_NODE"):
            nodes.append(TraceNode(op="compute", seconds=node.duration_micros * 1e-6, **base))
        elif node.type == NodeType.Value("COMM_COLL_NODE"):
            ctype = CollectiveCommType.Name(int(at.get("comm_type", 0)))
            if ctype not in CHAKRA_KINDS:
                raise UnsupportedError(f"collective {ctype} has no lightrail schedule", field=label,
                                       fix="use all-reduce, reduce-scatter, all-gather, all-to-all, broadcast "
                                           "or reduce")
            size = 0 if ctype == "BARRIER" else int(at.get("comm_size", 0))
            nodes.append(TraceNode(op="collective", kind=CHAKRA_KINDS[ctype], nbytes=float(size),
                                   group=str(at.get("pg_name", "")), **base))
        elif node.type in (NodeType.Value("COMM_SEND_NODE"), NodeType.Value("COMM_RECV_NODE")):
            send = node.type == NodeType.Value("COMM_SEND_NODE")
            key = "comm_dst" if send else "comm_src"
            if key not in at:
                raise ScenarioError(f"has no {key} attribute", field=label, fix="give the peer rank")
            size = at.get("comm_size", at.get("tensor_size", 0))
            nodes.append(TraceNode(op="send" if send else "recv", nbytes=float(size), peer=int(at[key]),
                                   tag=int(at.get("comm_tag", 0)), **base))
        else:
            nodes.append(TraceNode(op="other", **base))
    ids = {n.id for n in nodes}
    if len(ids) != len(nodes):
        raise ScenarioError("node ids repeat", field=where, fix="give every node of a rank its own id")
    for n in nodes:
        missing = [d for d in n.deps if d not in ids]
        if missing:
            raise ScenarioError(f"node {n.id} depends on node {missing[0]}, which is not in the trace", field=where,
                                fix="keep every dependency in the same rank's file")
    return tuple(nodes)


def read_chakra(folder: str | Path) -> ChakraTrace:
    """A folder of ``PREFIX.0.et .. PREFIX.{N-1}.et`` (one per rank, ASTRA-sim's naming) and, if present,
    the communicator groups ``PREFIX.json``."""
    folder = Path(folder)
    if not folder.is_dir():
        raise ScenarioError(f"{folder} is not a folder", field="DIR", fix="give the folder of the .et files")
    found: dict[str, dict[int, Path]] = {}
    for path in folder.iterdir():
        m = _FILE.match(path.name)
        if m and path.is_file():  # not a FIFO or a device named like a trace
            found.setdefault(m["prefix"], {})[int(m["rank"])] = path
    if not found:
        raise ScenarioError(f"no PREFIX.RANK.et files in {folder}", field="DIR",
                            fix="one Chakra trace per rank, e.g. workload.0.et, workload.1.et")
    if len(found) > 1:
        raise ScenarioError(f"several traces in {folder}: {', '.join(sorted(found))}", field="DIR",
                            fix="keep one trace (one prefix) per folder")
    prefix, files = next(iter(found.items()))
    if sorted(files) != list(range(len(files))):
        gap = min(set(range(len(files) + 1)) - set(files))
        raise ScenarioError(f"rank {gap} has no file {prefix}.{gap}.et", field="DIR",
                            fix="one file per rank, numbered from 0")
    ranks = tuple(decode_rank(files[r].read_bytes(), where=files[r].name) for r in range(len(files)))
    groups_file = folder / f"{prefix}.json"
    groups = _groups_from_file(groups_file, len(ranks)) if groups_file.exists() else _groups_from_nodes(ranks)
    return _checked(allgather_sizes(ChakraTrace(ranks, groups, str(folder)), whole=True))


def allgather_sizes(trace: ChakraTrace, *, whole: bool) -> ChakraTrace:
    """All-gather sizes between Chakra's convention and lightrail's: a Chakra ``ALL_GATHER``'s ``comm_size`` is
    each rank's contribution (ASTRA-sim moves ``(n - 1) comm_size`` per rank; checked side by side in
    benchmarks/vs_astra_sim.py), lightrail's ``nbytes`` the whole gathered buffer, as for every other collective.
    ``whole``: Chakra -> lightrail (times the group size); else back (what the encoder writes)."""
    sign = 1 if whole else -1
    def fix(node: TraceNode) -> TraceNode:
        if node.op != "collective" or node.kind != Kind.ALLGATHER:
            return node
        return replace(node, nbytes=node.nbytes * len(trace.group_of(node)) ** sign)
    return replace(trace, ranks=tuple(tuple(fix(n) for n in nodes) for nodes in trace.ranks))


def _groups_from_file(path: Path, world: int) -> dict[str, tuple[int, ...]]:
    try:
        data = json.loads(path.read_text())
    except (OSError, ValueError) as e:
        raise ScenarioError(f"unreadable: {e}", field=path.name, fix="ASTRA-sim's format: {\"1\": [0, 1], ...}") \
            from None
    if not isinstance(data, dict) or not all(isinstance(v, list) and all(isinstance(r, int) for r in v)
                                             for v in data.values()):
        raise ScenarioError("not a mapping of group names to rank lists", field=path.name,
                            fix="ASTRA-sim's format: {\"1\": [0, 1], ...}")
    for name, members in data.items():
        if not members or min(members) < 0 or max(members) >= world or len(set(members)) != len(members):
            raise ScenarioError(f"group {name!r} is not distinct ranks in 0..{world - 1}", field=path.name,
                                fix="list each member rank once")
    return {str(k): tuple(v) for k, v in data.items()}


def _groups_from_nodes(ranks) -> dict[str, tuple[int, ...]]:
    members: dict[str, set[int]] = {}
    for r, nodes in enumerate(ranks):
        for n in nodes:
            if n.op == "collective" and n.group:
                members.setdefault(n.group, set()).add(r)
    return {g: tuple(sorted(m)) for g, m in members.items()}


def _checked(trace: ChakraTrace) -> ChakraTrace:
    """Every rank's collectives must name groups it belongs to, and match the other members' in order."""
    seq: dict[tuple[str, int], list[tuple[Kind, float]]] = {}
    for r, nodes in enumerate(trace.ranks):
        for n in nodes:
            if n.op == "collective":
                members = trace.group_of(n)
                if r not in members:
                    raise ScenarioError(f"rank {r} runs a collective on group {n.group!r}, which it is not in",
                                        field=f"rank {r}: node {n.id}", fix="fix the trace's pg_name or the groups")
                seq.setdefault((n.group, r), []).append((n.kind, n.nbytes))
            elif n.op in ("send", "recv") and not 0 <= n.peer < trace.world:
                raise ScenarioError(f"peer {n.peer} is not a rank", field=f"rank {r}: node {n.id}",
                                    fix=f"use a rank in 0..{trace.world - 1}")
    for group in {g for g, _ in seq}:
        lists = {r: seq.get((group, r), []) for r in trace.groups.get(group, range(trace.world))}
        first_rank, first = next(iter(lists.items()))
        for r, ops in lists.items():
            if [k for k, _ in ops] != [k for k, _ in first]:
                raise ScenarioError(f"ranks {first_rank} and {r} run different collectives on group {group!r}",
                                    field=f"rank {r}", fix="every member runs the group's collectives in one order")
    return trace


# -- encoding --------------------------------------------------------------------------------------------------

_CHAKRA_NAME = {Kind.ALLREDUCE: "ALL_REDUCE", Kind.REDUCE: "REDUCE", Kind.ALLGATHER: "ALL_GATHER",
                Kind.BROADCAST: "BROADCAST", Kind.ALLTOALL: "ALL_TO_ALL", Kind.REDUCESCATTER: "REDUCE_SCATTER"}


def encode_rank(nodes: list[TraceNode] | tuple[TraceNode, ...], rank: int) -> bytes:
    """Rank ``rank``'s ``.et`` file contents, written with the package's own framing (``encodeMessage``)."""
    CollectiveCommType, GlobalMetadata, Node, NodeType = _schema()
    from chakra.schema.protobuf.et_def_pb2 import AttributeProto
    from chakra.src.third_party.utils.protolib import encodeMessage

    buf = io.BytesIO()
    encodeMessage(buf, GlobalMetadata(version="0.0.4"))
    for n in nodes:
        node = Node(id=n.id, name=n.name)
        node.data_deps.extend(n.deps)
        attrs = [AttributeProto(name="is_cpu_op", bool_val=False)]
        if n.op == "compute":
            node.type = NodeType.Value("COMP_NODE")
            node.duration_micros = max(0, round(n.seconds * 1e6))
        elif n.op == "collective":
            node.type = NodeType.Value("COMM_COLL_NODE")
            attrs += [AttributeProto(name="comm_type", int64_val=CollectiveCommType.Value(_CHAKRA_NAME[n.kind])),
                      AttributeProto(name="comm_size", int64_val=round(n.nbytes))]
            if n.group:
                attrs.append(AttributeProto(name="pg_name", string_val=n.group))
        elif n.op in ("send", "recv"):
            node.type = NodeType.Value("COMM_SEND_NODE" if n.op == "send" else "COMM_RECV_NODE")
            attrs += [AttributeProto(name="comm_size", int64_val=round(n.nbytes)),
                      AttributeProto(name="comm_tag", int32_val=n.tag)]
            src, dst = (rank, n.peer) if n.op == "send" else (n.peer, rank)
            attrs += [AttributeProto(name="comm_src", int32_val=src), AttributeProto(name="comm_dst", int32_val=dst)]
        else:
            node.type = NodeType.Value("METADATA_NODE")
        node.attr.extend(attrs)
        encodeMessage(buf, node)
    return buf.getvalue()


# -- lightrail's own workloads as traces -------------------------------------------------------------------------

def program_to_trace(program) -> ChakraTrace:
    """Every rank's ops of a :class:`~lightrail.workload.program.Program` as a Chakra DAG (for ASTRA-sim).

    Ops depend on the rank's previous blocking op, so the order is kept and an asynchronous collective (a
    gradient bucket) overlaps what follows it; ``count`` back-to-back collectives become ``count`` nodes.
    Groups are numbered from 1 (ASTRA-sim's communicator ids); the k-th send from rank s to rank d carries
    tag k and matches d's k-th receive from s, the FIFO order the iteration simulator uses."""
    from lightrail.workload.program import CollectiveOp, ComputeOp, RecvOp, SendOp

    lay = program.job.layout
    pp_stride = lay.stride("pp")
    group_ids: dict[tuple[int, ...], str] = {}
    member_of: dict[tuple, list[tuple[int, ...]]] = {}

    def group(rank: int, dims) -> str:
        if dims not in member_of:
            member_of[dims] = [()] * lay.world
            for row in lay.groups_over(dims):
                members = tuple(int(r) for r in row)
                for r in members:
                    member_of[dims][r] = members
        members = member_of[dims][rank]
        return group_ids.setdefault(members, str(len(group_ids) + 1))

    sent: dict[tuple[int, int], list[float]] = {}
    for rank in range(lay.world):
        for op in program.ops_for_rank(rank):
            if isinstance(op, SendOp):
                sent.setdefault((rank, rank + op.offset * pp_stride), []).append(op.nbytes)
    ranks = []
    for rank in range(lay.world):
        nodes: list[TraceNode] = []
        last: tuple[int, ...] = ()
        sends: Counter = Counter()
        recvs: Counter = Counter()
        for op in program.ops_for_rank(rank):
            repeat = op.count if isinstance(op, CollectiveOp) else 1
            for k in range(repeat):
                nid = len(nodes)
                label = op.label if repeat == 1 else f"{op.label} #{k}"
                match op:
                    case ComputeOp():
                        node = TraceNode(nid, label, "compute", last, seconds=op.seconds)
                    case CollectiveOp():
                        node = TraceNode(nid, label, "collective", last, kind=op.kind, nbytes=op.nbytes,
                                         group=group(rank, op.group_dims))
                    case SendOp():
                        peer = rank + op.offset * pp_stride
                        node = TraceNode(nid, label, "send", last, nbytes=op.nbytes, peer=peer,
                                         tag=sends[peer])
                        sends[peer] += 1
                    case RecvOp():
                        peer = rank + op.offset * pp_stride
                        node = TraceNode(nid, label, "recv", last, nbytes=sent[(peer, rank)][recvs[peer]],
                                         peer=peer, tag=recvs[peer])
                        recvs[peer] += 1
                    case _:
                        raise TypeError(f"{op!r} is not a program op")
                nodes.append(node)
                if not getattr(op, "asynchronous", False):
                    last = (nid,)
        ranks.append(tuple(nodes))
    groups = {gid: members for members, gid in group_ids.items()}
    return ChakraTrace(tuple(ranks), groups, f"lightrail program of {program.job.model.name}")
