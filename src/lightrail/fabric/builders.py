"""Topology builders: each returns a :class:`Topology` with its closed-form hop distance.

Endpoints (GPUs) are nodes ``0 .. n-1`` in every builder, so rank r sits on GPU r.
"""

from __future__ import annotations

from math import prod

import numpy as np

from lightrail.defaults import GPUS_PER_SERVER, HOSTS_PER_LEAF, NIC_BANDWIDTH, NVLINK_BANDWIDTH, TOPOLOGIES
from lightrail.errors import InfeasibleError, UnsupportedError
from lightrail.fabric.circuits import check_partial_permutation
from lightrail.fabric.topology import UNKNOWN_HOPS, NodeKind, Topology

__all__ = ["switch", "ring", "torus", "fat_tree", "rails", "circuits", "photonic_rails", "square_shape",
           "build_topology", "sorted_unique", "TOPOLOGIES", "HOSTS_PER_LEAF",
           "NVLINK_BANDWIDTH", "NIC_BANDWIDTH", "GPUS_PER_SERVER"]

# NVLINK_BANDWIDTH, NIC_BANDWIDTH, GPUS_PER_SERVER, HOSTS_PER_LEAF and TOPOLOGIES are defined (with their
# sources) in lightrail.defaults, which the CLI reads without importing this module; re-exported here.


def sorted_unique(values) -> np.ndarray:
    """``np.unique(values)`` for integers (flattened, sorted), by one sort. numpy 2's ``np.unique`` without extra
    outputs asks ``np.ma`` whether its input is masked, and importing ``numpy.ma`` is ~20 ms of a small job's run.

    >>> sorted_unique([3, 1, 3, 2, 1]).tolist()
    [1, 2, 3]
    """
    flat = np.sort(np.asarray(values).ravel())
    if flat.size < 2:
        return flat
    keep = np.empty(flat.size, bool)
    keep[0] = True
    np.not_equal(flat[1:], flat[:-1], out=keep[1:])
    return flat[keep]


def _check_n(n: int, field: str = "ranks") -> None:
    if n < 2:
        raise UnsupportedError(f"{n} GPUs is too few", field=field, fix="use 2 or more")


def _bidirectional(a, b):
    a, b = np.asarray(a), np.asarray(b)
    return np.concatenate([a, b]).astype(np.int32), np.concatenate([b, a]).astype(np.int32)


def _build(name, kinds, src, dst, bandwidth, latency, hops_fn, **meta) -> Topology:
    bandwidth = np.broadcast_to(np.asarray(bandwidth, float), src.shape).copy()
    return Topology(name, int(np.sum(kinds == NodeKind.GPU)), kinds, src, dst, bandwidth,
                    np.full(len(src), float(latency)), hops_fn, meta)


def switch(n: int, *, bandwidth: float = NIC_BANDWIDTH, latency: float = 0.0) -> Topology:
    """n GPUs on one non-blocking electrical packet switch (each GPU: one up and one down link)."""
    _check_n(n)
    kinds = np.array([NodeKind.GPU] * n + [NodeKind.EPS])
    src, dst = _bidirectional(np.arange(n), np.full(n, n))

    def hops(u, v):
        return np.where(u == v, 0, np.where((u == n) | (v == n), 1, 2))

    return _build(f"switch(n={n})", kinds, src, dst, bandwidth, latency, hops)


def ring(n: int, *, bandwidth: float = NIC_BANDWIDTH, latency: float = 0.0) -> Topology:
    """Bidirectional ring: GPU i links to i+1 and i-1 (one link each way per neighbour)."""
    _check_n(n)
    i = np.arange(n if n > 2 else 1)
    src, dst = _bidirectional(i, (i + 1) % n)

    def hops(u, v):
        d = np.abs(u - v)
        return np.minimum(d, n - d)

    return _build(f"ring(n={n})", np.full(n, NodeKind.GPU), src, dst, bandwidth, latency, hops)


