"""Step timing on a network state: congestion + dilation (DESIGN.md "Time model").

Below `control/` and `sim/` so planners price a step without importing the simulator.

A step's transfers are aggregated per (src, dst) pair, routed over shortest paths with ECMP
(traffic split evenly over the equal-cost next hops at every node), and charged to the links
they cross. Pair i finishes after ``alpha + latency(path_i) + max_{e in path_i} load_e / bw_e``;
the step lasts as long as its slowest pair, and a collective is the sum of its steps.

Because a pair's time is linear in the bytes per chunk, a step is reduced once to per-pair
(latency, seconds-per-chunk-byte) coefficients; timing it at any message size is then one max.
Steps with the same pairs and multiplicities share the work (a ring's 2(n-1) steps are one).
"""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np

from lightrail.collectives.schedule import Schedule
from lightrail.errors import InfeasibleError
from lightrail.fabric.topology import Topology

__all__ = ["Routes", "StepModel", "Engine", "CollectiveTiming"]


@dataclass(frozen=True)
class Routes:
    """ECMP routes of P pairs: pair ``pair[k]`` sends fraction ``frac[k]`` of its bytes over ``link[k]``."""

    pair: np.ndarray
    link: np.ndarray
    frac: np.ndarray
    latency: np.ndarray  # per pair: the largest latency over its shortest paths
    hops: np.ndarray  # per pair


@dataclass(frozen=True)
class StepModel:
    """One step pattern: pair i takes ``latency[i] + chunk_bytes * per_byte[i]`` (plus alpha)."""

    latency: np.ndarray
    per_byte: np.ndarray

    def time(self, chunk_bytes: float, alpha: float) -> float:
        if not len(self.latency):
            return 0.0
        return alpha + float(np.max(self.latency + chunk_bytes * self.per_byte))


@dataclass(frozen=True)
class CollectiveTiming:
    """The result of timing a schedule at one buffer size."""

    schedule: str
    size: float
    time_s: float
    step_times: np.ndarray

    @property
    def steps(self) -> int:
        return len(self.step_times)


def _cat(parts: list[np.ndarray], dtype) -> np.ndarray:
    return np.concatenate(parts).astype(dtype) if parts else np.zeros(0, dtype)


