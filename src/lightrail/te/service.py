"""Symphony's slice controllers as real processes (``lightrail te serve``): the network and its protocol.

The parent process is the network. It loads the topology, its paths and a sequence of traffic
matrices (``te.prepare.prepare``), slices the nodes, listens on loopback and starts one controller
process per slice (``python -m lightrail.te.controller_proc``). Each controller loads the same
topology and paths itself and compiles its own TE problem once, so only demands and allocations
cross the wire, as JSON lines over TCP on 127.0.0.1:

- controller -> network, once ready: ``{"type": "hello", "slice", "pid", "demands", "paths", "owned"}``
  (the network checks the counts against its own paths and the pid against the process it started);
- network -> controllers, every epoch: ``{"type": "demand", "epoch", "demand": [D floats, Gbps]}``,
  the true demand; each controller perturbs it with its own generator (:func:`view`: seeded by the
  seed, its slice and the epoch, Symphony's independent measurement error), solves, and answers
  ``{"type": "allocation", "slice", "epoch", "flows": [...], "solve_s"}``: the path flows of the
  demands whose source is in its slice only (:func:`owned_paths`, in path order);
- network -> controllers at the end: ``{"type": "stop"}`` (then SIGTERM; a controller also stops
  when its connection closes, so none outlives a network that died).

At each epoch's deadline (``interval`` after its demand went out, or as soon as every live
controller answered) the network realizes the load (``decentral.realize``) from the allocations
*of that epoch*: a slice whose controller is dead or silent leaves its demands unprogrammed (zero
flow). ``affected_fraction`` is their share of the epoch's demand: the blast radius of what failed
now. A controller that dies (SIGKILL from outside, or ``kill=``/``kill_at=``) is noticed by its
closed connection; the network and the other controllers keep running.
"""

from __future__ import annotations

import asyncio
import contextlib
import json
import os
import signal
import subprocess
import sys
from collections.abc import Callable
from dataclasses import dataclass, field, replace

import numpy as np

from lightrail.errors import LightrailError, ScenarioError
from lightrail.te.paths import PathSet
from lightrail.te.slicing import Slicer

__all__ = ["HOST", "CYCLE", "ServeRun", "serve_te", "view", "owned_paths", "encode", "check_serve",
           "controller_command"]

HOST = "127.0.0.1"
#: Traffic matrices cycled through when the network runs until stopped (``epochs=0``): two hours of
#: the gravity model's 5-minute matrices.
CYCLE = 24
#: How long controllers may take to load the topology, compile their problem and say hello.
STARTUP_TIMEOUT_S = 120.0
#: How long a controller gets to exit after SIGTERM before SIGKILL.
STOP_TIMEOUT_S = 5.0
#: Longest JSON line the network reads (an allocation of a large WAN is megabytes).
LINE_LIMIT = 1 << 28


def encode(message: dict) -> bytes:
    """One JSON line (floats as Python's repr: they cross the wire exactly)."""
    return json.dumps(message, separators=(",", ":")).encode() + b"\n"


def view(demand: np.ndarray, perturbation: float, seed: int, slice_: int, epoch: int) -> np.ndarray:
    """Controller ``slice_``'s view of the epoch's demand: each demand with its own relative error,
    uniform in +-perturbation (as ``decentral.views``), from a generator seeded by (seed, slice, epoch)
    so that a view does not depend on which epochs a controller saw before.

    >>> v = view(np.array([10.0, 20.0]), 0.1, 0, 1, 5)
    >>> bool(np.all(np.abs(v / [10.0, 20.0] - 1) <= 0.1)), bool(np.all(v == view(np.array([10.0, 20.0]), 0.1, 0, 1, 5)))
    (True, True)
    """
    rng = np.random.default_rng([seed, slice_, epoch])
    return demand * (1.0 + perturbation * rng.uniform(-1.0, 1.0, len(demand)))


def owned_paths(paths: PathSet, slice_of: np.ndarray, slice_: int) -> np.ndarray:
    """The paths (indices, in path order) of the demands whose source node is in ``slice_``."""
    return np.flatnonzero(np.asarray(slice_of)[paths.pairs[paths.path_demand, 0]] == slice_)


