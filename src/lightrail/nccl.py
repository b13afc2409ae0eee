"""NCCL's algorithm x protocol cost model: which algorithm and protocol NCCL runs a collective with, and how long
it takes (pure: numbers in, numbers out; numpy only).

NCCL prices every (algorithm, protocol) pair of a collective as ``latency + nbytes / bandwidth`` and runs the
cheapest (NVIDIA/nccl ``src/enqueue.cc`` ``topoGetAlgoInfo``; the table is filled per size by
``updateCollCostTable`` -> ``src/graph/tuning.cc`` ``ncclTopoGetAlgoTime``). Latency and bandwidth per pair are
set once per communicator by ``ncclTopoTuneModel`` (``src/graph/tuning.cc``) from a base latency per
(algorithm, protocol) (``baseLatencies``), a latency per hop per link class and (algorithm, protocol)
(``hwLatencies``: NVLink, PCI, network), the topology search's bandwidth per channel times the channels, and
per-protocol corrections (LL: half the bandwidth, capped by ``llMaxBws``; LL128: 120/128, capped per channel;
tree: 0.92 capped by ``perChMaxTreeBws``, a per-size ``treeCorrectionFactor``; NVLS: ``nvlsEfficiency``).
The constants below are NCCL's (master of 2026-06, ``tuning.cc``), cited beside each; the code is ours.

What this model takes from the hardware instead of NCCL's topology search:

- a GPU's NVLink bandwidth as NCCL sees it is its links times ``SMxx_NVLINK_BW`` (``src/graph/topo.h``: 20.6 GB/s
  per NVLink 4 link against 25 GB/s on the data sheet), and a NIC's is the first entry of the search's speed array
  below its rate (``src/graph/search.cc`` ``sm90SpeedArrayInter``: 48 GB/s for a 50 GB/s NIC): so the default
  bandwidths are the nominal ones times :data:`NVLINK_SEEN` and :data:`NIC_SEEN`;
- a multi-node ring or tree carries ``gpus_per_node`` channels, one per NIC (one NIC per GPU: rail-optimized),
  so its bus bandwidth is ``min(gpus_per_node * nic, nvlink)``; a single node's is the NVLink bandwidth;
- all-to-all and send/recv are point-to-point in NCCL (no tuner entry): our own model, Simple protocol, one start-up
  and one hop, the intra-node share over NVLink and the rest over the NICs in parallel (:func:`p2p_time`); a peer
  on another node gets NCCL's p2p channels per peer (:func:`p2p_channels`), each carrying at most
  ``NCCL_P2P_PER_CHANNEL_NET_BW`` (14 GB/s, ``src/graph/paths.cc``), so one send/recv peer may not fill the NIC.

:class:`NcclParams` holds the parameters a measurement can correct (and :mod:`lightrail.studies.calibrate_nccl`
fits): base
latency per protocol, per-hop latency per link class and protocol (ring's entries; the other algorithms' entries
keep NCCL's ratio to ring's), the two bandwidths and the LL/LL128/NVLS efficiencies.
"""

from __future__ import annotations

import math
from dataclasses import asdict, dataclass, field, replace

import numpy as np

from lightrail.errors import ScenarioError, UnsupportedError

__all__ = ["ALGORITHMS", "PROTOCOLS", "P2P", "ARCHS", "KINDS", "NVLINK_SEEN", "NIC_SEEN", "Communicator",
           "NcclParams", "candidates", "algo_time", "p2p_time", "p2p_channels", "choose", "parse_algorithm",
           "lightrail_schedule"]

ALGORITHMS = ("tree", "ring", "collnet-direct", "collnet-chain", "nvls", "nvls-tree", "pat")
"""NCCL's algorithms in NCCL's order (``NCCL_ALGO_TREE`` .. ``NCCL_ALGO_PAT``, ``src/include/device.h``)."""
PROTOCOLS = ("LL", "LL128", "Simple")
"""NCCL's protocols in NCCL's order (``NCCL_PROTO_LL`` .. ``NCCL_PROTO_SIMPLE``)."""
P2P = "p2p"
"""The "algorithm" of all-to-all and send/recv: NCCL runs them as point-to-point transfers (Simple)."""
ARCHS = ("volta", "ampere", "hopper", "blackwell")
"""NCCL's compute-capability classes (``NCCL_*_COMPCAP_IDX``): index of the rows of its tables."""
KINDS = ("allreduce", "allgather", "reducescatter", "broadcast", "reduce", "alltoall", "sendrecv")
"""Collectives the model prices (``lightrail.defaults.Kind`` values, plus nccl-tests' ``sendrecv``)."""

_US = 1e-6
_GB = 1e9
TREE, RING, COLLNET_DIRECT, COLLNET_CHAIN, NVLS, NVLS_TREE, PAT = range(7)
LL, LL128, SIMPLE = range(3)

# tuning.cc ncclTunerConstantsDefaults.baseLatencies [algorithm][protocol], microseconds
_BASE_LAT = np.array([[6.8, 14.0, 8.4], [6.6, 14.0, 8.4], [0, 0, 0], [0, 0, 0], [0, 0, 0], [0, 0, 0],
                      [8.0, 8.0, 8.0]])
