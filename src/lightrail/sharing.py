"""Flow-level sharing: ops in flight at the same time share every link they both cross (DESIGN.md "Time model").

An op in flight is one flow: ``seconds``, its duration alone on the fabric (what :class:`lightrail.timing.Engine`
gives it), of which ``wire_s`` is moving bytes (the rest is latency: start-ups and hops), and per link it crosses
``busy_s``, the seconds the op keeps that link fully busy when it runs alone (so ``busy_s <= wire_s``). The op
first moves its bytes, sharing links: at rate ``r`` (1: as fast as alone) it uses the fraction ``r * busy_s /
wire_s`` of each of its links; the uses on a link sum to at most 1, and no op runs faster than alone. Then its
latency runs, on no link: two equal ops at once take ``latency + 2 * wire_s``, and ops that are latency-bound do
not slow each other. Rates are
max-min fair in the bandwidth each op gets on its own bottleneck link, found by progressive filling
(:func:`fair_rates`): shares rise together; when a link fills, the ops crossing it freeze; an op that reaches its
rate alone freezes too, leaving the rest to the others. This is the bandwidth-sharing model of
flow-level simulators (SimGrid's ``lmm`` max-min solver, ``src/kernel/lmm/maxmin.cpp``, validated against packet
level in Velho et al., ACM TOMACS 23(4), 2013), applied to whole ops rather than single transfers.

Rates change only when an op starts or ends, and only for the ops connected to it through shared links (its
component): max-min rates of other components do not depend on it, so they keep theirs.
"""

from __future__ import annotations

import heapq
from collections.abc import Hashable
from dataclasses import dataclass, field

import numpy as np

__all__ = ["OpCost", "FairShare", "fair_rates"]

_EPS = 1e-12


@dataclass(frozen=True)
class OpCost:
    """An op's time alone on the fabric and the links it keeps busy: what flow-level sharing needs."""

    seconds: float
    links: np.ndarray = field(default_factory=lambda: np.zeros(0, np.int64))
    """Ids of the links (or link classes) the op crosses."""
    busy_s: np.ndarray = field(default_factory=lambda: np.zeros(0))
    """Per link: seconds the op keeps it fully busy when it runs alone (at most ``wire_s``)."""
    bandwidth_s: float | None = None
    """Seconds of ``seconds`` spent moving bytes (default: the busiest link's ``busy_s``)."""

    @property
    def wire_s(self) -> float:
        """The part of ``seconds`` that moving bytes takes alone; the rest is latency."""
        wire = self.bandwidth_s if self.bandwidth_s is not None else float(np.max(self.busy_s, initial=0.0))
        return min(max(wire, float(np.max(self.busy_s, initial=0.0))), float(self.seconds))

    def __float__(self) -> float:
        return float(self.seconds)


def fair_rates(flow: np.ndarray, link: np.ndarray, use: np.ndarray, nflows: int) -> np.ndarray:
    """Max-min fair rates of ``nflows`` flows, each at most 1: row k says flow ``flow[k]`` uses the fraction
    ``use[k]`` of link ``link[k]`` at rate 1 (links are compact ids ``0..L-1``; every flow has a row).

    Fairness is on the share of bandwidth each flow gets on its own bottleneck link (its largest ``use``,
    ``peak``): shares rise together from 0; a flow stops at ``peak`` (its rate alone), and the flows on a
    link that fills stop there. Progressive filling, one round per bottleneck level.

    >>> fair_rates(np.array([0, 1]), np.array([0, 0]), np.array([1.0, 1.0]), 2)  # two flows on one link
    array([0.5, 0.5])
    >>> fair_rates(np.array([0, 1]), np.array([0, 0]), np.array([1.0, 0.25]), 2)  # one needs little: the rest
    array([0.75, 1.  ])
    """
    peak = np.zeros(nflows)
    np.maximum.at(peak, flow, use)
    coef = np.divide(use, peak[flow], out=np.zeros(len(use)), where=peak[flow] > 0)  # per unit of its share
    share = np.zeros(nflows)
    frozen = peak <= 0
    nlinks = int(link.max()) + 1 if len(link) else 0
    room = np.ones(nlinks)
    level = 0.0
    while not frozen.all():
        moving = ~frozen
        active = moving[flow]
        load = np.bincount(link[active], weights=coef[active], minlength=nlinks)
        loaded = load > 0
        step = peak[moving].min() - level
        if loaded.any():
            step = min(step, (room[loaded] / load[loaded]).min())
        level += step
        room -= step * load
        share[moving] = level
        full = loaded & (room <= _EPS * np.maximum(1.0, load))
        frozen |= peak <= level * (1.0 + _EPS)
        frozen[flow[active & full[link]]] = True
    rate = np.ones(nflows)
    moving = peak > 0
    rate[moving] = np.minimum(share[moving] / peak[moving], 1.0)
    return rate


@dataclass
class _Flow:
    links: np.ndarray
    use: np.ndarray
    remaining: float
    """Seconds of work left at rate 1, as of ``since``: bytes to move (while ``links``), then the latency."""
    tail: float
    """Latency that runs after the bytes have moved."""
    since: float
    seq: int
    """Start order: ties between ops are broken by it, so runs are deterministic."""
    rate: float = 1.0
    version: int = 0