def controller_command(*, port: int, slice_: int, nodes, topology: str, k: int, lam: float, objective: str,
                       perturbation: float, seed: int) -> list[str]:
    """The command line of slice ``slice_``'s controller process."""
    return [sys.executable, "-m", "lightrail.te.controller_proc", "--connect", f"{HOST}:{port}",
            "--slice", str(slice_), "--nodes", ",".join(str(int(v)) for v in nodes), "--topology", topology,
            "--paths", str(k), "--lambda", repr(float(lam)), "--objective", str(objective),
            "--perturbation", repr(float(perturbation)), "--seed", str(seed)]


def check_serve(*, seed: int, slices: int, epochs: int, interval: float, kill: int | None, kill_at: int | None,
                port: int) -> None:
    """The serve options a TeSetup does not check (each error names its flag)."""
    if seed < 0:
        raise ScenarioError(f"seed {seed}", field="--seed", fix="use an integer >= 0")
    if epochs < 0:
        raise ScenarioError(f"{epochs} epochs", field="--epochs", fix="use an integer >= 1, or 0 to run until stopped")
    if not (np.isfinite(interval) and interval > 0):
        raise ScenarioError(f"interval {interval}", field="--interval", fix="seconds between epochs, > 0 (e.g. 0.5)")
    if not 0 <= port <= 65535:
        raise ScenarioError(f"{port} is not a TCP port", field="--port", fix="use 0..65535 (0: any free port)")
    if kill is not None and not 0 <= kill < slices:
        raise ScenarioError(f"no slice {kill} among {slices}", field="--kill", fix=f"a slice 0..{slices - 1}")
    if kill_at is not None:
        if kill is None:
            raise ScenarioError("says when to kill, but not which slice", field="--kill-at-epoch",
                                fix="give --kill SLICE too")
        if kill_at < 0 or (epochs and kill_at >= epochs):
            raise ScenarioError(f"epoch {kill_at}", field="--kill-at-epoch",
                                fix=f"an epoch 0..{epochs - 1}" if epochs else "an epoch >= 0")


@dataclass(eq=False)
class _Slot:
    """One slice's controller as the network sees it."""

    slice: int
    nodes: np.ndarray
    paths: np.ndarray  # owned path indices
    proc: subprocess.Popen | None = None
    writer: asyncio.StreamWriter | None = None
    connected: asyncio.Event = field(default_factory=asyncio.Event)
    alive: bool = True
    died_at: int | None = None
    how: str | None = None
    allocation: tuple[int, np.ndarray] | None = None
    solve_s: float | None = None


@dataclass(frozen=True)
class ServeRun:
    """What ``lightrail te serve`` did: the controllers it ran and one row of metrics per epoch."""

    topology: str
    network: dict
    slices: int
    slicer: str
    port: int
    controllers: list[dict]
    epochs: list[dict]
    blast_radius: dict[int, float]
    setup: dict
    stopped: bool = False  # ended by SIGTERM / SIGINT before its last epoch

    def to_dict(self) -> dict:
        return {"topology": self.topology, "network": self.network, "slices": self.slices, "slicer": self.slicer,
                "port": self.port, **self.setup, "controllers": self.controllers, "epochs": self.epochs,
                "blast_radius": {str(s): v for s, v in self.blast_radius.items()}, "stopped": self.stopped}