# tuning.cc ncclTunerConstantsDefaults.hwLatencies [link class][algorithm][protocol], microseconds
_HW_LAT_NVLINK = np.array([[0.6, 1.25, 4.0], [0.6, 1.9, 3.4], [0, 0, 3.7], [0, 0, 2.8], [0, 0, 25], [0, 0, 25],
                           [0, 0, 4.0]])
_HW_LAT_NET = np.array([[5.0, 8.5, 14], [2.7, 4.0, 14.0], [0, 0, 31], [0, 0, 30], [0, 0, 18], [0, 0, 20.9],
                        [0, 0, 14]])
# tuning.cc llMaxBws [row][nodes index: 1, 2, >2 nodes], GB/s; the row is the GPU class on one node, the CPU
# (0 Intel, 1 AMD) across nodes (ncclTopoTuneModel's index1)
_LL_MAX_BW = np.array([[39.0, 39.0, 20.4], [87.7, 22.5, 19.0], [141.0, 45.0, 35.0], [282.0, 90.0, 70.0]])
# tuning.cc per-channel caps [GPU class][nodes index], GB/s per channel
_PER_CH_RING_LL128 = np.array([[20.0] * 3, [20.0] * 3, [36.7] * 3, [40.0] * 3])
_PER_CH_TREE_LL128 = np.array([[20.0] * 3, [20.0] * 3, [36.7, 36.7, 29.0], [55.6, 31.67, 20.0]])
_PER_CH_TREE = np.array([[26.5, 18.5, 10.0], [24.0, 23.6, 17.8], [38.7, 41.4, 36.0], [70.0, 42.8, 24.0]])
_PER_CH_NVLS_TREE = np.array([[26.5, 18.5, 10.0], [24.0, 23.6, 17.8], [0.0, 57.7, 45.5], [0.0, 96.0, 80.0]])
# tuning.cc nvlsEfficiency [GPU class]
_NVLS_EFFICIENCY = (0.0, 0.0, 0.85, 0.74)
# tuning.cc treeCorrectionFactor [protocol][log2(nbytes / 64)], applied to tree AllReduce's bandwidth (64 B..256 MB)
_TREE_CORRECTION = np.array([
    [1.0, 1.0, 1.0, 1.0, .9, .8, .7, .7, .7, .7, .6, .5, .4, .4, .5, .6, .7, .8, .9, 1.0, 1.0, 1.0, 1.0, 1.0],
    [1.0, 1.0, 1.0, 1.0, 1.0, .9, .8, .8, .8, .7, .6, .6, .6, .6, .6, .6, .8, .9, .9, .9, .9, 1.0, 1.0, 1.0],
    [.9, .9, .9, .9, .9, .9, .9, .8, .7, .6, .6, .5, .5, .5, .5, .6, .7, .8, .7, .7, .8, .9, .9, .9]])
_LL_FACTOR = {RING: 0.5, TREE: 1.0 / 3.8}  # ncclTopoTuneModel: ring LL busBw * .5, tree LL busBw / 3.8
_LL128_FACTOR = {RING: 0.92, TREE: 120.0 / 128.0}  # ring LL128 * 0.92; tree LL128 * 120/128 (7/9 on one node)
_TREE_ALLREDUCE = 0.92  # ncclTopoTuneModel: tree AllReduce busBw * .92 before the per-channel cap
_PAT_FACTOR = 0.75  # ncclTopoTuneModel: PAT busBw * .75
_COLLNET_HOPPER = 0.85  # ncclTopoTuneModel: CollNet Direct busBw * .85 from compute capability 9.0
_ARITY_LAT = 0.4  # ncclTopoTuneModel: CollNet Direct's 0.4 us arity serialization latency per local rank
_PAT_LAT_PER_RANK = 2.8  # ncclTopoTuneModel: PAT's linear latency term, us per rank
_NET_OVERHEAD = {"intel": 1.0, "amd": 2.0, "arm": 1.0}  # tuning.cc getNetOverhead, us (x3 for Simple)
_RING_PLATEAU = (1.9, 1.4)  # ncclTopoGetAlgoTime: ring Simple AllReduce latency x1.9 before Ampere, x1.4 after
_MAX_DIRECT_ARITY = 7  # src/include/device.h NCCL_MAX_DIRECT_ARITY: CollNet needs <= 8 local ranks
_MAX_NVLS_ARITY = 32  # src/include/device.h NCCL_MAX_NVLS_ARITY
_MAX_CHANNELS = 64  # src/include/device.h MAXCHANNELS
_P2P_CHANNEL_NET_BW = 14.0  # src/graph/paths.cc NCCL_P2P_PER_CHANNEL_NET_BW (GB/s): a p2p channel's share of a NIC
_P2P_PER_BATCH = 8  # src/include/device.h NCCL_MAX_DEV_WORK_P2P_PER_BATCH: p2p operations per channel and batch
_NVLINK_LINK = {"volta": 25.0, "ampere": 25.0, "hopper": 25.0, "blackwell": 50.0}  # GB/s per link, data sheet

