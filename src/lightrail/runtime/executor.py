"""Run any verified schedule for real with torch.distributed point-to-point operations.

Each step posts, in one ``batch_isend_irecv``, a send for every transfer this rank sources and a
receive (into a scratch buffer) for every transfer it sinks; after all complete, received chunks
are added (reduce) or copied (copy) into place. Sends therefore read the state at the start of the
step, exactly as the verifier assumes, so a proven schedule computes its collective here too.

Buffer layout follows the schedule's collective (``lightrail.collectives.collective``): the rank's
buffer is cut into ``chunks_per_buffer`` nearly equal pieces (``torch.tensor_split``), so sizes that
do not divide evenly work. Supported: allreduce, reducescatter, allgather, broadcast, reduce.
"""

from __future__ import annotations

import torch
import torch.distributed as dist

from lightrail.collectives import Combine, Kind, Schedule
from lightrail.errors import UnsupportedError

__all__ = ["run_schedule"]

_SUPPORTED = (Kind.ALLREDUCE, Kind.REDUCESCATTER, Kind.ALLGATHER, Kind.BROADCAST, Kind.REDUCE)


def run_schedule(schedule: Schedule, buffer: torch.Tensor, *, group: dist.ProcessGroup | None = None) -> torch.Tensor:
    """Execute ``schedule`` in place on this rank's ``buffer`` (1-D) and return it.

    Every rank of ``group`` must call this with the same schedule. For reducescatter the result is
    valid in this rank's block of chunks; for allgather this rank's block must hold its input.
    """
    if schedule.kind not in _SUPPORTED:
        raise UnsupportedError(f"the executor does not run {schedule.kind}", field="schedule",
                               fix="use allreduce, reducescatter, allgather, broadcast or reduce")
    world = dist.get_world_size(group)
    if world != schedule.nranks:
        raise UnsupportedError(f"schedule for {schedule.nranks} ranks on a group of {world}", field="schedule")
    rank = dist.get_rank(group)
    chunks = buffer.view(-1).tensor_split(schedule.collective.chunks_per_buffer)
    pool: list[torch.Tensor] = []  # receive buffers reused across steps (fresh pages cost page faults)
    peer = (lambda r: dist.get_global_rank(group, r)) if group is not None else (lambda r: r)  # noqa: E731
    for step in schedule.steps:
        sends = sorted(zip(step.dst[step.src == rank].tolist(), step.chunk[step.src == rank].tolist(), strict=True))
        recv_mask = step.dst == rank
        recvs = sorted(zip(step.src[recv_mask].tolist(), step.chunk[recv_mask].tolist(),
                           step.combine[recv_mask].tolist(), strict=True))
        ops, landed = [], []
        for dst, c in sends:
            ops.append(dist.P2POp(dist.isend, chunks[c], peer(dst), group, tag=c))
        for i, (src, c, op) in enumerate(recvs):
            scratch = _scratch(pool, i, chunks[c])
            ops.append(dist.P2POp(dist.irecv, scratch, peer(src), group, tag=c))
            landed.append((c, op, scratch))
        if not ops:
            continue
        for request in dist.batch_isend_irecv(ops):
            request.wait()
        for c, op, scratch in landed:
            if op == Combine.REDUCE:
                chunks[c].add_(scratch)
            else:
                chunks[c].copy_(scratch)
    return buffer


def _scratch(pool: list[torch.Tensor], i: int, like: torch.Tensor) -> torch.Tensor:
    """The i-th receive buffer of a step, shaped like ``like``, from ``pool``."""
    if i == len(pool) or pool[i].numel() < like.numel():
        buf = torch.empty(like.numel(), dtype=like.dtype)
        pool[i:i + 1] = [buf]
    return pool[i][:like.numel()]
