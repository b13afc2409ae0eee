"""torch.distributed backend ``"lightrail"``: gloo (CPU) or NCCL (GPU) underneath, the controller in
front of every collective and send/recv.

Use::

    from lightrail.runtime import torch_backend
    torch_backend.configure(controller="127.0.0.1:7600", job="j1", layout=Layout.from_degrees(8, tp=2, pp=2),
                            mode="provisioned")   # or set the LIGHTRAIL_* environment variables
    torch_backend.register()
    dist.init_process_group("lightrail", ...)     # every dist.new_group(...) is a lightrail group too

Each process group is a Python ``dist.ProcessGroup`` wrapping a real backend created on the same
store, so the numerics are the wrapped backend's (same seed, same losses). The group's phase is
identified online from its members: the parallel dimensions along which they differ in the job's
``Layout`` (tp, cp, ep, dp, pp); a send/recv's phase from its two ranks. Its circuits follow the
traffic: a collective runs as a ring over the group's members (gloo's and NCCL's large-message
algorithm), a send/recv is one transfer, and a transfer between servers rides the rail of its
destination GPU (PXN), from the sender's server port to the receiver's on that rail's OCS
(``rail{i}``) — the same rule as the Opus planner (``control/opus.py``). Groups within one server
(TP) need no circuit and never reach the controller.

Every op acquires its group before it starts (the controller lights the circuits once all members
asked and no changing port carries traffic) and releases it when it completes, so a rank holds
circuits only inside an op. Modes: ``on_demand`` does only that (a reconfiguration starts when the
phase's first op arrives); ``provisioned`` learns each rank's sequence of groups in the first
iteration and sends, with each release, a ``prepare`` of the group expected next, so the controller
reconfigures while the rank computes. Ops complete before they return (the backend waits for the
wrapped work) so that their end is known; exchange patterns that need a send and a receive in
flight at once (``batch_isend_irecv`` both ways) are not supported through it.
"""

from __future__ import annotations

import os
import time
from dataclasses import dataclass, field

import torch
import torch.distributed as dist
from torch._C._distributed_c10d import _create_work_from_future

from lightrail.errors import ScenarioError
from lightrail.runtime.controller.client import ControllerClient
from lightrail.workload.parallel import ORDER, Layout

__all__ = ["configure", "register", "setup", "shutdown", "LightrailProcessGroup", "phase_of", "circuits_of",
           "agent_stats"]

_MODES = ("on_demand", "provisioned")


def configure(*, controller: str, job: str, layout: Layout, mode: str = "provisioned") -> None:
    """Set this process's backend options (as environment variables, so spawned workers can inherit)."""
    if mode not in _MODES:
        raise ScenarioError(f"unknown mode {mode!r}", field="mode", fix="use on_demand or provisioned")
    os.environ.update({
        "LIGHTRAIL_CONTROLLER": controller, "LIGHTRAIL_JOB": job, "LIGHTRAIL_MODE": mode,
        "LIGHTRAIL_LAYOUT": f"tp={layout.tp},cp={layout.cp},ep={layout.ep},dp={layout.dp},pp={layout.pp},"
                            f"gpus_per_server={layout.gpus_per_server}"})


def _layout_from_env() -> Layout:
    text = os.environ.get("LIGHTRAIL_LAYOUT", "")
    try:
        degrees = {k: int(v) for k, v in (kv.split("=") for kv in text.split(",") if kv)}
        return Layout(**degrees)
    except (ValueError, TypeError) as e:
        raise ScenarioError(f"cannot read LIGHTRAIL_LAYOUT={text!r} ({e})", field="LIGHTRAIL_LAYOUT",
                            fix="e.g. tp=2,cp=1,ep=1,dp=2,pp=2,gpus_per_server=2 (torch_backend.configure)") from None


def phase_of(layout: Layout, ranks) -> str:
    """The parallel dimensions along which ``ranks`` differ, in Megatron order ("dp", "ep+dp", ...)."""
    coords = layout.coords(list(ranks))
    varying = [d.value for d in ORDER if len(set(coords[d].tolist())) > 1]
    return "+".join(varying) or "self"


def circuits_of(layout: Layout, transfers) -> dict[str, dict[int, int]]:
    """Circuits that (src, dst) transfers need: on the rail of dst, server(src) -> server(dst)."""
    out: dict[str, dict[int, int]] = {}
    for src, dst in transfers:
        s, d = int(layout.server(src)), int(layout.server(dst))
        if s != d:
            out.setdefault(f"rail{int(layout.rail(dst))}", {})[s] = d
    return out