# src/graph/topo.h SM70/SM80/SM90/SM100_NVLINK_BW (GB/s per link as NCCL prices it) over the data sheet's rate
# per link and direction (NVLink 2/3/4: 25 GB/s, NVLink 5: 50 GB/s)
NVLINK_SEEN = {"volta": 20.0 / 25, "ampere": 20.0 / 25, "hopper": 20.6 / 25, "blackwell": 40.1 / 50}
"""The fraction of a GPU's data-sheet NVLink rate NCCL's topology believes in, per GPU class."""
NIC_SEEN = 48.0 / 50
"""A NIC's rate as NCCL's ring search uses it: the first speed not above it (``search.cc`` ``sm90SpeedArrayInter``:
48 GB/s for 400 Gb/s; ``speedArrayInter``: 24 for 200 Gb/s, 12 for 100 Gb/s), about 0.96 of the line rate."""
# search.cc sm90SpeedArrayIntra / speedArrayIntra / sm100SpeedArrayIntra: the first (highest) channel speed, GB/s
_CHANNEL_SPEED = {"volta": 40.0, "ampere": 40.0, "hopper": 60.0, "blackwell": 90.0}

_ALIASES = {"collnet": "collnet-direct", "collnetdirect": "collnet-direct", "collnetchain": "collnet-chain",
            "nvlstree": "nvls-tree", "sendrecv": P2P, "pairwise": P2P}


def _log2i(n: int) -> int:
    """NCCL's ``log2i`` (``src/include/utils.h``): floor(log2 n), -1 for 0."""
    return int(n).bit_length() - 1


