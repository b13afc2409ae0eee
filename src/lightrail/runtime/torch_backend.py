"""torch.distributed backend ``"lightrail"``: gloo (CPU) or NCCL (GPU) underneath, the controller's
circuits under every collective and send/recv (leased for a whole phase where the Plan allows).

Use, in every rank process::

    from lightrail.runtime import torch_backend
    layout = Layout.from_degrees(8, tp=2, pp=2)
    config = torch_backend.BackendConfig(controller="127.0.0.1:7600", job="j1", layout=layout,
                                         plan=runtime_plan(layout, Policy(mode="provisioned")))
    agent = torch_backend.setup(config)          # registers "lightrail", bound to this process's agent
    dist.init_process_group("lightrail", ...)     # every dist.new_group(...) is a lightrail group too
    ...
    agent.stats(); agent.close()

All the backend's state is in the :class:`Agent` that ``setup`` returns (no module global, no
environment variable): the config is a frozen, picklable object that a launcher hands to its
workers as an argument (``functools.partial(torch_backend.setup, config)`` as their ``init``).

Each process group is a Python ``dist.ProcessGroup`` wrapping a real backend created on the same
store, so the numerics are the wrapped backend's (same seed, same losses). The group's phase is
identified online from its members: the parallel dimensions along which they differ in the job's
``Layout`` (tp, cp, ep, dp, pp); a send/recv's phase from its two ranks. Its circuits follow the
traffic: a collective runs as a ring over the group's members (gloo's and NCCL's large-message
algorithm), a send/recv is one transfer, and a transfer between servers rides the rail of its
destination GPU (PXN), from the sender's server port to the receiver's on that rail's OCS
(``rail{i}``) — ``control.plan.rail_circuits``, the one circuit rule of the simulator and the planner.
Groups within one server (TP) need no circuit and never reach the controller.

Which groups hold *leases* is the Plan's decision (``control/plan.py``): the config carries the Plan
(``BackendConfig.plan``; ``runtime_plan(layout)`` by default), the same object a launcher such as
``train-demo`` hands its simulator, and its ``policy`` gives the mode and whether leases are on. A group
whose circuits the plan serves (``Plan.serves``: its phase is one configuration and holds them) acquires
its circuits once with ``lease`` and then runs its ops
with no controller request at all, until the controller revokes the lease because another group
needs those ports (every holder acknowledges at once with the number of ops it ran under the lease;
the ports are freed when no op is in flight and every member ran as many; the next op re-acquires). Every
other group (a phase split into several matchings, e.g. a middle pipeline stage at PP >= 4 whose
forward and backward circuits share a transmitter; a phase not in the plan) acquires before every op
and releases after it, so a rank holds its circuits only inside an op. Why not lease everything:
with a lease a rank may enter an op before its peer; if the peer first needs a group that conflicts
with the lease, the revoke cannot be acknowledged until the op ends, which needs the peer: deadlock.
Groups of one configuration never conflict with each other, and in a training program a rank
changes phase only after its peers finished the previous phase's ops with it. A plan whose policy has
``leases=False`` turns them off (per-op acquire/release everywhere, as Opus checks in before every op).

Modes: ``on-demand`` asks when an op needs a group (a reconfiguration starts when the phase's first
op arrives); ``provisioned`` learns each rank's sequence of groups in the first iteration and, when
it finishes the last op before a change of group, sends a ``prepare`` of the group expected next
(with the release, for a per-op group), so the controller can revoke and reconfigure while the rank
computes. A leased group's last op before a change to a group whose circuits conflict with it also *yields* its
lease (``ControllerClient.yield_lease``, sent before the prepare): the rank is done with it, so once every holder
yielded, the ports are free and the next group switches with no revoke round trip. A wrong prediction costs an
acquire, granted at once while the lease stands. A next group on other ports keeps the lease (yielding it would
turn every later op on the group into an acquire with a barrier).

Ops complete before they return (the backend waits for the wrapped work) so that their end
is known; exchange patterns that need a send and a receive in flight at once (``batch_isend_irecv``
both ways) are not supported through it. With NCCL, ``wait()`` only orders the caller's CUDA stream
after the op, so ``run_op`` also records a CUDA event after it and synchronizes on that event before
the release (or the lease's ``leave``): circuits are released only after the op's data has moved.

Failover (spare splicing, LUMION; issue 17): a job may start with idle spares (``Agent.connect_spare``:
hello with ``spare: true`` and one port per rail, :func:`spare_ports`). When a rank dies the controller
moves its ports to a spare, resets the job's groups and pushes ``failover``; the push fails any acquire
the rank is blocked in, and the next op raises. The rank then drops its groups (``Agent.abort``: the
wrapped backends are freed, their connections close, so peers blocked on this rank fail at once rather
than at gloo's timeout — gloo's own ``abort`` does not wake a blocked op), and ``Agent.failover`` maps
the failed rank's ports to the spare's in every circuit it computes (``circuits_of(..., moved)``, the
controller's own rewrite), forgets its leases (the controller reset them), and in the spare says hello
again as the failed rank. Rebuilding the groups and restoring the state is the job's (see
``studies/train_demo.py``).
"""

