"""Step timing on a network state: congestion + dilation (DESIGN.md "Time model").

Below `control/` and `sim/` so planners price a step without importing the simulator.

A step's transfers are aggregated per (src, dst) pair, routed over shortest paths with ECMP
(traffic split evenly over the equal-cost next hops at every node), and charged to the links
they cross. Pair i finishes after ``alpha + latency(path_i) + max_{e in path_i} load_e / bw_e``;
the step lasts as long as its slowest pair, and a collective is the sum of its steps.

Because a pair's time is linear in the bytes per chunk, a step is reduced once to per-pair
(latency, seconds-per-chunk-byte) coefficients; timing it at any message size is then one max.
Steps with the same pairs and multiplicities share the work (a ring's 2(n-1) steps are one).
On a ring topology shortest paths are arcs, so a step's loads and per-pair maxima are computed in closed form
(difference arrays and a range maximum) rather than hop by hop: the same numbers, O(n log n) instead of
O(n^2) for pairs n/2 hops apart (recursive doubling and halving at 65,536 ranks).
"""

from __future__ import annotations

import functools
from dataclasses import dataclass

import numpy as np

from lightrail.collectives.schedule import Schedule
from lightrail.errors import InfeasibleError
from lightrail.fabric.topology import Topology
from lightrail.sharing import OpCost

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
    """One step pattern: pair i takes ``latency[i] + chunk_bytes * per_byte[i]`` (plus alpha); link
    ``link[j]`` is busy ``chunk_bytes * link_per_byte[j]`` seconds (what flow-level sharing charges)."""

    latency: np.ndarray
    per_byte: np.ndarray
    link: np.ndarray | None = None
    link_per_byte: np.ndarray | None = None

    def time(self, chunk_bytes: float, alpha: float) -> float:
        if not len(self.latency):
            return 0.0
        with np.errstate(over="ignore"):  # a link slow enough never finishes: inf (JSON null), not a warning
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


