"""Collectives as NCCL runs them, on lightrail's fabrics: NCCL's time, the step engine's links (DESIGN.md
"Time model": a collective "as NCCL runs it" picks algorithm and protocol per size as NCCL's tuner does).

The step engine (:class:`lightrail.timing.Engine`) times a schedule as textbook alpha-beta steps on the network
state: right for where the bytes go and which links they share, blind to what NCCL adds on a real cluster
(the LL/LL128/Simple protocols and their efficiencies, tree and NVLS, its per-hop latencies, the ring's channels).
:mod:`lightrail.nccl` is NCCL's own cost model, blind to the fabric beyond two rates. :func:`nccl_op_cost` joins
them: the op's time is NCCL's at that size (:func:`lightrail.nccl.choose`: the algorithm and protocol NCCL's
tuner would pick, or a forced algorithm with the protocol still chosen), its links are those the engine charges
the lightrail schedule closest to NCCL's algorithm (:func:`lightrail.nccl.lightrail_schedule`) on the real
fabric, and its busy seconds per link are scaled so that the op moves its bytes in NCCL's time.

Why scale the busy seconds: flow-level sharing (:mod:`lightrail.sharing`) runs an op's bytes phase on its links
at the fraction ``busy_s / wire_s`` of each; NCCL's bytes phase is ``wire = seconds - latency`` (NCCL's latency
at that size, :func:`nccl_latency`). Multiplying every link's busy seconds by ``wire / engine_wire`` keeps the
engine's picture of how hard the op loads each link relative to its bottleneck, while the bottleneck's busy time
becomes NCCL's bytes time: two such ops saturating one link take ``latency + 2 * wire``, as two NCCL
collectives on one NIC do. A link is never busier than the op's bytes phase (capped at ``wire``).
"""

from __future__ import annotations

from collections.abc import Callable
from math import gcd

import numpy as np

from lightrail.fabric.params import RailFabric
from lightrail.nccl import Choice, Communicator, NcclParams, algo_time, choose, lightrail_schedule, parse_algorithm
from lightrail.sharing import OpCost

__all__ = ["TUNED", "communicator", "nccl_latency", "nccl_op_cost", "scaled_cost"]

TUNED = ("allreduce", "allgather", "reducescatter", "broadcast", "reduce")
"""Collectives NCCL's tuner prices (algorithm x protocol); all-to-all and send/recv are point-to-point in NCCL
(:func:`lightrail.nccl.p2p_time`, our own model)."""

_HUGE = 2.0 ** 40  # bytes: far above the size where NCCL's ring latency plateau applies, for any communicator