from __future__ import annotations

import functools
import sys
import threading
import time
import weakref
from collections import deque
from dataclasses import dataclass
from enum import StrEnum

import torch
import torch.distributed as dist
from torch._C._distributed_c10d import _create_work_from_future

from lightrail.control.plan import Mode, Plan, rail_circuits, runtime_plan
from lightrail.errors import InfeasibleError, ScenarioError
from lightrail.runtime.controller.client import ControllerClient, ControllerError
from lightrail.workload.parallel import ORDER, Layout

__all__ = ["BackendConfig", "Inner", "Agent", "setup", "register", "idle_stats", "LightrailProcessGroup",
           "phase_of", "circuits_of"]


class Inner(StrEnum):
    """The real backend each lightrail group wraps (its numerics and transport)."""

    GLOO = "gloo"
    """CPU tensors (tests, the train-demo)."""
    NCCL = "nccl"
    """GPU tensors; circuits are released only after the op's data has moved (the backend waits for the work)."""


@dataclass(frozen=True, kw_only=True)
class BackendConfig:
    """Everything the backend needs in one rank process; frozen and picklable, so a launcher passes it
    to its workers as an argument. Strings are accepted for ``mode`` and ``inner`` and parsed here."""

    layout: Layout
    """The job's rank layout: names each group's phase and gives each rank its rail and server port."""
    controller: str | None = None
    """The controller's rank-protocol address, ``host:port``; None runs the wrapped backend with no circuits."""
    job: str = "job"
    """The job's name at the controller (its ports belong to it)."""
    plan: Plan | None = None
    """The Plan the backend executes (its ``policy``: the mode, leases); None: ``runtime_plan(layout)`` with
    lightrail's default policy. ``provisioned`` announces the next group as a phase's last op ends,
    ``on-demand`` asks when it starts; with leases, groups the plan serves hold their circuits across ops."""
    inner: Inner = Inner.GLOO
    """The wrapped backend: ``gloo`` (CPU) or ``nccl`` (GPU)."""
    token: str | None = None
    """The job's secret from the controller's ``POST /jobs`` (sent in every rank's hello)."""

    def __post_init__(self):
        if not isinstance(self.layout, Layout):
            raise ScenarioError(f"layout must be a Layout, got {type(self.layout).__name__}", field="layout",
                                fix="e.g. Layout.from_degrees(8, tp=2, pp=2)")
        if self.controller is not None:
            self.address()  # checks it
        if not isinstance(self.job, str) or not self.job:
            raise ScenarioError(f"job must be a non-empty string, got {self.job!r}", field="job", fix='e.g. job="j1"')
        if self.plan is None:
            object.__setattr__(self, "plan", runtime_plan(self.layout))
        elif not isinstance(self.plan, Plan) or self.plan.layout != self.layout:
            raise ScenarioError("plan must be a Plan for the config's layout", field="plan",
                                fix="e.g. runtime_plan(layout, Policy(mode='on-demand'))")
        try:
            object.__setattr__(self, "inner", Inner(self.inner))
        except ValueError:
            raise ScenarioError(f"unknown inner backend {self.inner!r}", field="inner",
                                fix="use gloo (CPU) or nccl (GPU)") from None

    def address(self) -> tuple[str, int]:
        """The controller's (host, port)."""
        text = self.controller
        host, _, port = text.rpartition(":") if isinstance(text, str) else ("", "", "")
        if not host or not port.isdigit() or not 0 < int(port) < 65536:
            raise ScenarioError(f"cannot read controller address {text!r}", field="controller",
                                fix='host:port, e.g. "127.0.0.1:7600" (the port `controller serve` printed)')
        return host, int(port)