def _reduced_chunks(schedule) -> np.ndarray:
    """Per step, the most chunks any one rank reduces into its buffer (0 for a copying step): what the
    optional local-memory term charges. Takes a Schedule or a CompressedSchedule (per pattern, not per
    transfer)."""
    from lightrail.collectives.schedule import Combine

    if hasattr(schedule, "step_pattern"):  # compressed: a pattern's in-chunks per rank, once per pattern
        most = []
        for pattern in schedule.patterns:
            if not pattern.ntransfers:
                most.append(0.0)
                continue
            _, dst, weight = pattern.pairs
            most.append(float(np.bincount(dst, weights=weight).max()))
        reduces = np.asarray(schedule.step_combine) == Combine.REDUCE
        return np.where(reduces, np.asarray(most)[schedule.step_pattern], 0.0)
    steps = len(schedule.step_ptr) - 1
    step_of = np.repeat(np.arange(steps), np.diff(schedule.step_ptr))
    red = schedule.combine == Combine.REDUCE
    n = int(schedule.nranks)
    keys, counts = np.unique(step_of[red].astype(np.int64) * n + schedule.dst[red], return_counts=True)
    out = np.zeros(steps)
    np.maximum.at(out, keys // n, counts)
    return out


def _cat(parts: list[np.ndarray], dtype) -> np.ndarray:
    return np.concatenate(parts).astype(dtype) if parts else np.zeros(0, dtype)


class Engine:
    """Times transfers and schedules on one topology; caches routes and step patterns.

    Parameters
    ----------
    topology : the network state.
    alpha : per-step start-up cost in seconds (software, synchronisation), charged once per step.
    placement : endpoint node of each rank (default: rank r on GPU r).
    endpoint_delay : optional; seconds each step's data waits at its endpoints, plus once more for the
        collective's result (ASTRA-sim's ``endpoint-delay``: charged ``steps + 1`` times there, measured
        side by side in ``benchmarks/vs_astra_sim.py``). Default 0: lightrail's alpha is the start-up.
    local_mem_bw : optional; bytes/s of the local memory a reduction streams through: a step that reduces
        ``c`` chunks into a rank adds ``3 c chunk_bytes / local_mem_bw`` (two reads and one write, as
        ASTRA-sim's ``PacketBundle`` charges it). Default None: not charged.

    Examples
    --------
    Ring AllReduce of 4 GB buffers on 4 GPUs behind one switch of 1 GB/s links takes
    ``2(p-1)·alpha + 2(p-1)/p · N/B`` = 6 s plus six start-ups:

    >>> from lightrail.collectives import generate
    >>> from lightrail.fabric.builders import switch
    >>> Engine(switch(4, bandwidth=1e9), alpha=1e-6).time(generate("allreduce", "ring", 4), 4e9).time_s
    6.000006
    """

    def __init__(self, topology: Topology, *, alpha: float = 0.0, placement: np.ndarray | None = None,
                 endpoint_delay: float = 0.0, local_mem_bw: float | None = None):
        self.topology = topology
        self.alpha = float(alpha)
        self.endpoint_delay = float(endpoint_delay)
        self.local_mem_bw = None if local_mem_bw is None else float(local_mem_bw)
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
        src, dst = self.placement[uniq // n], self.placement[uniq % n]
        if self._ring_exact(src, dst, weight):
            return self._ring_model(src, dst, weight)
        routes = self.route(src, dst)
        load = np.bincount(routes.link, weights=routes.frac * weight[routes.pair],
                           minlength=self.topology.num_links)
        per_byte = np.zeros(len(uniq))
        np.maximum.at(per_byte, routes.pair, load[routes.link] / self.topology.bandwidth[routes.link])
        used = np.flatnonzero(load)
        return StepModel(routes.latency, per_byte, used, load[used] / self.topology.bandwidth[used])

    # -- rings in closed form ------------------------------------------------------------------
    @functools.cached_property
    def _ring(self) -> tuple[np.ndarray, np.ndarray, np.ndarray] | None:
        """For a bidirectional ring of the endpoints alone (the ``ring`` builder: node i linked to i+1 and
        back, nothing else, one latency): link ``i -> i+1`` and link ``i+1 -> i`` per i, and the latency of
        a path of h hops summed hop by hop as :meth:`route` sums it (``hop_latency[h - 1]``). Else None."""
        topo = self.topology
        n = topo.num_nodes
        if n < 3 or topo.num_endpoints != n or topo.num_links != 2 * n or np.ptp(topo.latency) != 0:
            return None
        keys, by_key = self._link_index
        i = np.arange(n, dtype=np.int64)
        want = np.concatenate([i * n + (i + 1) % n, (i + 1) % n * n + i])
        at = np.minimum(np.searchsorted(keys, want), len(keys) - 1)
        if not np.array_equal(keys[at], want):  # 2n distinct wanted links among 2n: exactly the ring
            return None
        links = by_key[at]
        return links[:n], links[n:], np.cumsum(np.full(n, topo.latency[0]))

    def _ring_exact(self, src: np.ndarray, dst: np.ndarray, weight: np.ndarray) -> bool:
        """Whether :meth:`_ring_model` applies and sums exactly as :meth:`route` does: a ring, distinct
        nodes, and weights that are whole chunk counts (their halves and sums exact in floating point)."""
        return (self._ring is not None and len(src) > 0 and not np.any(src == dst)
                and bool(np.all(weight == np.floor(weight))) and float(np.abs(weight).sum()) < 2.0**50)

    def _ring_loads(self, src: np.ndarray, dst: np.ndarray, weight: np.ndarray):
        """Shortest paths on a ring as arcs: pair i goes ``d`` hops clockwise (d < n/2), ``n - d`` hops
        counter-clockwise (d > n/2), or half each way (d = n/2: ECMP splits at the source, then each branch
        has one shortest next hop). Clockwise link i is ``i -> i+1``; counter-clockwise link j is
        ``j+1 -> j``, so both directions' arcs are intervals of link positions, loaded by a difference array
        in O(pairs + n) instead of one frontier pass per hop. Returns the arcs and per-position loads."""
        n = self.topology.num_nodes
        src, dst = np.asarray(src, np.int64), np.asarray(dst, np.int64)
        d = (dst - src) % n
        half = 2 * d == n
        cw, ccw = (2 * d < n) | half, (2 * d > n) | half
        share = np.where(half, weight / 2, weight)
        arcs = []
        for take, start, length in ((cw, src, d), (ccw, dst, n - d)):
            a, k, w = start[take], length[take], share[take]
            diff = np.bincount(a, weights=w, minlength=2 * n + 1) - np.bincount(a + k, weights=w, minlength=2 * n + 1)
            run = np.cumsum(diff)
            arcs.append((take, a, k, run[:n] + run[n:2 * n]))
        return arcs

    def _ring_model(self, src: np.ndarray, dst: np.ndarray, weight: np.ndarray) -> StepModel:
        """:meth:`_model` on a ring in O(pairs + n log n): arc loads, then a sparse-table range maximum of
        ``load / bandwidth`` over each arc. Equal to the hop-by-hop routing (tests compare both)."""
        cw_links, ccw_links, hop_latency = self._ring
        per_byte = np.zeros(len(src))
        latency = np.zeros(len(src))
        used, used_per_byte = [], []
        for (take, a, k, load), links in zip(self._ring_loads(src, dst, weight), (cw_links, ccw_links),
                                             strict=True):
            if not len(a):
                continue
            at = np.flatnonzero(load)
            used.append(links[at])
            used_per_byte.append(load[at] / self.topology.bandwidth[links[at]])
            ratio = np.tile(load / self.topology.bandwidth[links], 2)
            level = np.floor(np.log2(k)).astype(np.int64)
            best = np.full(len(a), -np.inf)
            table = ratio
            for j in range(int(level.max()) + 1):  # table[i] = max(ratio[i : i + 2^j])
                at = level == j
                best[at] = np.maximum(table[a[at]], table[a[at] + k[at] - (1 << j)])
                table = np.maximum(table[:-(1 << j)], table[1 << j:]) if (2 << j) <= len(ratio) else table
            per_byte[take] = np.maximum(per_byte[take], best)
            latency[take] = np.maximum(latency[take], hop_latency[k - 1])
        return StepModel(latency, per_byte, _cat(used, np.int64), _cat(used_per_byte, float))

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
        src, dst = self.placement[uniq // n], self.placement[uniq % n]
        if self._ring_exact(src, dst, w):
            load = np.zeros(self.topology.num_links)
            for (*_, arc_load), links in zip(self._ring_loads(src, dst, w), self._ring[:2], strict=True):
                load[links] = arc_load
            return load
        routes = self.route(src, dst)
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

    def time(self, schedule: Schedule, size: float, *, profile: list[StepModel] | None = None,
             splits: int = 1) -> CollectiveTiming:
        """Time ``schedule`` with ``size`` bytes in each rank's buffer.

        ``splits`` k cuts the buffer into k chunks of ``size / k`` that run the whole schedule one after another:
        k x the time of ``size / k`` (k x the start-ups), ``step_times`` the k runs' steps in turn. This is
        ASTRA-sim's ``preferred-dataset-splits`` with ``active-chunks-per-dimension`` 1 on one dimension
        (``Sys::generate_collective``: one ``StreamBaseline`` per chunk, run one at a time per queue).
        """
        if isinstance(splits, bool) or not isinstance(splits, (int, np.integer)) or splits < 1:
            from lightrail.errors import UnsupportedError

            raise UnsupportedError(f"splits={splits!r} is not a whole number of chunks", field="splits",
                                   fix="use 1 (the whole buffer at once) or more")
        models = self.profile(schedule) if profile is None else profile
        cb = schedule.chunk_bytes(size / splits)
        cache: dict[int, float] = {}
        for m in models:
            if id(m) not in cache:
                cache[id(m)] = m.time(cb, self.alpha)
        times = np.array([cache[id(m)] for m in models])
        if self.endpoint_delay:
            times = times + self.endpoint_delay
        if self.local_mem_bw:
            times = times + 3.0 * cb * _reduced_chunks(schedule) / self.local_mem_bw
        with np.errstate(over="ignore"):  # steps of ~1e300 s (a 1e-300 b/s link) sum to inf, JSON null: intended
            total = float(times.sum()) + self.endpoint_delay  # the result's endpoint delay (0 by default)
        if splits > 1:
            total, times = splits * total, np.tile(times, int(splits))
        return CollectiveTiming(schedule.name, float(size), total, times)

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

    def time_compressed(self, schedule, size: float, *, profile: list[StepModel] | None = None,
                        splits: int = 1) -> CollectiveTiming:
        """:meth:`time` of a ``CompressedSchedule``: equals ``time(schedule.expand(), size, splits=splits)``."""
        return self.time(schedule, size, profile=self.profile_compressed(schedule) if profile is None else profile,
                         splits=splits)

    # -- what an op keeps busy (flow-level sharing) --------------------------------------------------
    @staticmethod
    def busy(models: list[StepModel], chunk_bytes: float) -> tuple[np.ndarray, np.ndarray]:
        """Links the steps ``models`` cross, and the seconds each is fully busy over them at ``chunk_bytes``
        per chunk: what :mod:`lightrail.sharing` charges an op. Steps sharing one model are summed once."""
        seen: dict[int, list] = {}
        for m in models:
            seen.setdefault(id(m), [m, 0])[1] += 1
        parts = [(m.link, m.link_per_byte * (n * chunk_bytes)) for m, n in seen.values()
                 if m.link is not None and len(m.link)]
        if not parts:
            return np.zeros(0, np.int64), np.zeros(0)
        links, seconds = np.concatenate([p[0] for p in parts]), np.concatenate([p[1] for p in parts])
        uniq, inv = np.unique(links, return_inverse=True)
        return uniq, np.bincount(inv, weights=seconds, minlength=len(uniq))

    @staticmethod
    def wire(models: list[StepModel], chunk_bytes: float) -> float:
        """Seconds of the steps ``models`` spent moving bytes: per step, the slowest pair's bytes over its
        bottleneck (the rest of a step's time is start-up and hop latency)."""
        seen: dict[int, list] = {}
        for m in models:
            seen.setdefault(id(m), [m, 0])[1] += 1
        return float(sum(n * chunk_bytes * float(np.max(m.per_byte, initial=0.0)) for m, n in seen.values()))

    def op_cost(self, schedule, size: float, *, profile: list[StepModel] | None = None) -> OpCost:
        """:meth:`time` of a schedule (or a ``CompressedSchedule``) with the links it keeps busy."""
        compressed = hasattr(schedule, "step_pattern")
        if profile is None:
            profile = self.profile_compressed(schedule) if compressed else self.profile(schedule)
        timing = self.time(schedule, size, profile=profile)
        chunk = schedule.chunk_bytes(size)
        return OpCost(timing.time_s, *self.busy(profile, chunk), bandwidth_s=self.wire(profile, chunk))

    def transfer_cost(self, src, dst, nbytes) -> OpCost:
        """:meth:`transfer_time` with the links the transfers keep busy."""
        src = np.asarray(src)
        model = self.step_model(src, dst, np.broadcast_to(np.asarray(nbytes, float), src.shape))
        return OpCost(model.time(1.0, self.alpha), *self.busy([model], 1.0), bandwidth_s=self.wire([model], 1.0))
