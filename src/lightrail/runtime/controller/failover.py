"""What the controller does when a rank or a port fails (a mixin of ``Controller``): a spare takes the failed
rank's place and its circuits are rewired (``rank_failed``, ``_rewire_plan``), waiters are woken with the
error, a job is forgotten; a port fails or is repaired. Semantics: see ``core.py``'s docstring.
"""

from __future__ import annotations

from lightrail.errors import InfeasibleError, ScenarioError
from lightrail.runtime.controller.groups import _EPS, Failover, GroupState, GroupStatus, RankFailed
from lightrail.runtime.ocs import changed_ports


class FailoverLogic:
    """Rank and port failures, for Controller (its state lives there)."""

    def rank_failed(self, job: str, rank: int) -> dict:
        """A rank died (connection closed without bye, or heartbeats stopped). With an idle spare, the
        spare takes its place (see module doc); with spares but none left, the job is told it is dead;
        a job registered without spares keeps :meth:`disconnect`'s behaviour."""
        info = self._job(job)
        if rank not in info["ranks"]:
            raise ScenarioError(f"rank {rank} of job {job!r} is not registered", field="rank")
        if (job, rank) not in self.connected:
            return {"failover": False}  # already failed, left or replaced: nothing more to do
        if not info.get("spares") or rank >= info["world"]:
            self._resync(job, rank, schedule=False)  # gone: its ports may be switched
            self.disconnect(job, rank)  # no spares, or an idle spare that died: nothing to move
            return {"failover": False}
        failed = info["ranks"][rank]
        spare = next((s for s in sorted(info["ranks"]) if s >= info["world"] and (job, s) in self.connected
                      and set(info["ranks"][s]) >= set(failed)
                      and not any((d, p) in self.dead for d, p in info["ranks"][s].items())), None)
        if spare is None:
            reason = f"rank {rank} failed and job {job!r} has no idle spare left"
            self._resync(job, rank, schedule=False)
            self.disconnect(job, rank)
            self._wake_job(job, RankFailed(reason, field="rank", fix="restart the job from its last checkpoint"))
            self.log("dead", job=job, rank=rank)
            for r in sorted(info["ranks"]):
                if (job, r) in self.connected:
                    self.notify(job, r, {"op": "dead", "job": job, "rank": rank, "reason": reason})
            return {"failover": False}
        moved = {d: (failed[d], info["ranks"][spare][d]) for d in failed}  # device -> (failed port, spare port)
        epoch = info.get("epoch", 0) + 1
        self._resync(job, rank, schedule=False)  # a dead rank carries no traffic (an idle spare none either)
        self._resync(job, spare, schedule=False)
        plan = self._rewire_plan(job, moved)
        now, wall = self.clock(), self.wall()
        until = {(d, p): wall + self.devices[d].delay_s for d, (_, _, ins, outs) in plan.items() for p in ins | outs}
        counters = {k: v for d, (c, _, _, _) in plan.items()
                    for k, v in ((f"reconfigurations:{d}", 1), (f"circuit_changes:{d}", len(c)))}
        counters["failovers"] = 1
        self.store.failover(job, rank, spare, epoch, {d: after for d, (_, after, _, _) in plan.items()}, until,
                            counters)  # write first
        # memory: the job's groups start a fresh round on the new ports (its ranks rebuild and re-acquire)
        self.connected.discard((job, rank))
        self._wake_job(job, Failover(f"rank {rank} of job {job!r} failed; spare {spare} takes its place "
                                     f"(epoch {epoch})", field="rank", fix="re-declare the groups and acquire again"))
        for g in list(self.job_groups.get(job, {}).values()):
            circuits = {d: {moved[d][1] if i == moved[d][0] else i: moved[d][1] if o == moved[d][0] else o
                            for i, o in c.items()} if d in moved else c for d, c in g.circuits.items()}
            circuits = {d: {i: o for i, o in c.items() if i != o} for d, c in circuits.items()}
            if circuits != g.circuits:
                self._unindex(g)
                g.circuits = {d: c for d, c in circuits.items() if c}
                g.__post_init__()
                self._index(g)
        rewire_s = 0.0
        for device, (c, _, ins, outs) in plan.items():
            done = self.devices[device].apply(c, now)
            self._mark_switching(device, ins | outs, done)
            rewire_s = max(rewire_s, done - now)
            self.applies.append({"device": device, "group": None, "job": job, "phase": "failover", "at": now,
                                 "changed_inputs": sorted(ins), "changed_outputs": sorted(outs),
                                 "busy_inputs": [], "busy_outputs": []})
        for device, (port, _) in moved.items():
            self.owner.pop((device, port), None)
        self.counters["failovers"] += 1
        self._flushed["failovers"] += 1  # written with the failover
        ranks = info["ranks"]
        ranks[rank] = ranks.pop(spare)
        info["epoch"] = epoch
        self.connected.discard((job, spare))  # the server re-binds the spare's connection to ``rank`` (it
        self.connected.add((job, rank))  # says hello again as it): if it dies too, the next spare follows
        self.log("failover", job=job, rank=rank, spare=spare, epoch=epoch, rewire_s=rewire_s)
        message = {"op": "failover", "job": job, "rank": rank, "spare": spare, "epoch": epoch,
                   "ports": dict(ranks[rank])}
        for r in sorted({*ranks, spare} - {rank}):
            if (job, r) in self.connected or r == spare:
                self.notify(job, r, message)
        if rewire_s > 0:
            self._wake_at(now + rewire_s)
        self._schedule()
        return {"failover": True, "spare": spare, "epoch": epoch, "rewire_s": rewire_s}

    def port_failed(self, device: str, port: int) -> dict:
        """The operator marks a port dead (persisted): groups using it are refused, their waiters woken,
        and the owning job's connected ranks told (``port_failed``)."""
        self._check_port(device, port, field="port")
        self.store.set_dead(device, port, True)  # write first
        self.dead.add((device, port))
        error = self._dead_error(device, port)
        groups = sorted(self.port_groups.get((device, port), ()), key=lambda g: (g.job, g.key))
        for g in groups:
            self._fail_waiters(g, error)
        jobs = {g.job for g in groups} | ({self.owner[(device, port)]} if (device, port) in self.owner else set())
        for job in sorted(jobs):
            for r in sorted(self.jobs.get(job, {}).get("ranks", {})):
                if (job, r) in self.connected:
                    self.notify(job, r, {"op": "port_failed", "job": job, "device": device, "port": port})
        self.log("port_failed", device=device, port=port, groups=len(groups))
        return {"device": device, "port": port, "dead": True, "groups": [f"{g.job}/{g.key}" for g in groups]}

    def port_repaired(self, device: str, port: int) -> dict:
        """Undo :meth:`port_failed` (persisted)."""
        self._check_port(device, port, field="port")
        self.store.set_dead(device, port, False)  # write first
        self.dead.discard((device, port))
        self.log("port_repaired", device=device, port=port)
        return {"device": device, "port": port, "dead": False}

    def _fail_waiters(self, g: GroupState, error: Exception) -> None:
        """Wake ``g``'s blocked acquires with ``error``; they no longer ask for it (its holders keep it)."""
        for rank, (fut, _) in list(g.waiters.items()):
            if not fut.done():
                fut.set_exception(error)
            if rank not in g.holders:
                g.intents.discard(rank)
                g.acquirers.discard(rank)
                g.lease_asks.discard(rank)
                if self.intent.get((g.job, rank)) == g.key:
                    del self.intent[(g.job, rank)]
        g.waiters.clear()
        for rank in [r for r in g.intents if r not in g.holders]:  # prepared members too
            g.intents.discard(rank)
            g.acquirers.discard(rank)
            if self.intent.get((g.job, rank)) == g.key:
                del self.intent[(g.job, rank)]
        g.ready_since = 0.0

    def _wake_job(self, job: str, error: Exception) -> None:
        """Every waiter of the job's groups fails with ``error``, and the groups start a fresh round (no
        holders, no lease): the job rebuilds from its checkpoint and acquires again."""
        for g in self.job_groups.get(job, {}).values():
            for fut, _ in g.waiters.values():
                if not fut.done():
                    fut.set_exception(error)
            g.waiters.clear()
            g.intents, g.acquirers, g.holders, g.lease_asks = set(), set(), set(), set()
            g.restored, g.restored_ops, g.rejoins, g.held, g.base, g.gone = None, None, {}, {}, {}, set()
            g.lease, g.revoking, g.ops, g.limit, g.ready_since = None, False, {}, {}, 0.0
            if g.status == GroupStatus.GRANTED:
                g.status = GroupStatus.IDLE  # an APPLYING one settles on its own
        for k in [k for k in self.intent if k[0] == job]:
            del self.intent[k]

    def _forget_job(self, job: str) -> None:
        """Drop a job's groups (their waiters cancelled), intents, ports and connections from memory."""
        for g in list(self.job_groups.get(job, {}).values()):
            for fut, _ in g.waiters.values():
                fut.cancel()
            g.waiters.clear()
            g.intents.clear()
            g.acquirers.clear()
            self._unindex(g)
        self.job_groups.pop(job, None)
        for k in [k for k in self.intent if k[0] == job]:
            del self.intent[k]
        for rank, ports in self.jobs.get(job, {}).get("ranks", {}).items():
            self.connected.discard((job, rank))
            self._resync(job, rank, schedule=False)
            for device, port in ports.items():
                if self.owner.get((device, port)) == job:
                    del self.owner[(device, port)]

    def _rewire_plan(self, job: str, moved: dict[str, tuple[int, int]]) -> dict[str, tuple]:
        """Per device, the change that moves the lit circuits of the failed port to the spare's port
        (the idle spare's own circuits go dark; circuits to another job's ports are left alone), if none
        of the ports it switches carries another group's traffic or is still switching (else the
        scheduler lights the rewritten groups when they are acquired)."""
        plan = {}
        now = self.clock()
        for device, (f, s) in moved.items():
            driver = self.devices[device]
            state = driver.state()
            target = {}
            for i, o in state.items():
                if s in (i, o):
                    continue
                if f in (i, o) and self.owner.get((device, o if i == f else i), job) != job:
                    continue
                i2, o2 = (s if i == f else i), (s if o == f else o)
                if i2 != o2:
                    target[i2] = o2
            changes = {i: target.get(i) for i in state.keys() | target.keys() if state.get(i) != target.get(i)}
            if not changes:
                continue
            after = driver.validate(changes)
            ins, outs = changed_ports(state, after)
            busy = self._used(device, ins, outs, lambda h: h.active() and (h.job != job or
                                                                              h.status == GroupStatus.APPLYING))
            if any(busy) or self._switching_until(device, ins | outs) > now + _EPS:
                continue
            plan[device] = (changes, after, ins, outs)
        return plan

    def disconnect(self, job: str, rank: int) -> None:
        """A rank's connection closed: it no longer holds or waits for anything (its leases vanish). It
        stays registered (its ports stay its own), so it can come back."""
        self.connected.discard((job, rank))
        key = self.intent.get((job, rank))
        g = self.groups.get((job, key)) if key is not None else None
        if g is not None and g.status == GroupStatus.GRANTED and g.lease is None and rank in g.holders \
                and len(g.holders) > 1:
            # A holder of a per-op round, whose grant may be lost with the connection (its client sends the acquire
            # again, with rejoin) or which is inside the op (it holds again): the round stays joinable for it, as
            # one restored by hold, while its peers are inside it (issue 31: its peer waited inside the op for it,
            # and its acquire waited for the next round)
            if g.restored is None:
                g.restored, g.restored_ops = set(g.holders), None if g.round_ops is None else set(g.round_ops)
            g.restored.discard(rank)
        freed = key is not None and self._leave(job, rank, key)
        for g in [g for g in self.job_groups.get(job, {}).values() if g.lease is not None]:
            if rank in g.holders or rank in g.ops:
                if rank in g.holders and rank not in g.limit and rank not in g.held:
                    g.gone.add(rank)  # its client forgets the lease; its next acquire rejoins (_back_in_lease)
                g.holders.discard(rank)
                g.ops.pop(rank, None)
                g.limit.pop(rank, None)
                g.held.pop(rank, None)
                freed = self._lease_progress(g) or freed
        if freed:
            self._schedule()

    def connection_lost(self, job: str, rank: int) -> None:
        """The rank's connection closed without bye: it may be gone or reconnecting (after a pause of this
        process, a dropped connection), and the server fails it only if it says no hello again in time. Its
        holds, leases and waits go, as :meth:`disconnect` drops them (its client forgets its leases and sends its
        holds and waiting requests again on the new connection, as after a restart), but it stays a member, and
        its ports are not switched until it resumes (its first acquire, prepare, release, ack or heartbeat, sent
        after its holds) or ``resync_grace`` passes: it may still be inside an op on them."""
        ports = self.jobs.get(job, {}).get("ranks", {}).get(rank)
        if ports is None or (job, rank) not in self.connected:
            return
        keys = [(d, p) for d, p in ports.items()]
        for k in keys:
            self.unsynced[k] = (job, rank)
        self._unsynced_ports[(job, rank)] = keys
        self.resync_until = max(self.resync_until, self.clock() + self.resync_grace)
        self.disconnect(job, rank)
        self.connected.add((job, rank))

    def resumed(self, job: str, rank: int) -> None:
        """The rank's heartbeat on a connection that said hello: its client sends heartbeats only once its restore
        (hello, groups, holds, requests) is out, so its holds are in and its ports may be switched. A rank inside
        an op holds and sends nothing more until the op ends, perhaps waiting for a peer whose group needs those
        ports: without this it would wait out ``resync_grace`` (issue 31: 30 s after a pause)."""
        if self.unsynced:
            self._resync(job, rank)

    def _resync(self, job: str, rank: int, *, schedule: bool = True) -> None:
        """The rank resumed after a restart (it sent its holds), left or failed: its ports may be switched."""
        ports = self._unsynced_ports.pop((job, rank), None) if self.unsynced else None
        if ports:
            for k in ports:
                self.unsynced.pop(k, None)
            if schedule:
                self._schedule()

    def _check_alive(self, g: GroupState) -> None:
        if self.dead:
            dead = g.port_keys() & self.dead
            if dead:
                raise self._dead_error(*min(dead))

    @staticmethod
    def _dead_error(device: str, port: int) -> InfeasibleError:
        return InfeasibleError(f"port {port} on {device} is dead (failed)", field=f"circuits.{device}",
                               fix="re-plan without it")