def phase_of(layout: Layout, ranks) -> str:
    """The parallel dimensions along which ``ranks`` differ, in Megatron order ("dp", "ep+dp", ...)."""
    coords = layout.coords(list(ranks))
    varying = [d.value for d in ORDER if len(set(coords[d].tolist())) > 1]
    return "+".join(varying) or "self"


def circuits_of(layout: Layout, transfers,
                moved: dict[tuple[str, int], int] | None = None) -> dict[str, dict[int, int]]:
    """Circuits that (src, dst) transfers need (``rail_circuits``: on the rail of dst, server(src) ->
    server(dst)), as the controller's ``{"rail<i>": {input: output}}``. ``moved`` maps (device, port) of a
    failed rank to its spare's port on that device: the controller's failover rewrites circuits the same way."""
    transfers = list(transfers)
    if not transfers:
        return {}
    src, dst = zip(*transfers, strict=True)
    moved = moved or {}
    out: dict[str, dict[int, int]] = {}
    for rail, tx, rx in zip(*rail_circuits(layout, src, dst), strict=True):
        device = f"rail{int(rail)}"
        out.setdefault(device, {})[moved.get((device, int(tx)), int(tx))] = moved.get((device, int(rx)), int(rx))
    return out


def spare_ports(layout: Layout, index: int) -> dict[str, int]:
    """Spare ``index``'s ports: one on every rail, after the servers' (a spare server with a GPU per rail,
    so it can take any rank's place); the controller is started with ``servers + spares`` ports per rail."""
    return {f"rail{k}": layout.servers + index for k in range(layout.gpus_per_server)}