def square_shape(n: int, dims: int) -> tuple[int, ...]:
    """The most nearly cubic ``dims``-dimensional shape with product n (larger sides first)."""
    if n < 1 or dims < 1:
        raise InfeasibleError(f"no {dims}-dimensional shape has {n} nodes", field="shape",
                              fix="use n >= 1 and dims >= 1")
    best: tuple[int, ...] | None = None

    def search(rest: int, left: int, lo: int, acc: tuple[int, ...]):
        nonlocal best
        if left == 1:
            if rest >= lo:
                cand = tuple(sorted(acc + (rest,), reverse=True))
                if best is None or cand[0] - cand[-1] < best[0] - best[-1]:
                    best = cand
            return
        f = lo
        while f ** left <= rest:
            if rest % f == 0:
                search(rest // f, left - 1, f, acc + (f,))
            f += 1

    search(n, dims, 1, ())
    assert best is not None  # (n, 1, ..., 1) always qualifies
    return best


def torus(shape: tuple[int, ...], *, bandwidth: float = NIC_BANDWIDTH, latency: float = 0.0) -> Topology:
    """A k-dimensional torus (2D, 3D, ...): each GPU links to both neighbours in every dimension."""
    shape = tuple(int(s) for s in shape)
    if not shape or any(s < 1 for s in shape):
        raise InfeasibleError(f"torus sides must be positive, got {shape}", field="shape")
    n = prod(shape)
    _check_n(n)
    coords = np.array(np.unravel_index(np.arange(n), shape))
    a, b = [], []
    for d, side in enumerate(shape):
        if side < 2:
            continue
        plus = coords.copy()
        plus[d] = (plus[d] + 1) % side
        nxt = np.ravel_multi_index(plus, shape)
        keep = np.ones(n, bool) if side > 2 else coords[d] == 0  # side 2: one link pair, not two
        a.append(np.arange(n)[keep])
        b.append(nxt[keep])
    src, dst = _bidirectional(np.concatenate(a), np.concatenate(b))
    sides = np.array(shape)[:, None]

    def hops(u, v):
        cu = np.array(np.unravel_index(np.ravel(u), shape))
        cv = np.array(np.unravel_index(np.ravel(v), shape))
        d = np.abs(cu - cv)
        return np.minimum(d, sides - d).sum(axis=0).reshape(np.shape(u))

    name = f"torus({'x'.join(map(str, shape))})"
    return _build(name, np.full(n, NodeKind.GPU), src, dst, bandwidth, latency, hops, shape=shape)


def fat_tree(n: int, *, bandwidth: float = NIC_BANDWIDTH, latency: float = 0.0, hosts_per_leaf: int = HOSTS_PER_LEAF,
             oversubscription: float = 1.0) -> Topology:
    """Two-tier leaf-spine fat-tree; leaves have ``hosts_per_leaf * B / oversubscription`` uplink capacity.

    Every leaf links to every spine; spines = round(hosts_per_leaf / oversubscription) with the
    uplink bandwidth scaled so the ratio is exact. ECMP spreads inter-leaf traffic over all spines.
    """
    _check_n(n)
    if hosts_per_leaf < 1:
        raise InfeasibleError(f"hosts_per_leaf={hosts_per_leaf}", field="hosts_per_leaf", fix="use 1 or more")
    if oversubscription < 1:
        raise InfeasibleError(f"oversubscription {oversubscription} is below 1", field="oversubscription",
                              fix="use 1 for a non-blocking tree, 2 or 3 for 2:1 or 3:1")
    k = min(hosts_per_leaf, n)
    leaves = -(-n // k)
    spines = max(1, round(k / oversubscription)) if leaves > 1 else 0
    up_bw = k * bandwidth / oversubscription / max(spines, 1)
    gpu = np.arange(n)
    leaf = n + gpu // k
    kinds = np.array([NodeKind.GPU] * n + [NodeKind.EPS] * (leaves + spines))
    ls = np.repeat(np.arange(leaves), spines) + n
    sp_ = np.tile(np.arange(spines), leaves) + n + leaves
    s1, d1 = _bidirectional(gpu, leaf)
    s2, d2 = _bidirectional(ls, sp_)
    src, dst = np.concatenate([s1, s2]), np.concatenate([d1, d2])
    bw = np.concatenate([np.full(len(s1), bandwidth), np.full(len(s2), up_bw)])
    first_spine = n + leaves

    def level(x):  # 0 GPU, 1 leaf, 2 spine; and the leaf a GPU or leaf sits under
        lv = np.where(x < n, 0, np.where(x < first_spine, 1, 2))
        under = np.where(x < n, x // k, x - n)
        return lv, under

    def hops(u, v):
        lu, au = level(u)
        lv, av = level(v)
        same = u == v
        up = np.where(lu == 2, 0, 2 - lu)  # hops from u up to spine level
        down = np.where(lv == 2, 0, 2 - lv)
        via_spine = up + down
        if spines == 0:
            via_spine = np.full(np.shape(u), 10**6)
        via_spine = np.where((lu == 2) & (lv == 2), 2, via_spine)  # spine to spine through a leaf
        shared_leaf = (lu < 2) & (lv < 2) & (au == av)
        below = (1 - lu) + (1 - lv)  # GPU-GPU under one leaf: 2, GPU-leaf: 1
        return np.where(same, 0, np.where(shared_leaf, below, via_spine))

    return _build(f"fat_tree(n={n},k={k},over={oversubscription:g})", kinds, src, dst, bw, latency, hops,
                  hosts_per_leaf=k, oversubscription=oversubscription)


def rails(n: int, *, gpus_per_server: int = GPUS_PER_SERVER, nic_bandwidth: float = NIC_BANDWIDTH,
          nvlink_bandwidth: float = NVLINK_BANDWIDTH, latency: float = 0.0, routing: str = "pxn") -> Topology:
    """Rail-optimized cluster: servers of g GPUs on an NVLink switch; GPU i of every server on rail i.

    GPU ``r`` is on server ``r // g`` and rail ``r % g``. Each rail is one non-blocking electrical
    switch. ``routing`` decides how traffic between GPUs on different servers and rails goes:
    ``"pxn"`` (NCCL's rule, the default): NVLink to the GPU on the destination's rail first, then that
    rail, so a flow uses one rail, as it does on photonic rails; ``"ecmp"``: split evenly over both
    shortest paths (source rail then NVLink at the destination, or NVLink first then the
    destination's rail), which lets one flow use two NICs.
    """
    _check_n(n)
    if routing not in ("pxn", "ecmp"):
        raise InfeasibleError(f"unknown routing {routing!r}", field="routing", fix="use pxn or ecmp")
    g = gpus_per_server
    if g < 1:
        raise InfeasibleError(f"gpus_per_server={g}", field="gpus_per_server", fix="use 1 or more (8 on HGX)")
    if n > g and n % g:
        raise InfeasibleError(f"{n} GPUs do not fill servers of {g}", field="ranks",
                              fix=f"use a multiple of --gpus-per-server ({g}) or at most {g} GPUs")
    g = min(g, n)
    servers = n // g
    gpu = np.arange(n)
    nvs = n + gpu // g
    rail = n + servers + gpu % g
    kinds = np.array([NodeKind.GPU] * n + [NodeKind.NVSWITCH] * servers + [NodeKind.EPS] * (g if servers > 1 else 0))
    s1, d1 = _bidirectional(gpu, nvs)
    s2, d2 = _bidirectional(gpu, rail) if servers > 1 else (np.zeros(0, np.int32),) * 2
    src, dst = np.concatenate([s1, s2]), np.concatenate([d1, d2])
    bw = np.concatenate([np.full(len(s1), nvlink_bandwidth), np.full(len(s2), nic_bandwidth)])
    first_rail = n + servers

    def coords(x):  # kind (0 GPU, 1 NVSwitch, 2 rail), server (-1 for a rail), rail (-1 for an NVSwitch)
        kind = np.where(x < n, 0, np.where(x < first_rail, 1, 2))
        server = np.where(kind == 0, x // g, np.where(kind == 1, x - n, -1))
        rail_ = np.where(kind == 0, x % g, np.where(kind == 2, x - first_rail, -1))
        return kind, server, rail_

    # Shortest hop counts by kind pair when server and rail both differ (PXN detours cost 2 hops).
    far = np.array([[4, 3, 3], [3, 4, 2], [3, 2, 4]])
    if routing == "pxn":  # no NVLink hop after a NIC: from a rail switch, another rail's GPU is 5 hops away
        far[2, 0] = 5

    def hops(u, v):
        ku, su, ru = coords(u)
        kv, sv, rv = coords(v)
        same_server = (su >= 0) & (su == sv)
        same_rail = (ru >= 0) & (ru == rv)
        near = (ku == 0) | (kv == 0)  # a GPU shares a switch with its own server's NVSwitch and its rail
        one_switch = np.where((ku == 0) & (kv == 0), 2, 1)
        d = np.where(near & (same_server | same_rail), one_switch, far[ku, kv])
        if servers == 1:
            d = np.where((ku == 0) & (kv == 0), 2, np.where((ku == 0) | (kv == 0), 1, 2))
        return np.where(u == v, 0, d)

    return _build(f"rails(n={n},g={g},{routing})", kinds, src, dst, bw, latency, hops,
                  gpus_per_server=g)


def circuits(n: int, configurations, *, bandwidth: float = NIC_BANDWIDTH, latency: float = 0.0) -> Topology:
    """Static circuits among n GPUs: one partial permutation per optical port (``perm[i] = j``: i -> j).

    Several configurations model GPUs with several ports (a union of matchings). Routing between
    GPUs that share no circuit goes over multiple circuits (GPUs forward), found by BFS.
    """
    _check_n(n)
    perms = [check_partial_permutation(p, n, field=f"configurations[{i}]") for i, p in enumerate(configurations)]
    if not perms:
        raise InfeasibleError("no circuit configuration given", field="configurations",
                              fix="give at least one permutation, e.g. a ring: [1, 2, ..., n-1, 0]")
    if any(len(p) != n for p in perms):
        raise InfeasibleError(f"each configuration needs {n} entries (one per GPU)", field="configurations")
    src = np.concatenate([np.flatnonzero(p >= 0) for p in perms]).astype(np.int32)
    dst = np.concatenate([p[p >= 0] for p in perms]).astype(np.int32)
    return _build(f"circuits(n={n},ports={len(perms)})", np.full(n, NodeKind.GPU), src, dst, bandwidth,
                  latency, None, ports=len(perms))


def build_topology(kind: str, n: int, *, bandwidth: float = NIC_BANDWIDTH, latency: float = 0.0,
                   shape: tuple[int, ...] | None = None, gpus_per_server: int = GPUS_PER_SERVER,
                   nvlink_bandwidth: float = NVLINK_BANDWIDTH, hosts_per_leaf: int = HOSTS_PER_LEAF,
                   oversubscription: float = 1.0, routing: str = "pxn") -> Topology:
    """A topology by preset name for n GPUs; errors name the option at fault.

    ``bandwidth`` is the per-GPU network link (NIC) rate; ``latency`` is charged per hop.
    ``shape`` fixes the torus sides (default: as square as possible).
    """
    _check_n(n)
    if kind in ("torus2d", "torus3d"):
        dims = 2 if kind == "torus2d" else 3
        if shape is None:
            shape = square_shape(n, dims)
        elif len(shape) != dims or prod(shape) != n:
            raise InfeasibleError(f"shape {'x'.join(map(str, shape))} is not a {dims}D shape of {n} GPUs",
                                  field="--shape",
                                  fix=f"give {dims} sides whose product is {n}, e.g. "
                                      f"{'x'.join(map(str, square_shape(n, dims)))}")
        return torus(shape, bandwidth=bandwidth, latency=latency)
    if kind == "switch":
        return switch(n, bandwidth=bandwidth, latency=latency)
    if kind == "ring":
        return ring(n, bandwidth=bandwidth, latency=latency)
    if kind == "fat-tree":
        return fat_tree(n, bandwidth=bandwidth, latency=latency, hosts_per_leaf=hosts_per_leaf,
                        oversubscription=oversubscription)
    if kind == "rails":
        return rails(n, gpus_per_server=gpus_per_server, nic_bandwidth=bandwidth,
                     nvlink_bandwidth=nvlink_bandwidth, latency=latency, routing=routing)
    raise UnsupportedError(f"unknown topology {kind!r}", field="--topology", fix="use one of " + ", ".join(TOPOLOGIES))


def photonic_rails(servers: int, circuits, *, gpus_per_server: int = GPUS_PER_SERVER,
                   nic_bandwidth: float = NIC_BANDWIDTH, nvlink_bandwidth: float = NVLINK_BANDWIDTH,
                   latency: float = 0.0) -> Topology:
    """Servers on NVLink whose rails are optical circuit switches in a given configuration.

    ``circuits`` is ``(rail, tx_server, rx_server)`` arrays: on rail i, a circuit from the NIC of
    GPU ``tx_server*g + i`` to the NIC of GPU ``rx_server*g + i``. Traffic between servers without
    a circuit of their own rides NVLink to a GPU whose rail has one (PXN), or several circuits.
    """
    g = gpus_per_server
    if servers < 1 or g < 1:
        raise InfeasibleError(f"{servers} servers of {g} GPUs", field="cluster", fix="use at least one of each")
    rail, tx, rx = (np.asarray(a, dtype=np.int64) for a in circuits)
    if len(rail) and (rail.min() < 0 or rail.max() >= g or min(tx.min(), rx.min()) < 0
                      or max(tx.max(), rx.max()) >= servers):
        raise InfeasibleError("a circuit names a rail or server that does not exist", field="circuits")
    n = servers * g
    gpu = np.arange(n)
    nvs = n + gpu // g
    kinds = np.array([NodeKind.GPU] * n + [NodeKind.NVSWITCH] * servers)
    s1, d1 = _bidirectional(gpu, nvs)
    src = np.concatenate([s1, (tx * g + rail).astype(np.int32)])
    dst = np.concatenate([d1, (rx * g + rail).astype(np.int32)])
    bw = np.concatenate([np.full(len(s1), nvlink_bandwidth), np.full(len(rail), nic_bandwidth)])
    return _build(f"photonic_rails(servers={servers},g={g},circuits={len(rail)})", kinds, src, dst, bw, latency,
                  _photonic_rails_hops(servers, g, rail, tx, rx), gpus_per_server=g)


def _photonic_rails_hops(servers: int, g: int, rail, tx, rx):
    """Hop counts on photonic rails where a circuit joins the two servers, in closed form; the rest
    (:data:`UNKNOWN_HOPS`: paths over several circuits) are left to BFS. None if a transmitter lights two
    circuits (no closed form: BFS throughout).

    GPU ``(s, i)`` reaches GPU ``(t, j)`` of another server in 1 hop over its own circuit to ``t`` when ``i == j``,
    else in 3 (its circuit, then NVLink at ``t``; or NVLink to ``(s, j)``, then that GPU's circuit): no path of 2
    ends on another rail, since a circuit keeps the rail and NVLink keeps the server. An NVSwitch is one hop from
    its GPUs, two from ``(t, j)`` over ``(s, j)``'s circuit. Without such a circuit, the shortest paths over two
    circuits (or one, on a third rail) are counted the same way, each case with the shorter shapes ruled out;
    longer chains of circuits go to BFS."""
    n = servers * g
    direct = np.full((g, servers), -1, np.int64)  # direct[rail, tx_server]: the server its circuit reaches
    code = sorted_unique((np.asarray(rail, np.int64) * servers + tx) * servers + rx)  # the circuits, each once
    key = np.stack([code // servers**2, code // servers % servers, code % servers])
    if len(sorted_unique(key[0] * servers + key[1])) != key.shape[1]:
        return None
    direct[key[0], key[1]] = key[2]

    def hops(u, v):
        u, v = np.broadcast_arrays(np.asarray(u, np.int64), np.asarray(v, np.int64))
        d = np.full(u.shape, UNKNOWN_HOPS, np.int64)
        gpu_u, gpu_v = u < n, v < n
        su = np.where(gpu_u, u // g, u - n)  # the server of a GPU or of an NVSwitch
        iu = np.where(gpu_u, u % g, 0)
        sv, jv = np.where(gpu_v, v // g, 0), np.where(gpu_v, v % g, 0)
        same = gpu_v & (su == sv)
        d[same & gpu_u] = np.where(iu == jv, 0, 2)[same & gpu_u]
        d[same & ~gpu_u] = 1
        other = gpu_v & ~same
        own, theirs = direct[iu, su] == sv, direct[jv, su] == sv  # u's circuit reaches t; (s, j)'s does
        d[other & gpu_u & own] = np.where(iu == jv, 1, 3)[other & gpu_u & own]
        d[other & gpu_u & ~own & theirs & (iu != jv)] = 3
        d[other & ~gpu_u & theirs] = 2
        # two circuits on u's rail, on v's rail, or u's then v's; any circuit from s to t at all
        via = np.where(own | (direct[iu, su] < 0), 0, direct[iu, su])
        two_i = (direct[iu, su] >= 0) & (direct[iu, via] == sv)
        two_j = (direct[jv, su] >= 0) & (direct[jv, np.maximum(direct[jv, su], 0)] == sv)
        mid = (direct[iu, su] >= 0) & (direct[jv, via] == sv)
        anywhere = (direct[:, su] == sv).any(axis=0) if g else np.zeros(u.shape, bool)
        left = other & (d == UNKNOWN_HOPS)
        same_rail = iu == jv
        d[left & gpu_u & same_rail & two_i] = 2  # c c: 1 impossible (no own circuit)
        four = left & gpu_u & ~same_rail & (two_i | two_j | mid)  # c c N, N c c, c N c; nothing of 3 ends on j
        d[four] = 4
        d[left & gpu_u & ~same_rail & ~four & anywhere] = 5  # N c N over another rail's circuit
        d[left & ~gpu_u & two_j] = 3  # NVSwitch: to (s, j), then two circuits
        d[left & ~gpu_u & ~two_j & anywhere] = 4  # to (s, k), k's circuit, NVLink at t
        return d

    return hops