class _Network:
    def __init__(self, setup, net, slice_of: np.ndarray, *, slicer: str, epochs: int, interval: float,
                 kill: int | None, kill_at: int | None, port: int, on_ready, on_epoch, on_event, record=None):
        self.setup, self.net, self.slice_of, self.slicer = setup, net, slice_of, slicer
        self.epochs, self.interval, self.kill, self.kill_at, self.port = epochs, interval, kill, kill_at, port
        self.on_ready, self.on_epoch, self.on_event = on_ready, on_epoch, on_event
        self.record = record
        paths = net.paths
        self.owner = slice_of[paths.pairs[:, 0]]
        self.slots = [_Slot(s, np.flatnonzero(slice_of == s), owned_paths(paths, slice_of, s))
                      for s in range(setup.slices)]
        self.rows: list[dict] = []
        self.epoch = -1
        self.stopping = False
        self.closing = False  # the network is stopping its controllers: closed connections are expected
        self.failure: LightrailError | None = None
        self.wake = asyncio.Event()

    # -- the controllers' connections -------------------------------------------------------------------------------

    async def _accept(self, reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        slot = None
        paths = self.net.paths
        try:
            hello = json.loads(await asyncio.wait_for(reader.readline(), STARTUP_TIMEOUT_S))
            s = hello.get("slice")
            candidate = self.slots[s] if isinstance(s, int) and 0 <= s < len(self.slots) else None
            if (candidate is None or candidate.proc is None or hello.get("pid") != candidate.proc.pid
                    or candidate.writer is not None or hello.get("type") != "hello"):
                return  # not one of ours: drop it
            if (hello.get("demands"), hello.get("paths"), hello.get("owned")) != (
                    paths.demands, paths.paths, len(candidate.paths)):
                self.failure = LightrailError(
                    f"the controller of slice {s} computed {hello.get('demands')} demands and {hello.get('paths')} "
                    f"paths, the network {paths.demands} and {paths.paths}", field="controller",
                    fix="run the controllers from the same lightrail and topology as the network")
                self.wake.set()
                return
            slot = candidate
            slot.writer = writer
            slot.connected.set()
            while line := await reader.readline():
                message = json.loads(line)
                if message.get("type") == "allocation":
                    flows = np.asarray(message["flows"], dtype=float)
                    if flows.shape == slot.paths.shape and isinstance(message.get("epoch"), int):
                        slot.allocation = (message["epoch"], flows)
                        slot.solve_s = message.get("solve_s")
                        self.wake.set()
                elif message.get("type") == "error":
                    self.on_event({"event": "error", "slice": slot.slice, "epoch": message.get("epoch"),
                                   "message": str(message.get("message"))})
        except (ConnectionError, asyncio.IncompleteReadError, TimeoutError, ValueError, KeyError, TypeError,
                AttributeError):
            pass
        finally:
            if slot is not None and slot.alive and not self.closing:
                self._dead(slot, "connection closed")
            writer.close()

    def _dead(self, slot: _Slot, how: str) -> None:
        if not slot.alive:
            return
        slot.alive, slot.died_at, slot.how = False, max(self.epoch, 0), how
        self.on_event({"event": "dead", "slice": slot.slice, "pid": slot.proc.pid if slot.proc else None,
                       "epoch": slot.died_at, "how": how})
        self.wake.set()

    def _reap(self) -> None:
        for slot in self.slots:
            if slot.alive and slot.proc is not None and slot.proc.poll() is not None:
                self._dead(slot, f"exited with code {slot.proc.returncode}")

    # -- processes ------------------------------------------------------------------------------------------------

    def _spawn(self) -> None:
        s = self.setup
        for slot in self.slots:
            cmd = controller_command(port=self.port, slice_=slot.slice, nodes=slot.nodes, topology=s.topology,
                                     k=s.k, lam=s.lam, objective=s.objective.value, perturbation=s.perturbation,
                                     seed=s.seed)
            # stdout to /dev/null (a solver banner must not reach the network's --json); stderr shared
            slot.proc = subprocess.Popen(cmd, stdin=subprocess.DEVNULL, stdout=subprocess.DEVNULL)

    def _shutdown(self) -> None:
        """Stop every controller still running: ``stop``, SIGTERM, then SIGKILL; reap them all."""
        self.closing = True
        for slot in self.slots:
            if slot.writer is not None and not slot.writer.is_closing():
                with contextlib.suppress(Exception):
                    slot.writer.write(encode({"type": "stop"}))
                    slot.writer.close()
        procs = [slot.proc for slot in self.slots if slot.proc is not None]
        for proc in procs:
            if proc.poll() is None:
                with contextlib.suppress(ProcessLookupError):
                    proc.terminate()
        for proc in procs:
            try:
                proc.wait(STOP_TIMEOUT_S)
            except subprocess.TimeoutExpired:
                proc.kill()
                proc.wait()

    async def _await_hellos(self) -> None:
        loop = asyncio.get_running_loop()
        deadline = loop.time() + STARTUP_TIMEOUT_S
        while not all(slot.connected.is_set() for slot in self.slots):
            if self.failure is not None:
                raise self.failure
            if self.stopping:
                return
            for slot in self.slots:
                if not slot.connected.is_set() and slot.proc.poll() is not None:
                    raise LightrailError(f"the controller of slice {slot.slice} (pid {slot.proc.pid}) exited with "
                                         f"code {slot.proc.returncode} before it connected", field="controller",
                                         fix="see its error above")
            if loop.time() > deadline:
                raise LightrailError(f"controllers not ready within {STARTUP_TIMEOUT_S:g} s", field="controller",
                                     fix="try a smaller --topology or fewer --paths")
            self.wake.clear()
            with contextlib.suppress(TimeoutError):
                await asyncio.wait_for(self.wake.wait(), 0.05)

    # -- epochs ---------------------------------------------------------------------------------------------------

    def _stop(self) -> None:
        self.stopping = True
        self.wake.set()

    def _kill(self, slot: _Slot) -> None:
        if slot.alive and slot.proc is not None:
            with contextlib.suppress(ProcessLookupError):
                os.kill(slot.proc.pid, signal.SIGKILL)
            self._dead(slot, "killed (--kill)")

    def _realize(self, epoch: int, demand: np.ndarray) -> dict:
        from lightrail.te.decentral import realize

        paths = self.net.paths
        flows = np.zeros((len(self.slots), paths.paths))
        fresh = []
        for slot in self.slots:
            if slot.allocation is not None and slot.allocation[0] == epoch:
                flows[slot.slice, slot.paths] = slot.allocation[1]
                fresh.append(slot.slice)
                if self.record is not None:
                    self.record.write(json.dumps({"epoch": epoch, "slice": slot.slice, "paths": slot.paths.tolist(),
                                                  "flows": slot.allocation[1].tolist()}) + "\n")
        metrics, _ = realize(paths, self.net.wan.capacity, demand, flows, self.owner)
        total = demand.sum()
        affected = float(demand[~np.isin(self.owner, fresh)].sum() / total) if total > 0 else 0.0
        m = metrics.to_dict()
        return {"epoch": epoch, "alive": sum(slot.alive for slot in self.slots), "fresh": fresh,
                **{key: m[key] for key in ("divergence_overload_fraction", "worst_link_overload", "throughput",
                                           "max_link_utilization")},
                "affected_fraction": affected,
                "solve_ms": {str(slot.slice): round(slot.solve_s * 1e3, 3) for slot in self.slots
                             if slot.slice in fresh and slot.solve_s is not None}}

    async def _run_epochs(self) -> None:
        loop = asyncio.get_running_loop()
        demands = self.net.demands
        e = 0
        while not self.stopping and (self.epochs == 0 or e < self.epochs):
            self.epoch = e
            if self.kill is not None and e == self.kill_at:
                self._kill(self.slots[self.kill])
            self._reap()
            demand = demands[e % len(demands)]
            message = encode({"type": "demand", "epoch": e, "demand": demand.tolist()})
            for slot in self.slots:
                if slot.alive and slot.writer is not None and not slot.writer.is_closing():
                    slot.writer.write(message)
            deadline = loop.time() + self.interval
            while not self.stopping:
                self._reap()
                if all(slot.allocation is not None and slot.allocation[0] == e for slot in self.slots if slot.alive):
                    break
                left = deadline - loop.time()
                if left <= 0:
                    break
                self.wake.clear()
                with contextlib.suppress(TimeoutError):
                    await asyncio.wait_for(self.wake.wait(), min(left, 0.1))
            if self.stopping:
                break
            self._reap()
            row = self._realize(e, demand)
            self.rows.append(row)
            self.on_epoch(row)
            while not self.stopping and (left := deadline - loop.time()) > 0:
                self.wake.clear()
                with contextlib.suppress(TimeoutError):
                    await asyncio.wait_for(self.wake.wait(), left)
            e += 1

    async def run(self) -> bool:
        loop = asyncio.get_running_loop()
        try:
            server = await asyncio.start_server(self._accept, HOST, self.port, limit=LINE_LIMIT)
        except OSError as e:
            raise ScenarioError(f"cannot listen on {HOST}:{self.port}: {e.strerror or e}", field="--port",
                                fix="pick a free port, or 0 for any") from None
        self.port = server.sockets[0].getsockname()[1]
        handled = []
        for sig in (signal.SIGTERM, signal.SIGINT):
            with contextlib.suppress(ValueError, RuntimeError, NotImplementedError):
                loop.add_signal_handler(sig, self._stop)
                handled.append(sig)
        try:
            self._spawn()
            await self._await_hellos()
            if not self.stopping:
                self.on_ready(self.ready_info())
                await self._run_epochs()
        finally:
            for sig in handled:
                loop.remove_signal_handler(sig)
            server.close()
            self._shutdown()
            await asyncio.sleep(0)  # let the connection handlers see their closed sockets
        return self.stopping

    # -- reporting ------------------------------------------------------------------------------------------------

    def controllers(self) -> list[dict]:
        names = self.net.wan.nodes
        return [{"slice": slot.slice, "pid": slot.proc.pid if slot.proc else None,
                 "nodes": [names[v] for v in slot.nodes], "paths": len(slot.paths),
                 "died_at_epoch": slot.died_at, "how": slot.how} for slot in self.slots]

    def ready_info(self) -> dict:
        return {"event": "ready", "host": HOST, "port": self.port, "topology": self.setup.topology,
                "slicer": self.slicer,
                "controllers": [{k: c[k] for k in ("slice", "pid", "nodes")} for c in self.controllers()]}


def serve_te(setup, *, slicer: Slicer | str = Slicer.RANDOMIZED, epochs: int = 20, interval: float = 0.5,
             kill: int | None = None, kill_at: int | None = None, port: int = 0, allocations=None,
             on_ready: Callable[[dict], None] = lambda info: None,
             on_epoch: Callable[[dict], None] = lambda row: None,
             on_event: Callable[[dict], None] = lambda event: None) -> ServeRun:
    """Run the network and one controller process per slice for ``epochs`` epochs ``interval`` seconds
    apart (0: until SIGTERM / SIGINT, cycling through CYCLE traffic matrices); ``kill``/``kill_at``:
    SIGKILL that slice's controller at the start of that epoch. Every input is checked before any
    process starts; every controller is stopped and reaped before this returns or raises.

    ``setup`` is a ``te.prepare.TeSetup`` (its ``matrices`` is replaced by ``epochs`` or CYCLE).
    ``allocations``: a file to write every allocation the network used, one JSON line each
    (``{"epoch", "slice", "paths": [owned path indices], "flows": [...]}``), to audit the metrics."""
    from lightrail.te.prepare import prepare
    from lightrail.te.slicing import slice_nodes

    slicer = Slicer.parse(slicer)
    check_serve(seed=setup.seed, slices=setup.slices, epochs=epochs, interval=interval, kill=kill, kill_at=kill_at,
                port=port)
    setup = replace(setup, matrices=epochs or CYCLE)
    net = prepare(setup)
    weights = net.node_traffic()
    slice_of = slice_nodes(slicer, net.wan, setup.slices, weights, seed=setup.seed)
    if kill is not None and kill_at is None:
        kill_at = epochs // 2 if epochs else CYCLE // 2
    record = None
    if allocations is not None:
        try:
            record = open(allocations, "w")  # noqa: SIM115 - closed below, whatever happens
        except OSError as e:
            raise ScenarioError(f"cannot write {str(allocations)!r}: {e.strerror or e}", field="--allocations",
                                fix="give a writable file path") from None
    network = _Network(setup, net, slice_of, slicer=slicer.value, epochs=epochs, interval=interval, kill=kill,
                       kill_at=kill_at, port=port, on_ready=on_ready, on_epoch=on_epoch, on_event=on_event,
                       record=record)
    try:
        stopped = asyncio.run(network.run())
    finally:
        if record is not None:
            record.close()
    shares = np.bincount(slice_of, weights=weights, minlength=setup.slices) / weights.sum()
    paths = net.paths
    return ServeRun(
        topology=setup.topology, network={**net.wan.describe(), "demands": paths.demands, "paths": paths.paths},
        slices=setup.slices, slicer=slicer.value, port=network.port, controllers=network.controllers(),
        epochs=network.rows, blast_radius={s: float(v) for s, v in enumerate(shares)},
        setup={"lambda": setup.lam, "perturbation": setup.perturbation, "objective": setup.objective.value,
               "paths_per_demand": setup.k, "load": setup.load, "seed": setup.seed, "interval_s": interval,
               "kill": kill, "kill_at": kill_at if kill is not None else None},
        stopped=stopped)