class Agent:
    """One per process, made by :func:`setup`: the controller connection, the Plan, the sequence of
    groups it learned to expect, and its counters (``stats()``, ``requests``).

    ``run_op`` wraps every op on a group with circuits. A group whose phase is one configuration of the
    plan runs under a lease (no request while it stands); any other acquires before the op (blocking
    until the circuits are lit and every member is there) and releases right after. Provisioned mode
    adds a prediction: ``after`` maps (group, ops in its current run) to the group that came next
    last time; when the next group differs, a ``prepare`` of it goes out as the op ends (with the
    release of a per-op group), so the controller can light it while the rank computes. A prediction
    seen to be wrong is dropped.
    """

    def __init__(self, config: BackendConfig):
        self.config = config
        self.layout = config.layout
        self.plan: Plan = config.plan  # the launcher's, pickled with the config
        self.serving: dict[str, bool] = {}  # group key -> may it lease (``leased``)
        self.client: ControllerClient | None = None
        self.rank: int | None = None  # set by the process's first group
        self.closed = False
        self.declared: set[str] = set()
        self.circuits: dict[str, dict[str, dict[int, int]]] = {}  # declared group key -> its circuits
        self.run_key: str | None = None
        self.run = 0
        self.after: dict[tuple[str, int], str | None] = {}
        self.moved: dict[tuple[str, int], int] = {}  # failed ranks' ports -> their spares' (failover)
        self.groups: list[weakref.ref] = []  # this generation's groups (dropped on a failure: see ``abort``)
        self.pushes: list[dict] = []  # the controller's failover / dead pushes
        self._pushed = threading.Condition()
        self.handled = 0  # pushes the job recovered from
        self.ops = 0  # ops on groups with circuits
        self.under_lease = 0  # of which ran under a lease (no request)
        self.revokes = 0
        self.wait_s = 0.0
        self.timeline: deque[tuple[str, bool, float, float, float]] = deque(maxlen=TIMELINE)
        """The last ops: (group key, on the rails, start, granted, end), ``time.perf_counter`` seconds."""
        self._granted = 0.0

    def connect(self, rank: int) -> bool:
        """The process's first group (the default one) names its rank: say hello to the controller.
        True if this call connected (every rank should then wait for the others' hellos)."""
        if self.rank is not None:
            return False
        self.rank = rank
        if self.config.controller is None:
            return False
        self._client(rank).hello(self.layout.world,
                                 {f"rail{int(self.layout.rail(rank))}": int(self.layout.server(rank))})
        return True

    def _client(self, rank: int) -> ControllerClient:
        # The client's reader thread answers revokes while the main thread computes: with CPython's
        # default 5 ms switch interval a revoke could wait that long for the GIL at every rank.
        sys.setswitchinterval(min(sys.getswitchinterval(), 2e-4))
        host, port = self.config.address()
        self.client = ControllerClient(host, port, job=self.config.job, rank=rank, on_revoke=self._revoked,
                                       token=self.config.token, on_failover=self._on_push, on_dead=self._on_push)
        return self.client

    # -- failover (spare splicing) ----------------------------------------------------------------------
    def connect_spare(self, index: int) -> None:
        """An idle spare process says hello as the job's spare ``index`` (rank id ``world + index``), with
        its ports on every rail (:func:`spare_ports`); it joins no group until it takes a rank over."""
        if self.config.controller is None:
            return
        self._client(self.layout.world + index).hello(self.layout.world, spare_ports(self.layout, index), spare=True)

    def _on_push(self, message: dict) -> None:
        """The controller's failover or dead push (reader thread): fail the requests it makes moot, then wake
        whatever this rank waits for. In that order: :meth:`failover`, once woken, ends the news
        (``forget_holds``) and says hello as the rank it takes over; news set after that would fail the rebuilt
        job's first acquire with this push's error (the rank then stops, and a spare says ``bye`` as the rank
        it took over, releasing its ports: issue 31's stall after a failover, 1 run in ~60 at load 12)."""
        t = time.time()
        if message.get("op") in ("failover", "dead"):
            _interrupt(self.client, message)
        with self._pushed:
            self.pushes.append({**message, "t": t})
            self._pushed.notify_all()

    def pending_failure(self) -> dict | None:
        """A failover or dead push this rank has not recovered from yet."""
        with self._pushed:
            news = [m for m in self.pushes[self.handled:] if m.get("op") in ("failover", "dead")]
        return news[0] if news else None

    def abort(self) -> None:
        """Drop the wrapped backend of every group of the failed generation: their connections close, so
        peers blocked on this rank fail now (gloo's ``abort`` does not wake a blocked op; closing does)."""
        for ref in self.groups:
            group = ref()
            if group is not None:
                group.inner = None
        self.groups = []
        self.run_key, self.run = None, 0

    def failover(self, rank: int, spare: int, *, spare_index: int, timeout_s: float = 30.0) -> dict:
        """After the launcher announced that ``rank`` failed and spare process ``spare`` takes it: wait
        for the controller's failover push (it rewired the circuits), move ``rank``'s ports to the spare's in
        every circuit this process computes, forget the lease and hold state of the old groups (the controller
        reset their rounds), and, in the spare, say hello again as ``rank``. Returns the timeline marks."""
        if self.client is None:
            return {}
        deadline = time.monotonic() + timeout_s
        with self._pushed:
            while True:
                push = next((m for m in self.pushes[self.handled:] if m.get("op") in ("failover", "dead")), None)
                if push is not None:
                    break
                left = deadline - time.monotonic()
                if left <= 0:
                    raise InfeasibleError(f"the controller did not report rank {rank}'s failure within {timeout_s:g} s",
                                          field="controller", fix="check the controller's log")
                self._pushed.wait(left)
            self.handled = self.pushes.index(push) + 1
        if push["op"] == "dead" or push["rank"] != rank:
            raise InfeasibleError(f"rank {push['rank']} failed and no spare is left" if push["op"] == "dead" else
                                  f"the controller moved rank {push['rank']} to spare {push['spare']}, the launcher "
                                  f"rank {rank}", field="--spares", fix="start the job with (more) --spares")
        if push["spare"] != self.layout.world + spare_index:
            raise InfeasibleError(f"the controller chose spare {push['spare']} for rank {rank}, the launcher "
                                  f"{self.layout.world + spare_index}", field="--spares")
        failed = {f"rail{int(self.layout.rail(rank))}": int(self.layout.server(rank))}
        for device, port in failed.items():  # keyed by the layout's port: a second failover of it chains
            self.moved[(device, port)] = int(push["ports"].get(device, port))
        _forget_holds(self.client)
        self.declared.clear()
        self.circuits.clear()
        marks = {"t_push": push["t"], "epoch": push["epoch"]}
        if self.rank is None:  # the spare takes the rank over: hello again as it, on the same ports
            start = time.time()
            self.client.rank = rank
            self.client.hello(self.layout.world, spare_ports(self.layout, spare_index))
            self.rank = rank
            marks["rewire_s"] = push.get("rewire_s", time.time() - start)
        return marks

    @property
    def requests(self) -> int:
        """Controller requests this process sent so far (hello and bye aside; 0 without a controller)."""
        return 0 if self.client is None else self.client.requests

    def stats(self) -> dict:
        """This process's controller requests (hello and bye aside), the time it spent blocked in acquires,
        the round trips of requests answered at once, its ops on groups with circuits, how many of them
        ran under a lease, and the revokes it answered (all zero without a controller)."""
        if self.client is None:
            return idle_stats()
        return {"requests": self.client.requests, "wait_s": self.wait_s, "request_s": list(self.client.round_trips),
                "ops": self.ops, "under_lease": self.under_lease, "revokes": self.revokes}

    def leased(self, key: str, transfers=()) -> bool:
        """True if the group (key, or phase) takes leases: the plan's policy has them and the plan serves its
        ``transfers`` (its phase is one configuration holding their circuits; without transfers, its phase is
        one configuration). A send/recv between two ranks is then one group, both directions (the ops of the
        two ranks on it still pair up in order: gloo matches a pair's sends and receives in order)."""
        if not self.plan.leases:
            return False
        if key not in self.serving:
            phase = key.split(":")[0]
            if transfers:
                src, dst = zip(*transfers, strict=True)
                self.serving[key] = self.plan.serves(phase, rail_circuits(self.layout, src, dst))
            else:
                self.serving[key] = self.plan.single_configuration(phase)
        return self.serving[key]

    def run_op(self, key: str, members, circuits, call) -> None:
        """Run ``call`` (the wrapped op) holding ``circuits``; record it in :attr:`timeline`."""
        start = self._granted = time.perf_counter()
        self._run_op(key, members, circuits, call)
        self.timeline.append((key, bool(circuits), start, self._granted, time.perf_counter()))

    def _run_op(self, key: str, members, circuits, call) -> None:
        client = self.client
        if client is None or not circuits:
            call().wait()
            return
        if self.closed:
            raise InfeasibleError(f"an op on {key} after the backend's agent was closed", field="agent",
                                  fix="close the agent only after the last op (before destroy_process_group)")
        failure = self.pending_failure()
        if failure is not None:  # the job is rebuilding: this generation's groups are gone
            raise ControllerError(f"rank {failure['rank']} failed", field="rank", kind=failure["op"].capitalize(),
                                  fix="rebuild the process groups and resume from the checkpoint")
        if key not in self.declared:
            client.declare(key, members, circuits, phase=key.split(":")[0])
            self.declared.add(key)
            self.circuits[key] = circuits
        if self.run_key is not None:
            self._observe((self.run_key, self.run), key)
        self.run = self.run + 1 if key == self.run_key else 1
        self.run_key = key
        self.ops += 1
        nxt = self.after.get((key, self.run)) if self.plan.mode is Mode.PROVISIONED else None
        leased = self.leased(key)
        if leased and client.enter(key):
            self.under_lease += 1
            self._granted = time.perf_counter()
            call().wait()
            self._settle()
            client.leave(key)
            self._prepare(key, nxt)
            return
        start = time.perf_counter()
        reply = client.acquire(key, lease=leased)
        self._granted = time.perf_counter()
        self.wait_s += self._granted - start
        call().wait()
        self._settle()
        if "lease" in reply:
            client.leave(key)  # releases, if it was revoked meanwhile (or granted only up to ``until``)
            self._prepare(key, nxt)
        else:
            client.release(key, then_prepare=nxt if nxt is not None and nxt != key else None)

    def _prepare(self, key: str, nxt: str | None) -> None:
        """After the last op on leased group ``key`` before a change to group ``nxt`` (provisioned mode): yield the
        lease on ``key`` if ``nxt``'s circuits conflict with it (or are unknown), then prepare ``nxt`` unless held.
        The yield goes first, so the controller has the ports back when the prepare completes ``nxt``'s round."""
        if nxt is None or nxt == key:
            return
        if _conflict(self.circuits.get(key), self.circuits.get(nxt)):
            self.client.yield_lease(key)
        if not self.client.holds(nxt):
            self.client.prepare(nxt, wait=False)

    def _observe(self, point: tuple[str, int], nxt: str) -> None:
        seen = self.after.get(point, nxt)
        self.after[point] = nxt if seen == nxt else None  # None: seen to differ, unpredictable

    def _settle(self) -> None:
        """NCCL: ``wait()`` only orders the caller's stream after the op; record an event after it and wait
        for it, so the circuits are released only after the op's data has moved."""
        if self.config.inner is Inner.NCCL and torch.cuda.is_available():
            event = torch.cuda.Event()
            event.record()
            event.synchronize()

    def _revoked(self, key: str, inside: bool) -> None:
        self.revokes += 1

    def close(self) -> None:
        """Leave the controller (its ports are freed); the counters stay readable."""
        if self.client is not None and not self.closed:
            self.client.bye()
            self.client.close()
        self.closed = True