def communicator(ranks, gpus_per_server: int, fabric: RailFabric, *, nvls: bool = False,
                 arch: str = "hopper") -> Communicator:
    """What NCCL's tuner knows of the group of GPUs ``ranks`` (GPU ids; GPU r on server ``r // gpus_per_server``)
    on ``fabric``: its size, its GPUs per node, the fabric's NVLink and NIC rates (one NIC per GPU, the rails),
    whether the NVSwitch offers NVLS (``lightrail.workload.hardware.GPU.nvls``) and NCCL's GPU class.

    GPUs per node is the greatest common divisor of the group's GPUs per server (all of them when the group fills
    its servers alike, as a parallelism group does), so that the nodes NCCL sees hold the same count. NVLS needs
    more than two of the communicator's GPUs on a node (``src/transport/nvls.cc`` ``ncclNvlsInit``: no NVLS when
    the node's topology has ``gpuCount <= 2``): a DP group with one GPU per server runs no NVLS.

    >>> comm = communicator(range(16), 8, RailFabric())
    >>> comm.nranks, comm.nnodes, comm.ppn
    (16, 2, 8)
    >>> communicator(range(0, 64, 8), 8, RailFabric()).ppn  # a DP group on a rail: one GPU per server
    1
    """
    gpus = np.asarray(list(ranks) if not isinstance(ranks, np.ndarray) else ranks, np.int64)
    counts = np.unique(gpus // gpus_per_server, return_counts=True)[1] if len(gpus) else np.ones(1, np.int64)
    ppn = gcd(*(int(c) for c in counts))
    return Communicator(nranks=max(len(gpus), 1), gpus_per_node=ppn, nvlink_Bps=float(fabric.nvlink_bandwidth),
                        nic_Bps=float(fabric.nic_bandwidth), nvls=bool(nvls) and ppn > 2, arch=arch)


def nccl_latency(kind, algorithm: str, protocol: str, nbytes, comm: Communicator,
                 params: NcclParams | None = None) -> np.ndarray:
    """The latency term of NCCL's time of ``kind`` at ``nbytes`` with ``algorithm`` and ``protocol``: the part
    of :func:`lightrail.nccl.algo_time` that is not ``nbytes / bandwidth``.

    That is ``algo_time`` at 0 bytes except for the ring across nodes: NCCL multiplies ring Simple AllReduce's
    latency by 1.4 (1.9 before Ampere) once a rank's share per channel reaches 64 bytes (``tuning.cc``
    ``ncclTopoGetAlgoTime``), which 0 bytes never does. The ring's bandwidth does not depend on the size (only
    tree's does, through ``treeCorrectionFactor``, and tree has no plateau), so the ring's latency at ``nbytes``
    is ``algo_time(nbytes) - nbytes / bandwidth`` with the bandwidth read off two huge sizes."""
    nbytes = np.asarray(nbytes, float)
    if parse_algorithm(algorithm) != "ring":
        return algo_time(kind, algorithm, protocol, np.zeros(nbytes.shape), comm, params)
    t1, t2 = algo_time(kind, algorithm, protocol, np.array([_HUGE, 2 * _HUGE]), comm, params)
    per_byte = (t2 - t1) / _HUGE
    return algo_time(kind, algorithm, protocol, nbytes, comm, params) - nbytes * per_byte


def scaled_cost(alone: OpCost, seconds: float, wire: float) -> OpCost:
    """``alone``'s links with an op time of ``seconds``, of which ``wire`` moves bytes: every link's busy seconds
    times ``wire / alone.wire_s``, at most ``wire`` (the module docstring says why). An op that moved no bytes on
    the engine (``alone.wire_s`` 0) keeps no link busy."""
    busy = np.asarray(alone.busy_s, float)
    engine_wire = alone.wire_s
    busy = np.minimum(busy * (wire / engine_wire), wire) if engine_wire > 0 else np.zeros(len(busy))
    return OpCost(float(seconds), np.asarray(alone.links), busy, bandwidth_s=float(wire))


def nccl_op_cost(kind, nbytes: float, comm: Communicator, *, alone: OpCost | Callable[[str | None], OpCost],
                 params: NcclParams | None = None, algorithm: str | None = None) -> tuple[OpCost, Choice]:
    """``kind`` of ``nbytes`` on ``comm`` as NCCL runs it: (its :class:`OpCost`, NCCL's :class:`Choice`).

    The time is :func:`lightrail.nccl.choose`'s at ``nbytes`` (``algorithm`` forces one, as ``NCCL_ALGO``; the
    protocol is still chosen); its bytes phase is that time minus :func:`nccl_latency`. ``alone`` is the engine's
    cost of the corresponding lightrail schedule on the real fabric, or a function that returns it given the
    schedule's registry name (``lightrail_schedule(kind, chosen algorithm)``, None where no schedule matches):
    its links are the op's, its busy seconds scaled by :func:`scaled_cost`.

    >>> from lightrail.sharing import OpCost
    >>> comm = communicator(range(8), 8, RailFabric())
    >>> alone = OpCost(1e-3, np.array([0, 1]), np.array([5e-4, 2.5e-4]), bandwidth_s=5e-4)
    >>> cost, choice = nccl_op_cost("allreduce", 8.0, comm, alone=alone)
    >>> str(choice.protocol[0]), bool(cost.seconds == choice.seconds[0])
    ('LL', True)
    """
    choice = choose(kind, nbytes, comm, params, algorithm)
    algo, proto = str(choice.algorithm[0]), str(choice.protocol[0])
    seconds = float(choice.seconds[0])
    latency = float(nccl_latency(kind, algo, proto, nbytes, comm, params))
    wire = min(max(seconds - latency, 0.0), seconds)
    if callable(alone):
        alone = alone(lightrail_schedule(kind, algo))
    return scaled_cost(alone, seconds, wire), choice
