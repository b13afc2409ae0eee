"""The rail switches executing a Plan during a simulated iteration: circuit state (one device per rail, one port
per server), the configuration each rail holds, the leases stages hold, and when a change may start (its ports
drained, leases revoked) under the Plan's policy."""

from __future__ import annotations

import numpy as np

from lightrail.control.opus import Requirement
from lightrail.control.plan import Mode, Plan
from lightrail.fabric.builders import sorted_unique
from lightrail.fabric.circuits import CircuitState
from lightrail.fabric.params import RailFabric

__all__ = ["Rails"]


def _rail_runs(rail: np.ndarray) -> np.ndarray:
    """Where each run of equal values of ``rail`` starts (``rail`` not empty). The planner's circuits are sorted by
    rail, and the ports a change switches are its circuits then their old peers: a few runs per rail at most."""
    return np.flatnonzero(np.concatenate([[True], rail[1:] != rail[:-1]]))


class Rails:
    """The rail switches executing a Plan: circuit state (:class:`CircuitState`, one device per rail,
    one port per server), the configuration each rail holds, and the leases stages hold."""

    def __init__(self, plan: Plan | None, fabric: RailFabric, layout):
        shape = (layout.gpus_per_server, layout.servers)
        self.plan, self.fabric = plan, fabric
        self.policy = plan.policy if plan is not None else None
        self.state = CircuitState(*shape, fabric.delay)
        self.holds: list[str | None] = [None] * shape[0]  # configuration each rail holds (whole switch)
        self.tx_lease, self.rx_lease = np.full(shape, -1, np.int64), np.full(shape, -1, np.int64)
        self.leased: dict[int, str] = {}  # stage -> configuration name it holds a lease on
        self.acks = [0] * layout.pp  # per stage, leases that ended (each holder acks its revoke: a request)
        self.reconfigs: list[tuple[int, float, float, int, str]] = []  # rail, start, end, ports, configuration
        self._rows: dict[str, list[np.ndarray]] = {}  # configuration -> its rows, one object per rail
        self._split: dict = {}  # ids of a requirement's circuit arrays -> (the arrays, its circuits per rail)
        self.missing: tuple = (np.zeros(0, np.int64),) * 3
        """The (rail, tx, rx) circuits the last partial reconfiguration lit (those its requirement missed)."""
        self.drain_matters = False
        """Whether a switch has waited for its ports to drain (or a lease's revoke): until then, the same run with
        ``fabric.drain`` off would have started every switch at the same time."""
        self.skip_matters = False
        """Whether a whole-switch rewrite has happened whose op's circuits were all present already (one that
        ``skip_present`` skips): until then, the same run with ``skip_present`` on would have made every decision
        alike (its other branches are the same, and what a rail holds is read only where it skips)."""

    # -- leases ----------------------------------------------------------------------------------------
    def has_lease(self, stage: int, req: Requirement) -> bool:
        rail, tx, rx = req.circuits
        return self.leased.get(stage) == req.phase and self.state.all_present(rail, tx, rx)

    def take_lease(self, stage: int, req: Requirement) -> None:
        self._drop(stage)
        rail, tx, rx = req.circuits
        self.tx_lease[rail, tx] = stage
        self.rx_lease[rail, rx] = stage
        self.leased[stage] = req.phase

    def _drop(self, stage: int) -> None:
        """The stage's lease ends: revoked, or it moved on to another phase (in the runtime that lease is revoked
        when the next phase needs its ports; either way its holders ack once)."""
        if self.leased.pop(stage, None) is not None:
            self.acks[stage] += 1
        self.tx_lease[self.tx_lease == stage] = -1
        self.rx_lease[self.rx_lease == stage] = -1

    def _revoke(self, tx_ports, rx_ports) -> None:
        if not self.leased:  # no lease anywhere (a lease's ports are marked only while it is in ``leased``)
            return
        held = np.bincount(np.concatenate([self.tx_lease[tx_ports], self.rx_lease[rx_ports]]) + 1)  # -1: none
        for stage in (np.flatnonzero(held[1:])).tolist():
            self._drop(stage)

    def _free(self, tx_ports, rx_ports, decision: float) -> np.ndarray:
        """Per rail, when the controller may switch these (rail, port) arrays: their last traffic's release
        has arrived, and a lease on them was revoked and acknowledged (a group's lease has holders besides
        the asking rank, even when its own stage leased it: the revoke is a round trip)."""
        rails = len(self.holds)
        if not self.fabric.drain:
            return np.zeros(rails)
        half, revoke = self.fabric.rtt / 2, self.fabric.revoke
        busy, held = np.zeros(rails), np.zeros(rails, bool)
        # provisioned, holders yield their leases as they announce their next phase; with no lease anywhere, no
        # port is marked (a lease's ports are marked only while it is in ``leased``): the leases are not looked at
        leases = self.policy.mode is not Mode.PROVISIONED and bool(self.leased)
        for (rail, port), when, lease in ((tx_ports, self.state.tx_busy, self.tx_lease),
                                          (rx_ports, self.state.rx_busy, self.rx_lease)):
            if not len(rail):
                continue
            starts = _rail_runs(rail)  # reduced run by run, then the few runs per rail (no ufunc.at over ports)
            flat = rail * when.shape[1] + port
            np.maximum.at(busy, rail[starts], np.maximum.reduceat(when.reshape(-1)[flat], starts))
            if leases:
                np.logical_or.at(held, rail[starts], np.logical_or.reduceat(lease.reshape(-1)[flat] >= 0, starts))
        if self.policy.mode is Mode.PROVISIONED:
            return busy + half
        # revoke: pushed at the decision, the lease ends a revoke round trip later (measured: the holders' acks);
        # a holder inside an op acks when it ends
        return np.where(held, np.maximum(decision + revoke, busy + revoke / 2), busy + half)

    def _free_rail(self, r: int, decision: float) -> float:
        """:meth:`_free` of every port of rail ``r`` (a whole-switch rewrite), over the rail's rows at once."""
        if not self.fabric.drain:
            return 0.0
        state, half, revoke = self.state, self.fabric.rtt / 2, self.fabric.revoke
        busy = state.device_busy(r)  # max(0, tx_busy[r].max(), rx_busy[r].max()), without applying the traffic
        if self.policy.mode is Mode.PROVISIONED:
            return busy + half
        held = bool(self.leased) and bool((self.tx_lease[r] >= 0).any() or (self.rx_lease[r] >= 0).any())
        return max(decision + revoke, busy + revoke / 2) if held else busy + half

    def _revoke_rail(self, r: int) -> None:
        """:meth:`_revoke` of every port of rail ``r``."""
        if not self.leased:
            return
        held = np.bincount(np.concatenate([self.tx_lease[r], self.rx_lease[r]]) + 1)
        for stage in np.flatnonzero(held[1:]).tolist():
            self._drop(stage)

    # -- switching -------------------------------------------------------------------------------------
    def ensure(self, req: Requirement, decision: float) -> float:
        """Make ``req``'s circuits present; a change starts no earlier than ``decision`` (the controller's
        decision plus its command latency) nor before its ports are free. Returns when they are lit."""
        rail, tx, rx = req.circuits
        if not len(rail) or not self.fabric.circuits:
            return 0.0
        if self.policy.partial:
            self._ports(req, decision)
        else:
            self._switch(req, decision)
        return self.state.lit_at(rail, tx, rx)

    def occupy(self, req: Requirement, end: float) -> None:
        rail, tx, rx = req.circuits
        self.state.occupy(rail, tx, rx, end)

    def _switch(self, req: Requirement, decision: float) -> None:
        """The original Opus: rewrite the whole rail switch to the op's configuration (drain the rail)."""
        by_rail = self._by_rail(req)
        if ((self.policy.skip_present or all(self.holds[r] == req.phase for r, _, _ in by_rail))
                and self.state.all_present(*req.circuits)):
            return  # every rail holds the phase (or may skip) and has the circuits: what the loop finds rail by rail
        for r, tx, rx in by_rail:
            held = self.holds[r] == req.phase
            if (held or self.policy.skip_present) and self.state.all_present(r, tx, rx):
                continue  # held and present, or present and skipped (the circuits are looked at only then)
            new = self._configuration(req.phase, r)
            if self.state.holds(r, new):  # nothing to switch on this rail
                self.holds[r] = req.phase
                continue
            if not held and not self.skip_matters and self.state.all_present(r, tx, rx):
                self.skip_matters = True  # rewritten, where skip_present would have kept the rail as it is
            free = self._free_rail(r, decision)  # drain the whole rail
            self.drain_matters = self.drain_matters or free > decision
            start = max(decision, free)
            end, changed = self.state.rewrite(r, new, start)
            self._revoke_rail(r)
            self.holds[r] = req.phase
            self.reconfigs.append((int(r), start, end, changed, req.phase))

    def _configuration(self, phase: str, r: int) -> np.ndarray:
        """Rail ``r``'s row of the plan's configuration ``phase``, the same array object each time (so the circuit
        state remembers what it knows of it)."""
        if phase not in self._rows:
            self._rows[phase] = list(self.plan.configurations[phase])
        return self._rows[phase][r]

    def _by_rail(self, req: Requirement) -> list[tuple[int, np.ndarray, np.ndarray]]:
        """``req``'s circuits rail by rail (rails in order): split once per requirement (the planner's are
        reused op after op)."""
        rail, tx, rx = req.circuits
        key = (id(rail), id(tx), id(rx))
        if key not in self._split:
            per_rail = [(r, tx[rail == r], rx[rail == r]) for r in sorted_unique(rail).tolist()]
            self._split[key] = ((rail, tx, rx), per_rail)
        return self._split[key][1]

    def _ports(self, req: Requirement, decision: float) -> None:
        """Partial reconfiguration: only ports whose circuits change go dark, each rail on its own."""
        rail, tx, rx = req.circuits
        if self.state.known_present(rail, tx, rx):  # nothing to switch (most ops: the circuits stay up)
            return
        switched = self.state.switched_ports(rail, tx, rx)
        (tx_rail, tx_port), (rx_rail, rx_port), (m_rail, _, _) = switched
        if not len(m_rail):
            return
        self.missing = switched[2]
        free = self._free((tx_rail, tx_port), (rx_rail, rx_port), decision)
        self.drain_matters = self.drain_matters or bool(np.any(free[m_rail] > decision))
        start = np.maximum(decision, free)
        self.state.apply(rail, tx, rx, start, switched=switched)
        self._revoke((tx_rail, tx_port), (rx_rail, rx_port))
        counts = np.bincount(m_rail, minlength=len(self.holds))
        for r in np.flatnonzero(counts):
            self.reconfigs.append((int(r), float(start[r]), float(start[r]) + self.fabric.delay, int(counts[r]),
                                   req.phase))