def _conflict(a: dict[str, dict[int, int]] | None, b: dict[str, dict[int, int]] | None) -> bool:
    """Circuits ``a`` and ``b`` cannot be lit together (on some device an input to two outputs, or two inputs to
    one output): lighting one switches a port of the other. Unknown circuits (None) count as conflicting."""
    if a is None or b is None:
        return True
    for device in a.keys() & b.keys():
        x, y = a[device], b[device]
        fed = {o: i for i, o in y.items()}
        if any(y.get(i, o) != o or fed.get(o, i) != i for i, o in x.items()):
            return True
    return False


def _interrupt(client: ControllerClient | None, push: dict) -> None:
    """Fail the acquires this rank is blocked in with the push's news: a request the controller received
    after it reset the job's groups would otherwise wait for peers that are rebuilding."""
    if client is not None:
        client.interrupt({"type": push["op"].capitalize(), "message": f"rank {push['rank']} failed",
                          "field": "rank", "fix": "rebuild the process groups and resume from the checkpoint"})


def _forget_holds(client: ControllerClient) -> None:
    """The controller reset the job's groups at the failover (no holders, no lease): the client's leases and
    holds of them are void, and errors of requests sent before it are stale."""
    client.forget_holds()


TIMELINE = 16384
"""Ops an :class:`Agent` remembers in its timeline (the train-demo reads a few hundred per rank)."""