@dataclass(frozen=True, kw_only=True)
class Communicator:
    """What NCCL's tuner knows of a communicator: ranks, how they sit on nodes, and the links' data-sheet rates."""

    nranks: int
    """GPUs in the communicator."""
    gpus_per_node: int
    """GPUs per node on one NVLink domain (fewer when the communicator has fewer ranks)."""
    nvlink_Bps: float
    """Data-sheet NVLink rate per GPU per direction, bytes/s (H100: 450e9)."""
    nic_Bps: float
    """Network rate per GPU (its own NIC, one per GPU), bytes/s (400 Gb/s: 50e9)."""
    nvls: bool = False
    """The NVSwitch offers multicast/reduction (NVLink SHARP, Hopper and later): NCCL may run NVLS."""
    collnet: bool = False
    """The network reduces (InfiniBand SHARP through the CollNet plugin): NCCL may run CollNet."""
    arch: str = "hopper"
    """GPU class: volta, ampere, hopper or blackwell (the rows of NCCL's tables)."""
    cpu: str = "intel"
    """Host CPU vendor (intel, amd, arm): NCCL's LL cap across nodes and its network overhead depend on it."""
    nics_per_node: int | None = None
    """NICs per node as NCCL's topology sees them (None: one per GPU, rail-optimized). ``nic_Bps`` stays the share
    of one GPU (the node's NIC total / GPUs per node); fewer NICs mean fewer ring channels across nodes."""
    net_channels_per_peer: int | None = None
    """``NCCL_NCHANNELS_PER_NET_PEER``: p2p channels per peer on another node (None: NCCL 2.29's own choice,
    :func:`p2p_channels`; NCCL 2.12-2.27 used 2)."""

    def __post_init__(self):
        for name in ("nranks", "gpus_per_node"):
            value = getattr(self, name)
            if isinstance(value, bool) or not isinstance(value, int) or value < 1:
                raise ScenarioError(f"{value!r} is not a count of GPUs", field=name, fix="give a whole number >= 1")
        for name in ("nvlink_Bps", "nic_Bps"):
            value = getattr(self, name)
            if isinstance(value, bool) or not isinstance(value, (int, float)) or not 0 < value < math.inf:
                raise ScenarioError(f"{value!r} is not a rate", field=name, fix="give bytes/s as a positive number")
        value = self.nics_per_node
        if value is not None and (isinstance(value, bool) or not isinstance(value, int) or value < 1):
            raise ScenarioError(f"{value!r} is not a count of NICs", field="nics_per_node",
                                fix="give a whole number >= 1")
        value = self.net_channels_per_peer
        if value is not None and (isinstance(value, bool) or not isinstance(value, int) or not 1 <= value <= 64):
            raise ScenarioError(f"{value!r} is not a count of channels", field="net_channels_per_peer",
                                fix="give a whole number from 1 to 64 (NCCL_NCHANNELS_PER_NET_PEER)")
        if self.arch not in ARCHS:
            raise ScenarioError(f"unknown GPU class {self.arch!r}", field="arch", fix=f"use one of {', '.join(ARCHS)}")
        if self.cpu not in _NET_OVERHEAD:
            raise ScenarioError(f"unknown CPU {self.cpu!r}", field="cpu", fix="use intel, amd or arm")
        if self.nranks % self.ppn:
            raise ScenarioError(f"{self.nranks} ranks do not fill nodes of {self.gpus_per_node} GPUs",
                                field="nranks", fix=f"use a multiple of {self.gpus_per_node} ranks, or fewer than it")

    @property
    def ppn(self) -> int:
        """Ranks per node."""
        return min(self.gpus_per_node, self.nranks)

    @property
    def nnodes(self) -> int:
        return self.nranks // self.ppn

    @property
    def nics(self) -> int:
        """NICs per node (one per GPU unless :attr:`nics_per_node` says otherwise)."""
        return self.nics_per_node or self.ppn

    @property
    def nic_rate_Bps(self) -> float:
        """One NIC's data-sheet rate: the node's NIC total over its NICs."""
        return self.nic_Bps * self.ppn / self.nics

    @property
    def cc(self) -> int:
        """Index of the GPU class in NCCL's tables."""
        return ARCHS.index(self.arch)

    @property
    def channels(self) -> int:
        """Channels of NCCL's ring graph (our estimate of ``search.cc`` ``ncclTopoCompute``): across nodes one per
        NIC (the search's first speed is the NIC's, so a NIC carries one channel), at least 2; on one node as many
        as the GPU's NVLink fits at the arch's top channel speed, doubled by ``ncclTopoDupChannels`` when that
        speed is high (H100: 6 x 60 GB/s -> 12 x 30)."""
        if self.nnodes > 1:
            return max(2, self.nics)
        speed = _CHANNEL_SPEED[self.arch]
        seen = self.nvlink_Bps * NVLINK_SEEN[self.arch] / _GB
        n = max(1, int(seen // speed))
        if speed >= 25 and not (self.cc >= 2 and speed < 50 and n > 4):  # ncclTopoDupChannels' conditions
            n = min(2 * n, _MAX_CHANNELS // 2)
        return n

    @property
    def comm_channels(self) -> int:
        """``comm->nChannels`` after ``ncclTopoPostset`` (``src/graph/connect.cc``): the ring graph's channels
        doubled, and doubled again across nodes from Hopper when a channel runs above 45 GB/s and fewer than 16."""
        n = min(_MAX_CHANNELS, 2 * self.channels)
        if self.cc >= 2 and self.nnodes > 1 and self.nic_rate_Bps * NIC_SEEN / _GB > 45.0 and n < 16:
            n = 2 * n
        return n


@dataclass(frozen=True, kw_only=True)
class NcclParams:
    """The model's parameters (seconds, bytes/s, fractions); the defaults are NCCL's published constants.

    Latencies are the ring algorithm's entries of NCCL's tables; the other algorithms' entries keep their published
    ratio to ring's (tree's Simple NVLink hop is 4.0/3.4 of ring's). ``None`` bandwidths mean "the communicator's
    data-sheet rate as NCCL sees it" (:data:`NVLINK_SEEN`, :data:`NIC_SEEN`); see :meth:`resolve`."""

    base_latency_s: tuple[float, float, float] = (6.6 * _US, 14.0 * _US, 8.4 * _US)
    """Per protocol (LL, LL128, Simple): the start-up of one collective (tuning.cc ``baseLatencies``, Ring row)."""
    nvlink_latency_s: tuple[float, float, float] = (0.6 * _US, 1.9 * _US, 3.4 * _US)
    """Per protocol: one step's latency over NVLink (tuning.cc ``hwLatencies`` NVLINK, Ring row)."""
    net_latency_s: tuple[float, float, float] = (2.7 * _US, 4.0 * _US, 14.0 * _US)
    """Per protocol: one step's latency over the network (tuning.cc ``hwLatencies`` NET, Ring row)."""
    nvlink_Bps: float | None = None
    """Bus bandwidth of a GPU's NVLink as the model uses it, bytes/s (None: data sheet x NVLINK_SEEN)."""
    nic_Bps: float | None = None
    """Bandwidth of a GPU's NIC as the model uses it, bytes/s (None: data sheet x NIC_SEEN)."""
    ll_efficiency: float = 0.5
    """LL's share of the bus bandwidth (tuning.cc: ring LL busBw * .5, capped by ``llMaxBws``). Another value scales
    every LL bandwidth by ``ll_efficiency / 0.5``, caps and tree's 1/3.8 included."""
    ll128_efficiency: float = 0.92
    """LL128's share (tuning.cc: ring LL128 busBw * 0.92, capped per channel); scales LL128 as LL's does."""
    nvls_efficiency: float | None = None
    """NVLS's share of the NVLink bandwidth (None: tuning.cc ``nvlsEfficiency``: Hopper .85, Blackwell .74)."""
    p2p_net_channel_Bps: float = _P2P_CHANNEL_NET_BW * _GB
    """What one point-to-point channel carries to a peer on another node, bytes/s (``src/graph/paths.cc``
    ``NCCL_P2P_PER_CHANNEL_NET_BW``: 14 GB/s, the figure NCCL sizes a peer's channels by)."""

    def __post_init__(self):
        for name in ("base_latency_s", "nvlink_latency_s", "net_latency_s"):
            value = tuple(getattr(self, name))
            if len(value) != 3 or not all(0 <= v < math.inf for v in value):
                raise ScenarioError(f"{value!r} is not three latencies (LL, LL128, Simple)", field=name,
                                    fix="give three non-negative seconds")
            object.__setattr__(self, name, tuple(float(v) for v in value))
        for name in ("nvlink_Bps", "nic_Bps", "ll_efficiency", "ll128_efficiency", "nvls_efficiency",
                     "p2p_net_channel_Bps"):
            value = getattr(self, name)
            if value is not None and not 0 < value < math.inf:
                raise ScenarioError(f"{value!r} is not positive", field=name, fix="give a positive number")

    def resolve(self, comm: Communicator) -> NcclParams:
        """These parameters with every ``None`` replaced by the communicator's default."""
        return replace(
            self,
            nvlink_Bps=self.nvlink_Bps or comm.nvlink_Bps * NVLINK_SEEN[comm.arch],
            nic_Bps=self.nic_Bps or comm.nic_Bps * NIC_SEEN,
            nvls_efficiency=self.nvls_efficiency or (_NVLS_EFFICIENCY[comm.cc] or _NVLS_EFFICIENCY[2]))

    def to_dict(self) -> dict:
        return {k: (list(v) if isinstance(v, tuple) else v) for k, v in asdict(self).items()}


def parse_algorithm(name: str, *, field: str = "algorithm") -> str:
    """An algorithm name in our spelling (``ring``, ``collnet-direct``, ``p2p``) from ours or NCCL's
    (``Ring``, ``CollNetDirect``, ``NVLSTree``), ignoring case and ``_``."""
    key = str(name).strip().lower().replace("_", "-")
    key = _ALIASES.get(key.replace("-", ""), key)
    if key in ALGORITHMS or key == P2P:
        return key
    raise ScenarioError(f"unknown NCCL algorithm {name!r}", field=field,
                        fix=f"use one of {', '.join((*ALGORITHMS, P2P))}")


def _kind(kind) -> str:
    value = str(getattr(kind, "value", kind)).lower().replace("_", "").replace("-", "")
    if value not in KINDS:
        raise ScenarioError(f"unknown collective {kind!r}", field="kind", fix=f"use one of {', '.join(KINDS)}")
    return value


def candidates(kind, comm: Communicator) -> list[tuple[str, str]]:
    """The (algorithm, protocol) pairs NCCL may run ``kind`` with on ``comm``, in NCCL's order.

    Which pairs exist follows ``ncclTopoTuneModel``'s loops (broadcast and reduce: ring only; allgather and
    reducescatter: ring, PAT with one GPU per node, NVLS on one node; NVLS, CollNet and PAT: Simple only) and the
    enabling rules of ``ncclTopoTuneModel`` and ``updateCollCostTable`` (NVLS Tree only across nodes; NVLS across
    nodes only with CollNet; CollNet with at most 8 local ranks). LL128 is taken as enabled (NCCL enables it on
    NVLink and on NICs behind the GPU's PCIe switch)."""
    kind = _kind(kind)
    if kind in ("alltoall", "sendrecv"):
        return [(P2P, "Simple")]
    n, nodes, ppn = comm.nranks, comm.nnodes, comm.ppn
    if n < 2:
        return [("ring", "Simple")]
    algos = [RING]
    if kind == "allreduce":
        algos = [TREE, RING]
        if comm.collnet and nodes > 1 and ppn <= _MAX_DIRECT_ARITY + 1:
            algos += [COLLNET_DIRECT, COLLNET_CHAIN]
        if comm.nvls and (nodes == 1 or comm.collnet):
            algos.append(NVLS)
        if comm.nvls and nodes > 1:
            algos.append(NVLS_TREE)
    elif kind in ("allgather", "reducescatter"):
        if comm.nvls and nodes == 1 and ppn <= _MAX_NVLS_ARITY:
            algos.append(NVLS)
        if ppn == 1 and comm.cc >= 1:
            algos.append(PAT)
    out = []
    for a in sorted(algos):
        for p in range(3):
            if p != SIMPLE and a in (COLLNET_DIRECT, COLLNET_CHAIN, NVLS, NVLS_TREE, PAT):
                continue
            out.append((ALGORITHMS[a], PROTOCOLS[p]))
    return out


def _scaled(table: np.ndarray, values: tuple[float, float, float], a: int, p: int) -> float:
    """Entry (a, p) of one of NCCL's latency tables with ring's entry replaced by ``values[p]`` (seconds): the
    other algorithms keep their published ratio to ring's."""
    ring = table[RING, p]
    return float(values[p] * table[a, p] / ring) if ring else float(table[a, p] * _US)


def _latency_bandwidth(kind: str, a: int, p: int, comm: Communicator, q: NcclParams) -> tuple[float, float]:
    """(latency s, algorithm bandwidth B/s) of one pair: ``ncclTopoTuneModel``'s arithmetic on our parameters."""
    n, nodes, ppn, cc = comm.nranks, comm.nnodes, comm.ppn, comm.cc
    nch = comm.channels
    idx2 = nodes - 1 if nodes <= 2 else 2
    idx1 = cc if nodes == 1 else (1 if comm.cpu == "amd" else 0)
    allreduce = kind == "allreduce"
    nsteps = 2 * (n - 1) if allreduce else n - 1 if kind in ("allgather", "reducescatter") else n
    ll_max = _LL_MAX_BW[idx1, idx2] * _GB
    # bus bandwidth of the graph (nChannels x bw): one node: NVLink; across nodes: min(NICs of the node, NVLink)
    net = min(ppn * q.nic_Bps, q.nvlink_Bps)
    bus = q.nvlink_Bps if nodes == 1 else net
    if nodes == 2 and a in (TREE, COLLNET_DIRECT, COLLNET_CHAIN) or a in (COLLNET_DIRECT, COLLNET_CHAIN):
        bus = min(2 * ppn * q.nic_Bps, q.nvlink_Bps)  # search.cc lets bwIntra grow to 2x bwInter for trees, CollNet
    if a in (NVLS, NVLS_TREE):
        intra = q.nvlink_Bps * q.nvls_efficiency * (nch - 1) / nch
        intra *= 2.0 if allreduce else (ppn - 1) / ppn  # tuning.cc: AllReduce pipelines two operations
        bus = intra if nodes == 1 else min(intra, net * (2 if nodes <= 2 and a == NVLS_TREE else 1))
        if a == NVLS_TREE:
            bus = min(bus, nch * _PER_CH_NVLS_TREE[cc, idx2] * _GB) if _PER_CH_NVLS_TREE[cc, idx2] else bus
    if a == RING and p == LL:
        bus = min(ll_max, bus * _LL_FACTOR[RING])
    if a == RING and p == LL128:
        bus = min(bus * _LL128_FACTOR[RING], nch * _PER_CH_RING_LL128[cc, idx2] * _GB)
    if a == TREE and allreduce:
        bus = min(bus * _TREE_ALLREDUCE, nch * _PER_CH_TREE[cc, idx2] * _GB)
    if a == TREE and p == LL:
        bus = min(bus * _LL_FACTOR[TREE], ll_max)
    if a == TREE and p == LL128:
        factor = 7.0 / 9.0 if nodes == 1 else _LL128_FACTOR[TREE]
        bus = min(bus * factor, nch * _PER_CH_TREE_LL128[cc, idx2] * _GB)
    # our correction of a protocol's bandwidth, caps included (the caps are what binds for LL)
    bus *= {LL: q.ll_efficiency / _LL_FACTOR[RING], LL128: q.ll128_efficiency / _LL128_FACTOR[RING]}.get(p, 1.0)
    if a == PAT:
        bus *= _PAT_FACTOR
    if a == COLLNET_DIRECT:
        ratio = ppn / nch  # GPU/NIC ratio
        bus /= ratio - (ratio - 1) / 2
        bus *= _COLLNET_HOPPER if cc >= 2 else 1.0
    if not (a != RING and kind in ("allgather", "reducescatter")):  # bus bandwidth -> algorithm bandwidth
        bus *= n / nsteps if a in (RING, NVLS, NVLS_TREE) else 0.5
    # latency
    base = _scaled(_BASE_LAT, q.base_latency_s, a, p)
    intra = _scaled(_HW_LAT_NVLINK, q.nvlink_latency_s, a, p)
    inter = _scaled(_HW_LAT_NET, q.net_latency_s, TREE if ppn == 1 else a, p)  # ppn 1: tree's network latency
    if a == RING:
        if kind in ("broadcast", "reduce"):  # one pipeline: a single hop's latency (sameChannels graphs)
            lat = base + (intra if nodes == 1 else _scaled(_HW_LAT_NET, q.net_latency_s, RING, p))
        else:
            overhead = _NET_OVERHEAD[comm.cpu] * _US * (3 if p == SIMPLE else 1) if nodes > 1 else 0.0
            intra = max(intra, overhead)  # inter-node rings still launch nsteps network posts
            inter_steps = 0 if nodes == 1 else 2 * (nodes - 1) if allreduce else nodes - 1
            lat = base + (nsteps - inter_steps) * intra + inter_steps * inter
    elif a == TREE:
        lat = base + 2 * ((ppn - 1) * intra + _log2i(nodes) * inter)
    elif a == COLLNET_DIRECT:
        lat = base + 2 * (min(1, ppn - 1) * intra + (ppn - 1) * _ARITY_LAT * _US) + inter
    elif a == COLLNET_CHAIN:
        lat = base + 2 * (ppn - 1) * intra + inter
    elif a == NVLS:
        lat = intra + (inter if nodes > 1 else 0.0)
    elif a == NVLS_TREE:
        lat = base + intra + 2 * _log2i(nodes) * inter
    else:  # PAT
        lat = base + _log2i(nodes) * inter / 3.5 + n * _PAT_LAT_PER_RANK * _US
    return lat, bus


def _pow2_up(n: int) -> int:
    """NCCL's ``pow2Up``: the smallest power of two >= n."""
    return 1 << max(0, int(n) - 1).bit_length()


def p2p_channels(comm: Communicator) -> tuple[int, int]:
    """``(p2pnChannels, p2pnChannelsPerPeer)`` as NCCL 2.29 sets them (``src/graph/paths.cc``):
    ``ncclTopoGetNchannels`` gives a peer on NVLink 2 channels per link, a peer on another node
    ``max(1 NIC, ceil(NIC GB/s / NCCL_P2P_PER_CHANNEL_NET_BW))`` (or ``NCCL_NCHANNELS_PER_NET_PEER``);
    ``ncclTopoComputeP2pChannelsPerPeer`` takes the minimum over the peers; ``ncclTopoComputeP2pChannels`` rounds
    both counts up to powers of two (p2pnChannels from ``comm->nChannels``) and, across nodes without the
    variable set, halves the per-peer count until ``perPeer * ceil(nranks / NCCL_MAX_DEV_WORK_P2P_PER_BATCH)``
    fits in p2pnChannels (so many ranks leave one channel per peer); otherwise caps it at p2pnChannels."""
    total = _pow2_up(min(comm.comm_channels, _MAX_CHANNELS))
    counts = []
    if comm.ppn > 1:  # a peer over NVLink: 2 x (its links as NCCL counts them)
        counts.append(2 * max(1, int(comm.nvlink_Bps / _GB / _NVLINK_LINK[comm.arch])))
    if comm.nnodes > 1:
        counts.append(comm.net_channels_per_peer or max(1, math.ceil(comm.nic_rate_Bps / _GB / _P2P_CHANNEL_NET_BW)))
    per_peer = _pow2_up(min(counts or [2]))
    if comm.nnodes > 1 and comm.net_channels_per_peer is None:
        while per_peer * -(-comm.nranks // _P2P_PER_BATCH) > total and per_peer > 1:
            per_peer //= 2
    else:
        per_peer = min(per_peer, total)
    return total, per_peer


def p2p_time(kind, nbytes, comm: Communicator, params: NcclParams | None = None) -> np.ndarray:
    """All-to-all (``nbytes`` sent per rank, ``1/n`` of it to each rank) or send/recv (``nbytes`` to one peer on
    another node when there is one) as NCCL's point-to-point transfers with the Simple protocol: one base latency
    and one hop, the bytes for peers on the node over NVLink and the rest over the NIC, in parallel. The network
    share moves at ``min(NIC, channels x p2p_net_channel_Bps)``: send/recv's one remote peer on
    ``p2pnChannelsPerPeer`` channels, all-to-all's remote peers on up to all ``p2pnChannels``
    (:func:`p2p_channels`). Our model: NCCL's tuner has no entry for point-to-point.

    Notes: send/recv across nodes of 8 H100s with 400 Gb/s NICs at 80 ranks runs on 1 channel per peer (16
    channels; 4 wanted by 50/14 GB/s, halved while 10 batches of 8 peers need more than 16), so it moves
    ``min(48, 14) = 14`` GB/s (tests check the closed form)."""
    kind = _kind(kind)
    q = (params or NcclParams()).resolve(comm)
    nbytes = np.asarray(nbytes, float)
    n, ppn = comm.nranks, comm.ppn
    remote = comm.nnodes > 1
    hop = q.net_latency_s[SIMPLE] if remote else q.nvlink_latency_s[SIMPLE]
    total, per_peer = p2p_channels(comm) if remote else (0, 0)
    if kind == "sendrecv":
        nic = q.nic_Bps * ppn / comm.nics  # the one remote peer has its NIC to itself (nic_Bps is a GPU's share)
        wire = nbytes / (min(nic, per_peer * q.p2p_net_channel_Bps) if remote else q.nvlink_Bps)
    else:
        net = min(q.nic_Bps, min(total, per_peer * (n - ppn)) * q.p2p_net_channel_Bps) if remote else q.nic_Bps
        wire = np.maximum(nbytes * (ppn - 1) / n / q.nvlink_Bps, nbytes * (n - ppn) / n / net)
    return q.base_latency_s[SIMPLE] + hop + wire


def algo_time(kind, algorithm: str, protocol: str, nbytes, comm: Communicator,
              params: NcclParams | None = None) -> np.ndarray:
    """Seconds NCCL's model gives ``kind`` of ``nbytes`` (a number or an array: each size) run with ``algorithm``
    and ``protocol`` on ``comm`` (``ncclTopoGetAlgoTime``: latency + nbytes / bandwidth, with the tree correction
    per size and the ring's latency plateau across nodes). ``nbytes`` is the buffer nccl-tests prints as size
    (AllGather/ReduceScatter: the whole gathered buffer, as NCCL's ``ncclFuncMaxSendRecvCount``). Pairs that
    :func:`candidates` does not offer take ``inf``.

    Notes: ring AllReduce with Simple on one node of p GPUs is ``8.4 + 2(p-1)·3.4`` us plus
    ``nbytes / (B·p/(2(p-1)))`` with B the NVLink bus bandwidth (tests check the closed form)."""
    kind = _kind(kind)
    algorithm = parse_algorithm(algorithm)
    if protocol not in PROTOCOLS:
        raise ScenarioError(f"unknown protocol {protocol!r}", field="protocol", fix="use LL, LL128 or Simple")
    nbytes = np.asarray(nbytes, float)
    if (algorithm, protocol) not in candidates(kind, comm):
        return np.full(nbytes.shape, np.inf)
    if algorithm == P2P:
        return p2p_time(kind, nbytes, comm, params)
    q = (params or NcclParams()).resolve(comm)
    a, p = ALGORITHMS.index(algorithm), PROTOCOLS.index(protocol)
    lat, bw = _latency_bandwidth(kind, a, p, comm, q)
    if bw <= 0:
        return np.full(nbytes.shape, np.inf)
    bws = np.full(nbytes.shape, bw)
    log_size = np.array([_log2i(int(b) >> 6) for b in nbytes.ravel()], int).reshape(nbytes.shape)
    ok = (log_size >= 0) & (log_size < 23)
    if kind == "allreduce" and (a == TREE or (a == NVLS_TREE and comm.cc >= 3)):
        bws = np.where(ok, bw * _TREE_CORRECTION[p, np.clip(log_size, 0, 23)], bws)
    lats = np.full(nbytes.shape, lat)
    if a == RING and p == SIMPLE and comm.nnodes > 1 and kind == "allreduce":
        comm_channels = min(_MAX_CHANNELS, 2 * comm.channels)  # connect.cc ncclTopoPostset doubles the rings
        plateau = _RING_PLATEAU[comm.cc >= 1]
        lats = np.where(nbytes / (comm_channels * comm.nranks) >= 64, lat * plateau, lats)
    return lats + nbytes / bws


@dataclass(frozen=True)
class Choice:
    """Per size: the model's time, algorithm and protocol (arrays of one length)."""

    seconds: np.ndarray
    algorithm: np.ndarray
    protocol: np.ndarray
    table: dict = field(default_factory=dict, repr=False)
    """(algorithm, protocol) -> seconds per size, for every pair offered."""

    def __iter__(self):
        return iter((self.seconds, self.algorithm, self.protocol))


def choose(kind, nbytes, comm: Communicator, params: NcclParams | None = None,
           algorithm: str | None = None) -> Choice:
    """Per size, the (time, algorithm, protocol) NCCL's tuner picks: the cheapest pair (``topoGetAlgoInfo``; ties
    go to the first in NCCL's order). A given ``algorithm`` is forced (as ``NCCL_ALGO``); the protocol is still
    chosen. Unpacks as ``seconds, algorithms, protocols``.

    Raises UnsupportedError when the forced algorithm cannot run ``kind`` on ``comm`` (naming those that can)."""
    kind = _kind(kind)
    nbytes = np.atleast_1d(np.asarray(nbytes, float))
    pairs = candidates(kind, comm)
    if algorithm is not None and algorithm != "auto":
        wanted = parse_algorithm(algorithm)
        offered = sorted({a for a, _ in pairs}, key=lambda a: (*ALGORITHMS, P2P).index(a))
        pairs = [(a, p) for a, p in pairs if a == wanted]
        if not pairs:
            raise UnsupportedError(f"NCCL does not run {kind} with {wanted} on {comm.nranks} ranks "
                                   f"({comm.nnodes} node(s), nvls={comm.nvls}, collnet={comm.collnet})",
                                   field="algorithm", fix=f"use one of {', '.join(offered)} (or auto)")
    table = {pair: algo_time(kind, *pair, nbytes, comm, params) for pair in pairs}
    times = np.stack([table[pair] for pair in pairs])
    best = np.argmin(times, axis=0)  # first minimum: NCCL's strict '<' keeps the earlier pair on ties
    algos = np.array([pairs[i][0] for i in best])
    protos = np.array([pairs[i][1] for i in best])
    return Choice(times[best, np.arange(len(nbytes))], algos, protos, table)


_SCHEDULES = {  # NCCL algorithm -> lightrail schedules that move the same bytes over the same links, best first
    "ring": {"*": ("ring",)},
    "tree": {"allreduce": ("double-binary-tree",)},
    "nvls": {"allreduce": ("direct",), "allgather": ("ring",), "reducescatter": ("ring",)},
    "nvls-tree": {"allreduce": ("hierarchical", "double-binary-tree")},
    "collnet-direct": {"allreduce": ("hierarchical",)},
    "collnet-chain": {"allreduce": ("hierarchical",)},
    "pat": {"allgather": ("recursive-doubling", "bruck"), "reducescatter": ("recursive-halving", "bruck")},
    P2P: {"alltoall": ("pairwise",)},
}


def lightrail_schedule(kind, algorithm: str) -> str | None:
    """The lightrail schedule (``lightrail.collectives.registry`` name) closest to NCCL's ``algorithm`` for
    ``kind``, or None: ring -> ``ring``; tree -> ``double-binary-tree`` (NCCL's two trees); NVLS -> ``direct``
    for AllReduce (every GPU exchanges with the switch once: the same bytes per NVLink as a direct exchange);
    CollNet -> ``hierarchical`` (reduce on the node, the network does the rest); PAT -> the log-step
    ``recursive-doubling``/``recursive-halving``; p2p all-to-all -> ``pairwise``."""
    from lightrail.collectives.registry import algorithms

    kind = _kind(kind)
    algorithm = parse_algorithm(algorithm)
    registered = {a.name for a in algorithms(kind)} if kind != "sendrecv" else set()
    by_kind = _SCHEDULES.get(algorithm, {})
    for name in by_kind.get(kind, by_kind.get("*", ())):
        if name in registered:
            return name
    return None