class Engine:
    """Times transfers and schedules on one topology; caches routes and step patterns.

    Parameters
    ----------
    topology : the network state.
    alpha : per-step start-up cost in seconds (software, synchronisation), charged once per step.
    placement : endpoint node of each rank (default: rank r on GPU r).

    Examples
    --------
    Ring AllReduce of 4 GB buffers on 4 GPUs behind one switch of 1 GB/s links takes
    ``2(p-1)·alpha + 2(p-1)/p · N/B`` = 6 s plus six start-ups:

    >>> from lightrail.collectives import generate
    >>> from lightrail.fabric.builders import switch
    >>> Engine(switch(4, bandwidth=1e9), alpha=1e-6).time(generate("allreduce", "ring", 4), 4e9).time_s
    6.000006
    """

    def __init__(self, topology: Topology, *, alpha: float = 0.0, placement: np.ndarray | None = None):
        self.topology = topology
        self.alpha = float(alpha)
        self.placement = np.arange(topology.num_endpoints) if placement is None else np.asarray(placement)
        self._patterns: dict[bytes, StepModel] = {}
        self._links_by_pair: tuple[np.ndarray, np.ndarray] | None = None

    # -- routing -------------------------------------------------------------------------------
    def route(self, src_nodes: np.ndarray, dst_nodes: np.ndarray) -> Routes:
        """ECMP routes for pairs of nodes, hop by hop over all pairs at once."""
        topo = self.topology
        src_nodes, dst_nodes = np.asarray(src_nodes), np.asarray(dst_nodes)
        npairs = len(src_nodes)
        hops = topo.hops(src_nodes, dst_nodes)
        if np.any(hops < 0):
            i = int(np.flatnonzero(hops < 0)[0])
            raise InfeasibleError(f"no path from node {src_nodes[i]} to node {dst_nodes[i]} in {topo.name}",
                                  field="topology", fix="connect the fabric or place the ranks elsewhere")
        pair = np.arange(npairs)
        node, frac = src_nodes.copy(), np.ones(npairs)
        lat_so_far = np.zeros(npairs)
        latency = np.zeros(npairs)
        out_pair, out_link, out_frac = [], [], []
        level = 0  # every frontier entry is `level` hops from its source, on a shortest path
        while len(pair):
            entry, link = self._next_links(pair, node, dst_nodes[pair], hops[pair] - level)
            nxt = topo.dst[link]
            dest = dst_nodes[pair[entry]]
            share = frac[entry] / np.bincount(entry, minlength=len(pair))[entry]
            out_pair.append(pair[entry])
            out_link.append(link)
            out_frac.append(share)
            lat = lat_so_far[entry] + topo.latency[link]
            arrived = nxt == dest
            np.maximum.at(latency, pair[entry][arrived], lat[arrived])
            go = ~arrived
            key = pair[entry][go].astype(np.int64) * topo.num_nodes + nxt[go]
            uniq, inv = np.unique(key, return_inverse=True)
            pair, node = (uniq // topo.num_nodes).astype(np.int64), (uniq % topo.num_nodes).astype(np.int64)
            frac = np.bincount(inv, weights=share[go], minlength=len(uniq))
            lat_so_far = np.full(len(uniq), -np.inf)
            np.maximum.at(lat_so_far, inv, lat[go])
            level += 1
        return Routes(_cat(out_pair, np.int64), _cat(out_link, np.int64), _cat(out_frac, float), latency, hops)

    def _next_links(self, pair: np.ndarray, node: np.ndarray, dest: np.ndarray, left: np.ndarray):
        """Frontier entry i (``pair[i]`` at ``node[i]``, ``left[i]`` hops from ``dest[i]``): the links out of
        its node on a shortest path, as (entry, link) rows, entry-major and in link-CSR order within an entry.

        An entry one hop from its destination takes the links ``node -> dest`` straight from a sorted index
        (a switch has as many out-links as ports: expanding them all for every pair costs pairs x ports);
        the others expand their node's out-links and keep those that get one hop closer."""
        topo = self.topology
        indptr, order = topo.out_links
        last = left == 1
        parts_e, parts_l = [], []
        far = np.flatnonzero(~last)
        if len(far):
            deg = indptr[node[far] + 1] - indptr[node[far]]
            e = np.repeat(far, deg)
            offset = np.arange(len(e)) - np.repeat(np.cumsum(deg) - deg, deg)
            link = order[indptr[node[e]] + offset]
            keep = topo.hops(topo.dst[link], dest[e]) == left[e] - 1
            parts_e.append(e[keep])
            parts_l.append(link[keep])
        near = np.flatnonzero(last)
        if len(near):
            keys, by_key = self._link_index
            want = node[near].astype(np.int64) * topo.num_nodes + dest[near]
            lo, hi = np.searchsorted(keys, want, side="left"), np.searchsorted(keys, want, side="right")
            count = hi - lo
            e = np.repeat(near, count)
            offset = np.arange(len(e)) - np.repeat(np.cumsum(count) - count, count)
            parts_e.append(e)
            parts_l.append(by_key[np.repeat(lo, count) + offset])
        if len(parts_e) == 1:
            return parts_e[0], parts_l[0]
        entry, link = np.concatenate(parts_e), np.concatenate(parts_l)
        merge = np.argsort(entry, kind="stable")  # each entry's links come from one part, already in order
        return entry[merge], link[merge]

    @property
    def _link_index(self) -> tuple[np.ndarray, np.ndarray]:
        """Links sorted by (src, dst) node pair (stable: parallel links in link order) and their sort keys."""
        if self._links_by_pair is None:
            topo = self.topology
            keys = topo.src.astype(np.int64) * topo.num_nodes + topo.dst
            by_key = np.argsort(keys, kind="stable")
            self._links_by_pair = (keys[by_key], by_key)
        return self._links_by_pair

    # -- one step ------------------------------------------------------------------------------
    def _pairs(self, src: np.ndarray, dst: np.ndarray, weight: np.ndarray | None):
        """Unique (src, dst) rank pairs of a step (sorted codes ``src*n + dst``) and the weight of each.

        Without weights, each transfer counts 1 (one chunk).
        """
        n = len(self.placement)
        src, dst = np.asarray(src, dtype=np.int64), np.asarray(dst, dtype=np.int64)
        codes = src * n + dst
        if weight is None:
            codes = np.sort(codes)
            first = np.ones(len(codes), bool)
            first[1:] = codes[1:] != codes[:-1]
            counts = np.diff(np.append(np.flatnonzero(first), len(codes))).astype(float)
            return codes[first], counts
        uniq, inv = np.unique(codes, return_inverse=True)
        return uniq, np.bincount(inv, weights=weight, minlength=len(uniq)).astype(float)

    def _model(self, uniq: np.ndarray, weight: np.ndarray) -> StepModel:
        n = len(self.placement)
        routes = self.route(self.placement[uniq // n], self.placement[uniq % n])
        load = np.bincount(routes.link, weights=routes.frac * weight[routes.pair],
                           minlength=self.topology.num_links)
        per_byte = np.zeros(len(uniq))
        np.maximum.at(per_byte, routes.pair, load[routes.link] / self.topology.bandwidth[routes.link])
        return StepModel(routes.latency, per_byte)

    def step_model(self, src: np.ndarray, dst: np.ndarray, weight: np.ndarray | None = None) -> StepModel:
        """The timing model of concurrent transfers ``src -> dst`` (ranks), each of ``weight`` units."""
        n = len(self.placement)
        if weight is None and len(src) == n:
            # Common case (rings, shifts, matchings): every rank sends one chunk. Keyed by each
            # sender's receiver, no sort needed.
            by_src = np.full(n, -1, np.int32)
            by_src[src] = dst
            if by_src.min() >= 0:
                key = b"r" + by_src.tobytes()
                model = self._patterns.get(key)
                if model is None:
                    codes = np.arange(n, dtype=np.int64) * n + by_src
                    model = self._patterns[key] = self._model(codes, np.ones(n))
                return model
        weight = None if weight is None else np.asarray(weight, float)
        uniq, w = self._pairs(src, dst, weight)
        key = b"p" + uniq.tobytes() + w.tobytes()
        model = self._patterns.get(key)
        if model is None:
            model = self._patterns[key] = self._model(uniq, w)
        return model

    def link_loads(self, src, dst, nbytes) -> np.ndarray:
        """Bytes each link carries when transfers ``src -> dst`` of ``nbytes`` run at once."""
        nbytes = np.broadcast_to(np.asarray(nbytes, float), np.shape(src))
        uniq, w = self._pairs(src, dst, nbytes)
        n = len(self.placement)
        routes = self.route(self.placement[uniq // n], self.placement[uniq % n])
        return np.bincount(routes.link, weights=routes.frac * w[routes.pair], minlength=self.topology.num_links)

    def transfer_time(self, src, dst, nbytes) -> float:
        """Time of one step of concurrent transfers (ranks ``src -> dst`` carrying ``nbytes`` each)."""
        src = np.asarray(src)
        model = self.step_model(src, dst, np.broadcast_to(np.asarray(nbytes, float), src.shape))
        return model.time(1.0, self.alpha)

    # -- schedules -----------------------------------------------------------------------------
    def _check_fits(self, nranks: int) -> None:
        if nranks > len(self.placement):
            raise InfeasibleError(f"{nranks} ranks do not fit on {len(self.placement)} GPUs of "
                                  f"{self.topology.name}", field="ranks", fix="build a larger topology")

    def profile(self, schedule: Schedule) -> list[StepModel]:
        """Per step, its timing model (steps with identical traffic share one object)."""
        self._check_fits(schedule.nranks)
        empty = StepModel(np.zeros(0), np.zeros(0))
        ptr = schedule.step_ptr
        return [self.step_model(schedule.src[a:z], schedule.dst[a:z]) if z > a else empty
                for a, z in zip(ptr[:-1], ptr[1:], strict=True)]

    def time(self, schedule: Schedule, size: float, *, profile: list[StepModel] | None = None) -> CollectiveTiming:
        """Time ``schedule`` with ``size`` bytes in each rank's buffer."""
        models = self.profile(schedule) if profile is None else profile
        cb = schedule.chunk_bytes(size)
        cache: dict[int, float] = {}
        for m in models:
            if id(m) not in cache:
                cache[id(m)] = m.time(cb, self.alpha)
        times = np.array([cache[id(m)] for m in models])
        return CollectiveTiming(schedule.name, float(size), float(times.sum()), times)

    # -- compressed schedules ------------------------------------------------------------------
    def profile_compressed(self, schedule) -> list[StepModel]:
        """:meth:`profile` of a ``CompressedSchedule`` without materialising its transfers: one model per
        distinct pattern (its pairs routed once), shared by every step that applies it. The models equal
        those :meth:`profile` builds from the expanded schedule."""
        self._check_fits(schedule.nranks)
        empty = StepModel(np.zeros(0), np.zeros(0))
        n = len(self.placement)
        models: list[StepModel] = []
        for pattern in schedule.patterns:
            if not pattern.ntransfers:
                models.append(empty)
                continue
            src, dst, weight = pattern.pairs
            if len(src) == n and np.all(weight == 1.0):
                models.append(self.step_model(src, dst))  # what profile() does for one chunk per rank
            else:
                models.append(self.step_model(src, dst, weight))  # the same pairs and chunk counts
        return [models[p] for p in schedule.step_pattern]

    def time_compressed(self, schedule, size: float, *, profile: list[StepModel] | None = None) -> CollectiveTiming:
        """:meth:`time` of a ``CompressedSchedule``: equals ``time(schedule.expand(), size)``."""
        return self.time(schedule, size, profile=self.profile_compressed(schedule) if profile is None else profile)