_AGENTS: dict[str, Agent] = {}


def registered(name: str) -> Agent | None:
    """The agent behind backend ``name`` in this process (see :func:`register`), or None (gloo, NCCL)."""
    return _AGENTS.get(name)


def idle_stats() -> dict:
    """``Agent.stats()`` of a process with no controller (plain gloo): the same keys, all zero."""
    return {"requests": 0, "wait_s": 0.0, "request_s": [], "ops": 0, "under_lease": 0, "revokes": 0}


class LightrailProcessGroup(dist.ProcessGroup):
    """A process group that holds its circuits (a lease, or around every op) while the wrapped one runs."""

    def __init__(self, agent: Agent, opts, _options=None):
        super().__init__(opts.group_rank, opts.group_size)
        if agent.config.inner is Inner.NCCL:
            self.inner = dist.ProcessGroupNCCL(opts.store, opts.group_rank, opts.group_size)
        else:
            self.inner = dist.ProcessGroupGloo(opts.store, opts.group_rank, opts.group_size, opts.timeout)
        self.members = [int(r) for r in opts.global_ranks_in_group] or list(range(opts.group_size))
        self.agent = agent
        agent.groups.append(weakref.ref(self))
        if agent.connect(self.members[opts.group_rank]):  # the first group (the default one) says hello
            self.inner.barrier().wait()  # every rank's ports are claimed before any group is declared
        layout = agent.layout
        self.phase = phase_of(layout, self.members)
        ring = list(zip(self.members, self.members[1:] + self.members[:1], strict=True))
        self.key = f"{self.phase}:{','.join(map(str, self.members))}"
        self.circuits = circuits_of(layout, ring if len(self.members) > 1 else [], agent.moved)
        agent.leased(self.key, ring if len(self.members) > 1 else ())  # decided once, by the plan

    def getBackendName(self) -> str:  # noqa: N802 (torch's name)
        return "lightrail"

    # -- the wrapper --------------------------------------------------------------------------------------
    def _run(self, key, members, circuits, call):
        self.agent.run_op(key, members, circuits, call)
        return _done()  # waiting twice on some gloo works (send) never returns: hand back a completed one

    def _collective(self, name, *args):
        return self._run(self.key, self.members, self.circuits, lambda: getattr(self.inner, name)(*args))

    def _p2p(self, src: int, dst: int, call):
        g_src, g_dst = self.members[src], self.members[dst]
        phase = phase_of(self.agent.layout, [g_src, g_dst])
        a, b = sorted((g_src, g_dst))
        key, transfers = f"{phase}:{a}<->{b}", [(a, b), (b, a)]
        if not self.agent.leased(key, transfers):  # one lease for both directions where the plan serves both
            key, transfers = f"{phase}:{g_src}->{g_dst}", [(g_src, g_dst)]
            self.agent.leased(key, transfers)
        return self._run(key, sorted({g_src, g_dst}), circuits_of(self.agent.layout, transfers, self.agent.moved), call)

    def allreduce(self, *args):
        return self._collective("allreduce", *args)

    def allreduce_coalesced(self, *args):
        return self._collective("allreduce_coalesced", *args)

    def allgather(self, *args):
        return self._collective("allgather", *args)

    def _allgather_base(self, *args):
        return self._collective("_allgather_base", *args)

    def allgather_into_tensor_coalesced(self, *args):
        return self._collective("allgather_into_tensor_coalesced", *args)

    def reduce_scatter(self, *args):
        return self._collective("reduce_scatter", *args)

    def _reduce_scatter_base(self, *args):
        return self._collective("_reduce_scatter_base", *args)

    def reduce_scatter_tensor_coalesced(self, *args):
        return self._collective("reduce_scatter_tensor_coalesced", *args)

    def broadcast(self, *args):
        return self._collective("broadcast", *args)

    def reduce(self, *args):
        return self._collective("reduce", *args)

    def alltoall_base(self, *args):
        return self._collective("alltoall_base", *args)

    def alltoall(self, *args):
        return self._collective("alltoall", *args)

    def gather(self, *args):
        return self._collective("gather", *args)

    def scatter(self, *args):
        return self._collective("scatter", *args)

    def barrier(self, *args, **kwargs):
        # control only: no circuits; torch passes its BarrierOptions by keyword (``opts=``) from dist.barrier()
        return self.inner.barrier(*args, **kwargs)

    def send(self, tensors, dst, tag=0):
        return self._p2p(self.rank(), dst, lambda: self.inner.send(tensors, dst, tag))

    def recv(self, tensors, src, tag=0):
        return self._p2p(src, self.rank(), lambda: self.inner.recv(tensors, src, tag))


def _done():
    future = torch.futures.Future()
    future.set_result(None)
    return _create_work_from_future(future)


def setup(config: BackendConfig) -> Agent:
    """What each rank process runs before ``init_process_group``: a new :class:`Agent` for ``config``,
    registered as backend ``"lightrail"``; returns it (its ``stats()``, ``requests``, ``close()``)."""
    return register(Agent(config))


def register(agent: Agent, name: str = "lightrail") -> Agent:
    """Register backend ``name`` (``"lightrail"``) with torch.distributed, its groups bound to ``agent``.

    torch keeps one factory per backend name: registering again (a second run in the same process)
    binds the groups created from then on to the new agent; groups already created keep theirs. Another
    name gives a second backend in the same process (the train-demo's controller-less replica)."""
    dist.Backend.register_backend(name, functools.partial(LightrailProcessGroup, agent), extended_api=True,
                                  devices=["cpu", "cuda"])
    _AGENTS[name] = agent
    return agent