def _flow_parts(cost: OpCost, fair: bool) -> tuple:
    """(links, use per link, seconds of bytes, seconds of latency, links as a list) of a flow of ``cost``: worked
    out once per OpCost (kept in its ``__dict__``, not a field; the simulator starts the same costs op after op).
    The arrays are shared by the flows of one cost and never written: a flow's release replaces its links."""
    cache = cost.__dict__.setdefault("_flow_parts", {})
    if fair not in cache:
        seconds = max(float(cost.seconds), 0.0)
        wire = cost.wire_s if fair else 0.0
        busy = np.asarray(cost.busy_s, float)
        keep = busy > 0 if wire > 0 else np.zeros(len(busy), bool)
        links = np.asarray(cost.links, np.int64)[keep]
        cache[fair] = (links, np.minimum(busy[keep] / wire, 1.0) if wire > 0 else busy[keep],
                       wire if keep.any() else seconds, seconds - wire if keep.any() else 0.0, links.tolist())
    return cache[fair]


class FairShare:
    """The ops in flight and their rates; when each will finish if nothing else starts or ends.

    ``fair=False`` gives every op its rate alone (no sharing: ``engine.sharing: none``).

    >>> from lightrail.sharing import OpCost, FairShare
    >>> share = FairShare()
    >>> link = np.array([0])
    >>> share.start("a", OpCost(1.0, link, np.array([1.0])), 0.0)
    >>> share.start("b", OpCost(1.0, link, np.array([1.0])), 0.0)
    >>> share.next_finish()  # both at half rate: the first finishes at 2 s
    (2.0, 'a')
    """

    def __init__(self, *, fair: bool = True):
        self.fair = fair
        self._flows: dict[Hashable, _Flow] = {}
        self._by_link: dict[int, set] = {}
        self._heap: list[tuple[float, int, Hashable, int]] = []
        self._counter = 0

    def __len__(self) -> int:
        return len(self._flows)

    def start(self, key: Hashable, cost: OpCost, now: float) -> None:
        """Op ``key`` starts at ``now``; the rates of the ops it shares links with change."""
        if key in self._flows:
            raise KeyError(f"op {key!r} is already in flight")
        links, use, remaining, tail, link_list = _flow_parts(cost, self.fair)
        flow = _Flow(links, use, remaining, tail, now, self._counter)
        self._flows[key] = flow
        if not len(flow.links):
            self._schedule(key, flow)
            return
        alone = True
        for link in link_list:
            users = self._by_link.setdefault(link, set())
            alone = alone and not users
            users.add(key)
        if alone:  # its links are free: as fast as alone, and nobody else's rate changes
            self._schedule(key, flow)
        else:
            self._rerate(self._component([key]), now)

    def finish(self, key: Hashable, now: float) -> bool:
        """Op ``key``'s current phase ends at ``now`` (when :meth:`next_finish` said): returns True if the op has
        ended, False if its bytes have moved and its latency runs on (it will come up again)."""
        flow = self._flows[key]
        if len(flow.links):
            self._release(key, flow, now)
            if flow.tail > 0:
                flow.remaining, flow.tail, flow.since, flow.rate = flow.tail, 0.0, now, 1.0
                self._schedule(key, flow)
                return False
        del self._flows[key]
        return True

    def next_finish(self) -> tuple[float, Hashable] | None:
        """When the next op's phase ends at the current rates, and which (None if nothing is in flight)."""
        while self._heap:
            when, _, key, version = self._heap[0]
            flow = self._flows.get(key)
            if flow is not None and flow.version == version:
                return when, key
            heapq.heappop(self._heap)
        return None

    def projected_end(self, key: Hashable) -> float:
        """When op ``key`` ends if no op starts or ends before."""
        flow = self._flows[key]
        return flow.since + flow.remaining / flow.rate + flow.tail

    # -- internals ---------------------------------------------------------------------------------------
    def _schedule(self, key: Hashable, flow: _Flow) -> None:
        flow.version += 1
        heapq.heappush(self._heap, (flow.since + flow.remaining / flow.rate, self._counter, key, flow.version))
        self._counter += 1

    def _release(self, key: Hashable, flow: _Flow, now: float) -> None:
        """The op's links go to the others."""
        neighbours = set()
        for link in flow.links.tolist():
            users = self._by_link[link]
            users.discard(key)
            if users:
                neighbours |= users
            else:
                del self._by_link[link]
        flow.links = flow.links[:0]
        if neighbours:
            self._rerate(self._component(neighbours), now)

    def _component(self, keys) -> list:
        """The ops connected to ``keys`` through shared links (themselves included)."""
        seen, todo = set(keys), list(keys)
        while todo:
            for link in self._flows[todo.pop()].links.tolist():
                for other in self._by_link[link]:
                    if other not in seen:
                        seen.add(other)
                        todo.append(other)
        return sorted(seen, key=lambda k: self._flows[k].seq)

    def _rerate(self, keys: list, now: float) -> None:
        flows = [self._flows[k] for k in keys]
        for f in flows:  # progress so far, at the old rates
            f.remaining = max(0.0, f.remaining - f.rate * (now - f.since))
            f.since = now
        if len(flows) == 1:  # alone again
            flows[0].rate = 1.0
            self._schedule(keys[0], flows[0])
            return
        sizes = [len(f.links) for f in flows]
        _, compact = np.unique(np.concatenate([f.links for f in flows]), return_inverse=True)
        rates = fair_rates(np.repeat(np.arange(len(flows)), sizes), compact,
                           np.concatenate([f.use for f in flows]), len(flows))
        for k, f, r in zip(keys, flows, rates.tolist(), strict=True):
            if r != f.rate or f.version == 0:
                f.rate = max(r, _EPS)
                self._schedule(k, f)
