"""How the controller switches circuits and grants groups (a mixin of ``Controller``): which ports a change
moves and who uses them, the schedule of pending groups, revoking leases, switching a device, settling and
granting; joining, leaving and waiting on a group. Semantics: see ``core.py``'s docstring.
"""

from __future__ import annotations

import asyncio
from collections.abc import Callable

from lightrail.errors import InfeasibleError, ScenarioError
from lightrail.runtime.controller.groups import _EPS, _NEVER, GroupState, GroupStatus, Superseded, Waiter
from lightrail.runtime.ocs import changed_ports, moving_ports


class Switching:
    """Circuit switching and group grants, for Controller (its state lives there)."""

    def configure(self, device: str, changes: dict[int, int | None], *, job: str | None = None) -> dict:
        """Admin change of one device's circuits (validated; nothing changes on error). A change to a port
        still switching is refused, naming the port and when to retry."""
        driver = self._device(device, field="device")
        for port in set(changes) | {o for o in changes.values() if o is not None}:
            self._check_port(device, port, field=f"changes.{port}")
        after = driver.validate(changes)
        ins, outs = changed_ports(driver.state(), after)
        for port in sorted(ins | outs):  # every port the change switches, not only the ones it names
            owner = self.owner.get((device, port))
            if owner is not None and owner != job:
                raise InfeasibleError(f"port {port} on {device} is owned by job {owner!r}", field=f"changes.{port}",
                                      fix="only the owning job's ports can be switched (give job=...)")
        for i, o in sorted(changes.items()):
            for port in (i, o):
                if o is not None and (device, port) in self.dead:
                    raise InfeasibleError(f"port {port} on {device} is dead", field=f"changes.{i}",
                                          fix=f"re-plan without it (or POST /devices/{device}/ports/{port}/repair)")
        now = self.clock()
        steered = set().union(*moving_ports(driver.state(), after))
        for port in sorted(ins | outs):
            until = self._switching_until(device, [port])
            if until > now + _EPS:
                why = "is still switching" if self.switching.get((device, port), 0.0) > now + _EPS else \
                    f"may carry traffic (rank {self.unsynced[(device, port)][1]} of job " \
                    f"{self.unsynced[(device, port)][0]!r} has not resumed since the controller restarted)"
                raise InfeasibleError(f"port {port} on {device} {why} ({until - now:.3f} s left)",
                                      field=f"changes.{port}", fix=f"retry after {until - now:.3f} s")
        hot_in, hot_out = self._used(device, ins, outs, GroupState.active)
        if hot_in or hot_out:
            port = min(hot_in | hot_out)
            raise InfeasibleError(f"port {port} on {device} carries traffic", field=f"changes.{port}",
                                  fix="wait until its group is released")
        switched = steered
        if ins | outs:
            wall = self.wall()
            self.store.switch({device: after}, {(device, p): wall + driver.delay_s for p in switched},
                              {f"reconfigurations:{device}": 1, f"circuit_changes:{device}": len(ins)})  # write first
        done = driver.apply(changes, now)
        if ins | outs:
            self._mark_switching(device, switched, done)
            self.applies.append({"device": device, "group": None, "job": job, "phase": "admin", "at": now,
                                 "changed_inputs": sorted(ins), "changed_outputs": sorted(outs),
                                 "busy_inputs": [], "busy_outputs": []})
            self.log("configure", device=device, job=job, delay_s=done - now)
            self._schedule()  # a group lit by this change waits for its deadline
        return {"device": device, "completes_in_s": done - now, "circuits": driver.state()}

    # -- scheduling -------------------------------------------------------------------------------------
    def _used(self, device: str, ins: set[int], outs: set[int],
              busy: Callable[[GroupState], bool]) -> tuple[set[int], set[int]]:
        """Of ``ins`` and ``outs``, the ports a group for which ``busy(group)`` holds uses (as an input, an
        output), found through the port index: only the groups on those ports are looked at."""
        hot_in: set[int] = set()
        hot_out: set[int] = set()
        verdict: dict[GroupState, bool] = {}
        for p in ins | outs:
            for h in self.port_groups.get((device, p), ()):
                self.visits += 1
                h_in, h_out = h.ports()[device]
                as_in, as_out = p in ins and p in h_in, p in outs and p in h_out
                if not (as_in or as_out):
                    continue
                if h not in verdict:
                    verdict[h] = busy(h)
                if verdict[h]:
                    if as_in:
                        hot_in.add(p)
                    if as_out:
                        hot_out.add(p)
        return hot_in, hot_out

    def _hot(self, device: str, changes: dict[int, int | None], busy) -> tuple[set[int], set[int]]:
        """Inputs and outputs that ``changes`` would switch while a group with ``busy(group)`` uses them."""
        driver = self.devices[device]
        ins, outs = changed_ports(driver.state(), driver.validate(changes))
        return self._used(device, ins, outs, busy)

    def _switching_until(self, device: str, ports) -> float:
        """When the last switch under way on any of ``ports`` completes (a switch marks the ports it steers,
        ``moving_ports``, not those it only darkens), or, after a restart, when a port of a rank that has not
        resumed may be switched (0: now)."""
        until = max((self.switching.get((device, p), 0.0) for p in ports), default=0.0)
        if self.unsynced and self.clock() < self.resync_until and any((device, p) in self.unsynced for p in ports):
            until = max(until, self.resync_until)
        return until

    def _grant_at_once(self, g: GroupState) -> bool:
        """Grant ``g``, whose members all acquired just now, if it is the only group that may be ready and it is
        lit and settled: what :meth:`_schedule` would do, without its pass over the ready set (the hot path of a
        lit per-op round at 1,024 ranks, issue 17). False (nothing done) in every other case."""
        if self._ready or self.dead or g.status != GroupStatus.IDLE or len(g.acquirers) != len(g.members) \
                or not self._settled(g):
            return False
        self.counters["grants_without_change"] += 1
        self._grant(g)
        return True

    def _settled(self, g: GroupState) -> bool:
        """``g``'s circuits are lit, and no change on its ports is still settling: it may be granted now."""
        return not self._changes(g) and self._lit_at(g) <= self.clock() + _EPS

    def _lit_at(self, g: GroupState) -> float:
        """When every port of ``g``'s circuits has settled (0: they have)."""
        if self.settled_by <= self.clock():
            return 0.0  # nothing is switching anywhere (the common case: no lookup per port)
        return max((self.switching.get(k, 0.0) for k in g.port_keys()), default=0.0)

    def _mark_switching(self, device: str, ports, done: float) -> None:
        """Record when the switch of ``ports`` completes (one entry per port: bounded by the fabric)."""
        for p in ports:
            self.switching[(device, p)] = max(self.switching.get((device, p), 0.0), done)
        self.settled_by = max(self.settled_by, done)

    def _wake_at(self, t: float) -> None:
        """Run the scheduler again at ``t`` (a port's switch completes then; no request may come)."""
        if t in self._wakes or self._off_loop(lambda: self._wake_at(t)):
            return
        self._wakes.add(t)

        async def wake() -> None:
            try:
                await self.sleep(max(0.0, t - self.clock()))
            finally:
                self._wakes.discard(t)
            self._schedule()

        task = asyncio.get_running_loop().create_task(wake())
        self._tasks.add(task)
        task.add_done_callback(self._tasks.discard)

    def _changes(self, g: GroupState) -> dict[str, dict[int, int | None]]:
        """Per device, the change set that lights ``g``'s circuits (darkening inputs on its outputs)."""
        out = {}
        for device, circuits in g.circuits.items():
            driver = self.devices[device]
            state = driver.lit()
            for i, o in circuits.items():
                if state.get(i) != o:
                    break
            else:
                continue  # all lit (so no other input on its outputs): skip if present, the common case
            by_output = {o: i for i, o in state.items()}
            changes: dict[int, int | None] = {}
            for i, o in circuits.items():
                other = by_output.get(o)
                if other is not None and other != i and other not in circuits:
                    changes[other] = None
                if state.get(i) != o:
                    changes[i] = o
            if driver.duplex:  # darkening one direction of a duplex pair darkens both
                for i in [i for i, o in changes.items() if o is None]:
                    peer = state.get(i)
                    if peer is not None and peer not in circuits:
                        changes[peer] = None
            if changes:
                out[device] = changes
        return out

    def _soft(self, g: GroupState) -> bool:
        """Lit for members that all asked but have not all acquired yet (prepared): only a group whose
        members all acquired may take its ports, so two prepared groups never switch the fabric back
        and forth."""
        return (g.status == GroupStatus.IDLE and len(g.intents) == len(g.members)
                and len(g.acquirers) < len(g.members) and not self._changes(g))

    def _schedule(self) -> None:
        """Light every group whose members all asked and whose change switches no busy or still-switching
        port (the switch changes at once, the group is granted after the delay); grant the lit groups
        whose members all acquired and whose ports have settled."""
        if not self._ready or self._off_loop(self._schedule):
            return  # nothing may be ready, or another thread asked: the loop runs it
        self.visits += len(self._ready)
        ready = [g for g in self._ready if g.ready() and self.groups.get((g.job, g.key)) is g]
        self._ready = set(ready)
        if not ready:
            return
        if len(ready) > 1:
            ready.sort(key=lambda g: (g.ready_since, g.order))
        now = self.clock()
        for g in ready:
            if not g.ready():
                continue
            if self.dead and g.port_keys() & self.dead:
                d, p = min(g.port_keys() & self.dead)
                self._fail_waiters(g, self._dead_error(d, p))
                continue
            changes = self._changes(g)
            acquired = len(g.acquirers) == len(g.members)
            if not changes:
                if acquired:
                    lit_at = self._lit_at(g)
                    if lit_at > now + _EPS:  # lit, but a change on its ports (an admin's) is still settling
                        self._wake_at(lit_at)
                        continue
                    self.counters["grants_without_change"] += 1
                    self._grant(g)
                continue  # lit; its prepared members will acquire it
            busy = GroupState.active if acquired else (lambda h: h.active() or self._soft(h))
            if any(any(self._hot(d, c, busy)) for d, c in changes.items()):
                if not acquired and any(any(self._hot(d, c, self._soft)) for d, c in changes.items()):
                    continue  # lit for another prepared group: wait (no thrash)
                self._revoke_for(g, changes)
                continue  # a port it switches carries traffic: wait (for the release, or the revoked leases)
            until = max(self._switching_until(d, set().union(*changed_ports(self.devices[d].state(),
                                                                              self.devices[d].validate(c))))
                        for d, c in changes.items())
            if until > now + _EPS:
                self._wake_at(until)  # a port it changes is still being steered: never switch mid-switch
                continue
            self._switch(g, changes)

    def _revoke_for(self, g: GroupState, changes: dict[str, dict[int, int | None]]) -> None:
        """Revoke the leases that keep ``g`` waiting, if nothing else does (a per-op round in use or a
        change under way is waited for; its leases are revoked once it is over)."""
        leases: list[GroupState] = []
        for d, c in changes.items():
            driver = self.devices[d]
            ins, outs = changed_ports(driver.state(), driver.validate(c))
            seen: set[GroupState] = set()
            for p in ins | outs:
                for h in self.port_groups.get((d, p), ()):
                    self.visits += 1
                    if h is g or h in seen or not h.active():
                        continue
                    h_in, h_out = h.ports()[d]
                    if (p in ins and p in h_in) or (p in outs and p in h_out):
                        seen.add(h)
                        if h.status != GroupStatus.GRANTED or h.lease is None:
                            return
                        if h not in leases:
                            leases.append(h)
        if leases:
            g.revoked_at = self.clock()  # it waits for a lease to end (grant timing: ``revoke`` if this is after ready)
        for h in leases:
            if not h.revoking:
                h.revoking = True
                h.revoke_pushed = self.clock()
                self.counters["revocations"] += 1
                self.log("revoke", job=h.job, group=h.key, lease=h.lease, holders=sorted(h.holders), wanted_by=g.key)
                for rank in sorted(h.holders):
                    self.notify(h.job, rank, {"op": "revoke", "job": h.job, "rank": rank, "key": h.key,
                                              "lease": h.lease})

    def _switch(self, g: GroupState, changes: dict[str, dict[int, int | None]]) -> None:
        """Change the switches now (so every later decision sees the new state); grant after the delay.
        The store is written first: if it fails, nothing changes and the group's waiters get the error."""
        now, wall = self.clock(), self.wall()
        plan = {}
        for device, c in changes.items():
            driver = self.devices[device]
            after = driver.validate(c)
            ins, outs = changed_ports(driver.state(), after)
            plan[device] = (c, after, ins, outs, set().union(*moving_ports(driver.state(), after)))
        until = {(d, p): wall + self.devices[d].delay_s for d, (*_, steered) in plan.items() for p in steered}
        counters: dict[str, float] = {"reconfiguration_seconds": max(self.devices[d].delay_s for d in plan)}
        for d, (c, *_) in plan.items():
            counters[f"reconfigurations:{d}"] = 1
            counters[f"circuit_changes:{d}"] = len(c)
        try:
            self.store.switch({d: after for d, (_, after, *_) in plan.items()}, until, counters)
        except InfeasibleError as e:
            self._fail_waiters(g, e)
            return
        done = now
        for device, (c, _, ins, outs, steered) in plan.items():
            driver = self.devices[device]
            b_in, b_out = self._used(device, ins, outs, GroupState.active)  # independent of _schedule's check
            if b_in or b_out or self._switching_until(device, ins | outs) > now + _EPS:
                self.counters["unsafe_reconfigurations"] += 1  # never happens: _schedule checked it
            d_done = driver.apply(c, now)
            done = max(done, d_done)
            self._mark_switching(device, steered, d_done)
            self.applies.append({"device": device, "group": g.key, "job": g.job, "phase": g.phase, "at": now,
                                 "changed_inputs": sorted(ins), "changed_outputs": sorted(outs),
                                 "busy_inputs": sorted(b_in), "busy_outputs": sorted(b_out)})
        self.log("reconfigure", job=g.job, group=g.key, phase=g.phase, devices=sorted(changes), delay_s=done - now)
        g.status = GroupStatus.APPLYING
        g.switch_start, g.switch_done = now, done
        task = asyncio.get_running_loop().create_task(self._settle(g, done - now))
        self._tasks.add(task)
        task.add_done_callback(self._tasks.discard)

    async def _settle(self, g: GroupState, delay: float) -> None:
        if delay > 0:
            await self.sleep(delay)
        if g.status == GroupStatus.APPLYING:
            g.status = GroupStatus.IDLE
            self._ready.add(g)
            alive = not (self.dead and g.port_keys() & self.dead)
            if len(g.acquirers) == len(g.members) and self._settled(g) and alive:
                self._grant(g)  # every member is waiting for it
        self._schedule()

    def _grant(self, g: GroupState) -> None:
        g.status = GroupStatus.GRANTED
        g.restored, g.restored_ops, g.rejoins = None, None, {}
        g.holders = set(g.acquirers)
        g.acquirers = set()  # acquires from now on are for the next round
        g.ready_since = 0.0
        reply = None
        if g.holders <= g.lease_asks:  # every member asked for a lease
            g.lease, g.revoking = next(self._lease_ids), False
            g.ops, g.limit, g.gone = {}, {}, set()
            g.base = {r: g.lease_op[r] - 1 for r in g.holders if g.lease_op.get(r) is not None}
            g.intents -= g.holders  # the lease is tracked by its holders; an acquire now is for the next round
            for rank in g.holders:
                if self.intent.get((g.job, rank)) == g.key:
                    del self.intent[(g.job, rank)]
            reply = {"lease": g.lease}
            self.counters["leases"] += 1
        ops = [g.lease_op.get(r) for r in g.holders]
        g.round_ops = None if None in ops else set(ops)
        g.lease_asks, g.lease_op = set(), {}
        now = self.clock()
        ready = _NEVER  # when the last member's acquire arrived
        for rank in g.holders:
            fut, asked = g.waiters.pop(rank)
            if asked > ready:
                ready = asked
            if not fut.done():
                fut.set_result(reply)
                self.latencies.append(now - asked)
        self.counters["grants"] += 1
        if g.switch_done < ready and g.revoked_at < ready:  # lit (times left from before ready never count)
            self._lit.add(now - ready)
        elif ready == _NEVER:
            return  # no member (nothing to time)
        elif g.switch_done >= ready:  # a switch for it was not over when every member was there
            waited = min(g.switch_done, now) - max(g.switch_start, ready)  # its delay after ready (<= the delay)
            self.grant_latency["switch"].add(now - ready)
            self.grant_overhead.add(now - ready - max(0.0, waited))
            self.switch_lag["before"].add(max(0.0, g.switch_start - ready))
            self.switch_lag["after"].add(max(0.0, now - g.switch_done))
            g.switch_start = g.switch_done = g.revoked_at = _NEVER
        else:
            self.grant_latency["revoke"].add(now - ready)
            g.revoked_at = _NEVER

    def _rejoin(self, g: GroupState, rank: int, *, behind: bool = True) -> None:
        """A member behind the others in a revoked lease runs its remaining ops at once, up to ``until``
        (the ports stay busy; the members ahead of it are waiting for, or have sent, those ops). Not ``behind``:
        a member that yielded a lease not revoked is a holder again, with no limit (as if it never yielded)."""
        fut, asked = g.waiters.pop(rank)
        g.intents.discard(rank)
        g.acquirers.discard(rank)
        g.lease_asks.discard(rank)
        if len(g.intents) < len(g.members):
            g.ready_since = 0.0
        if self.intent.get((g.job, rank)) == g.key:
            del self.intent[(g.job, rank)]
        g.holders.add(rank)
        reply = {"lease": g.lease}
        if behind:
            reply["until"] = g.limit[rank] = g.started()
            self.counters["rejoins"] += 1
        reply["ops"] = g.ops.pop(rank)
        self.latencies.append(self.clock() - asked)
        if not fut.done():
            fut.set_result(reply)

    @staticmethod
    def _may_join(g: GroupState, rank: int, op_no: int | None) -> bool:
        """A rejoining acquire joins at once: the group is granted per op in a round restored by ``hold``,
        ``rank`` has not been in that round, and its op is one a holder is inside (a peer is inside the op
        this rank's lost grant was for). An acquire for a later op (its release and next acquire were both
        lost in the kill) waits for the next round: joining this one would run its op early and leave the
        peer's own acquire for that op waiting on a round that never ends (issue 17 item 3). An unknown
        number (either side an older client) joins, as before op numbers."""
        return Switching._restored_for(g, op_no) and rank not in g.restored and rank not in g.holders

    @staticmethod
    def _restored_for(g: GroupState, op_no: int | None) -> bool:
        """The group is granted per op in a round restored by ``hold`` with a holder inside op ``op_no`` (or
        either side does not know its op: an older client)."""
        return (g.status == GroupStatus.GRANTED and g.lease is None and g.restored is not None
                and (op_no is None or g.restored_ops is None or op_no in g.restored_ops))

    def _join(self, g: GroupState, rank: int) -> None:
        """Grant ``rank``'s waiting acquire inside the restored round (its circuits are lit: it was held)."""
        fut, asked = g.waiters.pop(rank)
        g.acquirers.discard(rank)
        g.lease_asks.discard(rank)
        g.rejoins.pop(rank, None)
        g.holders.add(rank)
        g.restored.add(rank)
        g.intents.add(rank)
        self.intent[(g.job, rank)] = g.key
        self.counters["rejoins"] += 1
        self.latencies.append(self.clock() - asked)
        self.log("rejoin", job=g.job, rank=rank, group=g.key)
        if not fut.done():
            fut.set_result({"rejoined": True})

    def _lease_progress(self, g: GroupState) -> bool:
        """After an ack, release or disconnect in a lease: let members behind rejoin; end the lease once no
        holder is left and every member ran the same ops. True if that freed its ports."""
        if g.lease is None:
            return False
        started = g.started()
        for rank in [r for r in g.waiters if r in g.ops and r not in g.holders and started > g.ops[r]]:
            self._rejoin(g, rank)
        if len(g.holders) > len(g.held) or len(set(g.ops.values())) > 1:
            return False  # someone is still inside, has not answered, or must run its remaining ops
        if g.revoking:
            self.revoke_rtt.add(self.clock() - g.revoke_pushed)
        if g.held:
            self._restore_held(g)
            return False
        g.status, g.lease, g.revoking, g.ops, g.limit, g.base, g.gone = GroupStatus.IDLE, None, False, {}, {}, {}, set()
        self._ready.add(g)
        if g.intents and len(g.intents) == len(g.members):
            g.ready_since = self.clock()
        return True

    @staticmethod
    def _back_in_lease(g: GroupState, rank: int, op_no: int | None) -> None:
        """A holder of the lease whose connection was lost (its client forgot the lease) acquires again, for its op
        ``op_no``, while the others still hold it: the ops it ran under the lease are known from that number (the
        lease began after its op ``base``), so it rejoins the lease as a member that yielded does (behind the
        others, if the lease is revoked). Otherwise it would wait for a round its peers, running their ops under the
        lease, never start: they wait for it inside their next op (issue 31)."""
        if g.lease is not None and rank in g.gone and op_no is not None and rank in g.base:
            g.gone.discard(rank)
            g.ops[rank] = max(0, op_no - 1 - g.base[rank])

    def _restore_held(self, g: GroupState) -> None:
        """The lease's only holders left are members back inside an op by ``hold`` (their connections were replaced
        while this controller ran; the other members' were too, or they gave the lease back): the lease ends and the
        round goes on per op, as one restored by hold after a restart, so the other members' first holds (or
        rejoining acquires) for that op join it. Kept as a lease, it would wait for those members' lease ops, which
        their clients, having forgotten the lease, ask for with an acquire that waits for the held op to end, while
        the held op waits for them (issue 31: after a pause, a job stalled this way)."""
        g.lease, g.revoking, g.ops, g.limit, g.base, g.gone = None, False, {}, {}, {}, set()
        g.restored = set(g.held)
        g.restored_ops = None if None in g.held.values() else {n for n in g.held.values() if n is not None}
        for rank in g.held:
            g.intents.add(rank)
            self.intent[(g.job, rank)] = g.key
        g.held = {}
        self.log("lease_restored", job=g.job, group=g.key, holders=sorted(g.holders))
        for rank in sorted(g.rejoins):  # rejoining acquires that wait join the round now (as after a hold)
            if rank in g.waiters and self._may_join(g, rank, g.rejoins[rank]):
                self._join(g, rank)

    def _job(self, job: str) -> dict:
        if job not in self.jobs:
            raise ScenarioError(f"unknown job {job!r}", field="job", fix="send hello first")
        return self.jobs[job]

    def _group(self, job: str, key: str, rank: int) -> GroupState:
        g = self.groups.get((job, key))
        if g is None:
            raise ScenarioError(f"unknown group {key!r} of job {job!r}", field="key", fix="declare it with op=group")
        if rank not in g.members:
            raise ScenarioError(f"rank {rank} is not a member of group {key!r}", field="rank")
        return g

    def lease_of(self, job: str, key: str, rank: int) -> int | None:
        """The lease ``rank`` holds on the group, if its round is a lease."""
        g = self.groups.get((job, key))
        return g.lease if g is not None and rank in g.holders else None

    def _leave(self, job: str, rank: int, key: str) -> bool:
        """The rank no longer wants or holds the group; True if that freed ports (its round ended, or
        it was lit for members that all asked)."""
        self.intent.pop((job, rank), None)
        g = self.groups.get((job, key))
        if g is None:
            return False
        was_complete = len(g.intents) == len(g.members)
        g.intents.discard(rank)
        g.acquirers.discard(rank)
        g.holders.discard(rank)
        waiter = g.waiters.pop(rank, None)
        if waiter is not None and not waiter[0].done():
            waiter[0].cancel()
        if len(g.intents) < len(g.members):
            g.ready_since = 0.0
        g.rejoins.pop(rank, None)
        if g.status == GroupStatus.GRANTED and not g.holders and g.lease is None:
            g.status = GroupStatus.IDLE  # the round is over; ranks already back wait for the next barrier
            g.restored, g.restored_ops = None, None
            if len(g.intents) == len(g.members):
                g.ready_since = self.clock()
                self._ready.add(g)
            return True
        return g.status == GroupStatus.IDLE and was_complete  # its lit-for-prepare ports are no longer reserved

    def _wait(self, g: GroupState, rank: int) -> Waiter:
        """A blocked acquire's future; an earlier one of the same rank on ``g`` fails with Superseded."""
        loop = self._current_loop()
        if loop is None:
            raise RuntimeError("no running event loop")  # as asyncio.get_running_loop says it
        fut = Waiter(loop=loop)
        old = g.waiters.get(rank)
        if old is not None and not old[0].done():
            old[0].set_exception(Superseded(f"a later acquire of rank {rank} for {g.key!r} replaced this one",
                                            field="key", fix="wait for the later acquire's reply"))
        g.waiters[rank] = (fut, self.clock())
        return fut