@dataclass
class _Agent:
    """One per process: the controller connection and the sequence of groups it learned to expect.

    Every op on a group with circuits acquires it (blocking until the circuits are lit and every
    member is there) and releases it right after, so a rank never holds circuits while it computes
    or waits for a peer elsewhere. Provisioned mode adds a prediction: ``after`` maps (group, ops
    in its current run) to the group that came next last time; the release carries a ``prepare`` of
    that group, so the controller can light it while the rank computes. A prediction seen to be
    wrong is dropped.
    """

    client: ControllerClient | None
    layout: Layout
    mode: str
    rank: int
    declared: set[str] = field(default_factory=set)
    run_key: str | None = None
    run: int = 0
    after: dict[tuple[str, int], str | None] = field(default_factory=dict)
    requests: int = 0
    wait_s: float = 0.0
    request_s: list[float] = field(default_factory=list)  # round trips of non-blocking requests (release)

    def before(self, key: str, members, circuits) -> None:
        if self.client is None or not circuits:
            return
        if key not in self.declared:
            self.client.declare(key, members, circuits, phase=key.split(":")[0])
            self.declared.add(key)
        if self.run_key is not None:
            self._observe((self.run_key, self.run), key)
        self.run = self.run + 1 if key == self.run_key else 1
        self.run_key = key
        start = time.perf_counter()
        self.client.acquire(key)
        self.wait_s += time.perf_counter() - start
        self.requests += 1

    def _observe(self, point: tuple[str, int], nxt: str) -> None:
        seen = self.after.get(point, nxt)
        self.after[point] = nxt if seen == nxt else None  # None: seen to differ, unpredictable

    def after_op(self, key: str, circuits) -> None:
        if self.client is None or not circuits:
            return
        nxt = self.after.get((key, self.run)) if self.mode == "provisioned" else None
        start = time.perf_counter()
        self.client.release(key, then_prepare=nxt)
        self.request_s.append(time.perf_counter() - start)

    def close(self) -> None:
        if self.client is not None:
            self.client.bye()
            self.client.close()
            self.client = None


_AGENT: _Agent | None = None


def _agent(rank: int) -> _Agent:
    global _AGENT
    if _AGENT is None:
        layout = _layout_from_env()
        mode = os.environ.get("LIGHTRAIL_MODE", "provisioned")
        if mode not in _MODES:
            raise ScenarioError(f"unknown mode {mode!r}", field="LIGHTRAIL_MODE", fix="on_demand or provisioned")
        address = os.environ.get("LIGHTRAIL_CONTROLLER", "")
        client = None
        if address:
            host, _, port = address.rpartition(":")
            client = ControllerClient(host, int(port), job=os.environ.get("LIGHTRAIL_JOB", "job"), rank=rank)
            client.hello(layout.world, {f"rail{int(layout.rail(rank))}": int(layout.server(rank))})
        _AGENT = _Agent(client, layout, mode, rank)
    return _AGENT


def agent_stats() -> dict:
    """This process's controller requests and the time it spent blocked in them."""
    a = _AGENT
    if a is None:
        return {"requests": 0, "wait_s": 0.0, "request_s": []}
    return {"requests": a.requests, "wait_s": a.wait_s, "request_s": list(a.request_s)}


def shutdown() -> None:
    global _AGENT
    if _AGENT is not None:
        _AGENT.close()
        _AGENT = None


class LightrailProcessGroup(dist.ProcessGroup):
    """A process group that asks the controller for its circuits around every op of the wrapped one."""

    def __init__(self, opts, _options=None):
        super().__init__(opts.group_rank, opts.group_size)
        if os.environ.get("LIGHTRAIL_INNER", "gloo") == "nccl":
            self.inner = dist.ProcessGroupNCCL(opts.store, opts.group_rank, opts.group_size)
        else:
            self.inner = dist.ProcessGroupGloo(opts.store, opts.group_rank, opts.group_size, opts.timeout)
        self.members = [int(r) for r in opts.global_ranks_in_group] or list(range(opts.group_size))
        first = _AGENT is None
        self.agent = _agent(self.members[opts.group_rank])  # the first group (the default one) says hello
        if first and self.agent.client is not None:
            self.inner.barrier().wait()  # every rank's ports are claimed before any group is declared
        layout = self.agent.layout
        self.phase = phase_of(layout, self.members)
        ring = list(zip(self.members, self.members[1:] + self.members[:1], strict=True))
        self.key = f"{self.phase}:{','.join(map(str, self.members))}"
        self.circuits = circuits_of(layout, ring if len(self.members) > 1 else [])

    def getBackendName(self) -> str:  # noqa: N802 (torch's name)
        return "lightrail"

    # -- the wrapper --------------------------------------------------------------------------------------
    def _run(self, key, members, circuits, call):
        self.agent.before(key, members, circuits)
        call().wait()
        self.agent.after_op(key, circuits)
        return _done()  # waiting twice on some gloo works (send) never returns: hand back a completed one

    def _collective(self, name, *args):
        return self._run(self.key, self.members, self.circuits, lambda: getattr(self.inner, name)(*args))

    def _p2p(self, src: int, dst: int, call):
        g_src, g_dst = self.members[src], self.members[dst]
        key = f"{phase_of(self.agent.layout, [g_src, g_dst])}:{g_src}->{g_dst}"
        return self._run(key, sorted({g_src, g_dst}), circuits_of(self.agent.layout, [(g_src, g_dst)]), call)

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

    def barrier(self, *args):
        return self.inner.barrier(*args)  # control only: no circuits

    def send(self, tensors, dst, tag=0):
        return self._p2p(self.rank(), dst, lambda: self.inner.send(tensors, dst, tag))

    def recv(self, tensors, src, tag=0):
        return self._p2p(src, self.rank(), lambda: self.inner.recv(tensors, src, tag))


def _done():
    future = torch.futures.Future()
    future.set_result(None)
    return _create_work_from_future(future)


def _create(opts, options):
    return LightrailProcessGroup(opts, options)


def setup(*, controller: str, job: str, layout: Layout, mode: str = "provisioned") -> None:
    """``configure`` then ``register``: what each rank process runs before ``init_process_group``."""
    configure(controller=controller, job=job, layout=layout, mode=mode)
    register()


def register() -> None:
    """Register backend ``"lightrail"`` with torch.distributed (idempotent)."""
    if "lightrail" not in dist.Backend.backend_list:
        dist.Backend.register_backend("lightrail", _create, extended_api=True, devices=["cpu", "cuda"])
