"""Start n CPU processes joined in a process group on loopback, run a function, collect results.

The default group is gloo unless the caller names another backend; ``init`` (a picklable callable
taking no arguments) runs in every worker before ``init_process_group``, e.g. to register a custom
backend, and what it returns reaches ``fn`` as its ``context`` argument: workers get their state
through arguments (``functools.partial(torch_backend.setup, config)`` hands each its backend agent),
never through the environment. The launcher sets only ``GLOO_SOCKET_IFNAME=lo``, for loopback.

``run_elastic`` is the launcher for jobs that survive a dead worker: it hosts the TCPStore itself (so no
rank's death takes the rendezvous away), starts idle spares beside the ranks, watches every process and,
when one dies, names the spare that takes its rank over (a :class:`Notice` in the store); the workers
rebuild their groups under the next generation's store prefix.
"""

from __future__ import annotations

import ctypes
import dataclasses
import json
import multiprocessing.connection as mp_connection
import os
import pickle
import select
import signal
import socket
import sys
import threading
import time
import traceback
from collections.abc import Callable
from dataclasses import dataclass
from datetime import timedelta
from multiprocessing.managers import SyncManager
from typing import Any

import torch.distributed as dist
import torch.multiprocessing as mp

from lightrail.errors import InfeasibleError, LightrailError

__all__ = ["die_with", "die_with_parent", "free_port", "process_context", "run_processes", "run_elastic", "Elastic",
           "Notice", "torchrun_layout", "EMULATED_GPUS_PER_SERVER"]

EMULATED_GPUS_PER_SERVER = 2
"""GPUs per emulated server when every process runs on one machine: small, so that a job of a few processes
still spans servers and its data-parallel (and pipeline) groups cross the rails through the controller."""


def torchrun_layout(world: int, *, local_world: int | None = None, gpus_per_server: int | None = None,
                    tp: int | None = None, pp: int = 1):
    """The rank layout of a job of ``world`` processes, ``local_world`` per machine (torchrun's
    ``LOCAL_WORLD_SIZE``), in which ranks cross rails.

    ``gpus_per_server`` default: one machine per server when the job spans machines; when it all runs on one
    machine, servers of :data:`EMULATED_GPUS_PER_SERVER` (1 for an odd world), since one server holding every
    rank would keep all traffic on NVLink and no group would ever ask the controller for a circuit. ``tp``
    default: a server's GPUs (TP inside a server, as Megatron places it); DP is the rest, across servers.

    >>> str(torchrun_layout(8, local_world=8))
    'TP2 x DP4'
    >>> torchrun_layout(8, local_world=8).servers
    4
    """
    from lightrail.workload.parallel import Layout

    if gpus_per_server is None:
        if local_world is not None and 0 < local_world < world:
            gpus_per_server = local_world
        else:
            gpus_per_server = EMULATED_GPUS_PER_SERVER if world % EMULATED_GPUS_PER_SERVER == 0 else 1
    return Layout.from_degrees(world, tp=gpus_per_server if tp is None else tp, pp=pp,
                               gpus_per_server=gpus_per_server)


def _prctl():
    try:
        return ctypes.CDLL(None, use_errno=True).prctl if sys.platform.startswith("linux") else None
    except (OSError, AttributeError):
        return None


_PRCTL = _prctl()  # looked up here: a preexec_fn runs in a forked child, where loading a library may deadlock


def die_with_parent() -> None:
    """Linux: this process gets SIGKILL when its parent dies, however it dies (SIGKILL too), so a killed launcher
    leaves no worker or controller running on (issue 31 item 6). Elsewhere, nothing. Safe as a ``preexec_fn``.

    The kernel sends it when the *thread* that started the process ends, not only the process: a child started
    from a helper thread that ends first must not use it (``start_controller`` skips it for a restart from
    ``ControllerKiller``'s thread)."""
    if _PRCTL is not None:
        _PRCTL(1, 9)  # PR_SET_PDEATHSIG, SIGKILL


def die_with(pid: int) -> None:
    """This process is killed (SIGKILL) when process ``pid`` ends, however it ends: a worker watches its launcher,
    which is not its parent (the fork server is, and it outlives the launcher while any worker holds its keep-alive
    pipe), so a launcher killed outright takes its workers along (issue 31 item 6). A daemon thread waits on the
    launcher's pidfd (Linux 5.3+); elsewhere, nothing, as :func:`die_with_parent`."""
    try:
        fd = os.pidfd_open(pid)
    except (AttributeError, OSError):
        return

    def watch() -> None:
        select.select([fd], [], [])
        os.kill(os.getpid(), signal.SIGKILL)

    threading.Thread(target=watch, name=f"die-with-{pid}", daemon=True).start()


def free_port() -> int:
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


PRELOAD = ("numpy", "torch", "torch.distributed")
"""What the fork server imports once, before it forks any worker."""


def process_context():
    """The multiprocessing context every launcher here starts its workers with: ``forkserver``, whose server
    imports torch once (:data:`PRELOAD`), so a worker starts as a fork of it instead of a new interpreter
    importing torch again (1.2 s of CPU each, measured here; a failover run starts 17 such processes on 2 cores).
    As with ``spawn``, a worker shares nothing with its caller but its arguments: the server is a fresh
    process that has run nothing but those imports (forking the caller itself would copy its threads' locks).
    A worker's parent is the server, so it watches its launcher itself (:func:`die_with`)."""
    ctx = mp.get_context("forkserver")
    ctx.set_forkserver_preload(list(PRELOAD))
    return ctx


def _worker(rank: int, n: int, port: int, fn: Callable, args: tuple, results, backend: str = "gloo",
            init: Callable[[], Any] | None = None, pg_options: Any = None, launcher: int | None = None) -> None:
    die_with(launcher if launcher is not None else os.getppid())
    os.environ.setdefault("GLOO_SOCKET_IFNAME", "lo")
    context = init() if init is not None else None
    options = {} if pg_options is None else {"pg_options": pg_options}
    dist.init_process_group(backend, init_method=f"tcp://127.0.0.1:{port}", rank=rank, world_size=n, **options)
    try:
        results[rank] = fn(rank, n, *args) if context is None else fn(rank, n, *args, context=context)
    except LightrailError as e:  # handed to the parent, which raises it as one line (no worker traceback)
        results[-1 - rank] = (type(e).__name__, e.message, e.field, e.fix)
    finally:
        dist.destroy_process_group()


def _raise_worker_error(results) -> None:
    """The first LightrailError a worker handed back (see ``_worker``), raised in the parent."""
    import lightrail.errors

    failed = sorted(k for k in results.keys() if k < 0)
    if failed:
        name, message, field, fix = results[failed[-1]]
        cls = getattr(lightrail.errors, name, None)
        cls = cls if isinstance(cls, type) and issubclass(cls, LightrailError) and name != "VerificationError" \
            else LightrailError
        raise cls(message, field=field, fix=fix)


def run_processes(fn: Callable, n: int, *args, backend: str = "gloo", init: Callable[[], Any] | None = None,
                  pg_options: Any = None) -> list:
    """Run ``fn(rank, n, *args)`` in n worker processes (:func:`process_context`); returns each rank's
    (picklable) result.

    Parameters
    ----------
    backend : the default group's torch.distributed backend ("gloo", or a name ``init`` registers).
    init : picklable callable with no arguments run in each worker before ``init_process_group``; if it
        returns something (not None), ``fn`` gets it as keyword ``context``.
    pg_options : passed to ``init_process_group`` as ``pg_options`` when not None (must pickle).
    """
    ctx = process_context()
    launcher = os.getpid()  # the workers and the results' manager die with it (their parent is the fork server)
    manager = SyncManager(ctx=ctx)
    manager.start(die_with, (launcher,))
    with manager:
        results = manager.dict()
        try:
            mp.start_processes(_worker, args=(n, free_port(), fn, args, results, backend, init, pg_options, launcher),
                               nprocs=n, join=True, start_method=ctx.get_start_method())
        except (mp.ProcessRaisedException, mp.ProcessExitedException):
            _raise_worker_error(results)  # a rank's peers fail after it (their gloo peer is gone): its error wins
            raise
        _raise_worker_error(results)
        return [results[r] for r in range(n)]


@dataclass(frozen=True)
class Notice:
    """What the launcher tells the workers when a process died: the logical rank it held and the spare
    (process index) that takes it over, or None when no spare is left. ``generation`` numbers the
    process groups (0 at start; each failure starts the next), ``t_detected`` is wall-clock time."""

    generation: int
    rank: int
    spare: int | None
    t_detected: float


class Elastic:
    """A worker's handle on the launcher (see :func:`run_elastic`): the TCPStore the parent hosts, so no
    rank's death takes it away; process groups of generation g live under the store prefix ``g<g>/``."""

    def __init__(self, store_port: int, proc: int, world: int, spares: int, timeout_s: float):
        self.proc, self.world, self.spares, self.timeout_s = proc, world, spares, timeout_s
        self.store = dist.TCPStore("127.0.0.1", store_port, is_master=False, timeout=timedelta(seconds=60))

    @property
    def spare(self) -> bool:
        return self.proc >= self.world

    def init_group(self, backend: str, rank: int, generation: int, **kwargs) -> None:
        """The default process group of ``generation`` (its own store prefix: a new rendezvous)."""
        store = dist.PrefixStore(f"g{generation}/", self.store)
        dist.init_process_group(backend, store=store, rank=rank, world_size=self.world,
                                timeout=timedelta(seconds=self.timeout_s), **kwargs)

    def notice(self, generation: int, timeout_s: float = 60.0) -> Notice:
        """Block until the launcher announces the failure that starts ``generation``."""
        key = f"notice/{generation}"
        try:
            self.store.wait([key], timedelta(seconds=timeout_s))
        except dist.DistStoreError:  # no process died: nothing will be announced
            raise InfeasibleError(f"no process failed within {timeout_s:g} s (no failover notice {generation})",
                                  field="--spares") from None
        return Notice(**json.loads(self.store.get(key)))

    def report_failed(self, rank: int, generation: int) -> None:
        """The controller failed ``rank`` (its heartbeats stopped) while its process may still live (hung,
        SIGSTOP): the launcher kills it, then announces the failure as for a process that died."""
        self.store.set(f"failed/{rank}/{generation}", "1")

    def mark(self, what: str, value=None) -> None:
        """Record a wall-clock event (``value`` defaults to now), e.g. the moment a rank is killed."""
        self.store.append("marks", json.dumps({what: time.time() if value is None else value}) + "\n")


def _elastic_worker(proc: int, world: int, spares: int, store_port: int, timeout_s: float, fn: Callable, args: tuple,
                    init: Callable[[], Any] | None, launcher: int) -> None:
    die_with(launcher)
    os.environ.setdefault("GLOO_SOCKET_IFNAME", "lo")
    elastic = Elastic(store_port, proc, world, spares, timeout_s)
    try:
        context = init() if init is not None else None
        result = fn(proc, world, *args, context=context, elastic=elastic)
        elastic.store.set(f"result/{proc}", pickle.dumps(result))
    except LightrailError as e:
        elastic.store.set(f"error/{proc}", pickle.dumps((type(e), (e.message,), {"field": e.field, "fix": e.fix})))
    except BaseException:  # noqa: BLE001 (handed to the parent, which raises it)
        elastic.store.set(f"error/{proc}", pickle.dumps((RuntimeError, (traceback.format_exc(),), {})))


def run_elastic(fn: Callable, world: int, spares: int, *args, init: Callable[[], Any] | None = None,
                timeout_s: float = 30.0, join_s: float = 600.0) -> tuple[list, list[Notice], dict[str, float]]:
    """Run ``fn(proc, world, *args, context=..., elastic=...)`` in ``world + spares`` spawned processes:
    ``world`` ranks and ``spares`` idle spares (process index ``world + i``). The parent hosts the
    TCPStore and watches the processes: when one dies before finishing, it announces a :class:`Notice`
    (the lowest unused spare takes its rank — the rule the controller applies too) and the survivors
    rebuild their groups in the next generation. With no spare left it ends every process and raises
    ``InfeasibleError`` (one line: which rank failed).

    Returns each logical rank's result (from whichever process held that rank at the end), the notices,
    and the wall-clock marks the workers recorded (``Elastic.mark``)."""
    ctx = process_context()
    store = dist.TCPStore("127.0.0.1", 0, is_master=True, wait_for_workers=False, timeout=timedelta(seconds=60))
    launcher = os.getpid()  # each worker dies with it (its parent is the fork server)
    procs = [ctx.Process(target=_elastic_worker, args=(p, world, spares, store.port, timeout_s, fn, args, init,
                                                       launcher), daemon=True) for p in range(world + spares)]
    for p in procs:
        p.start()
    holder = list(range(world))  # logical rank -> process index
    idle = list(range(world, world + spares))
    notices: list[Notice] = []
    deadline = time.monotonic() + join_s
    over = False
    try:
        running = {p.sentinel: i for i, p in enumerate(procs)}
        while running:
            if not over and not any(procs[i].sentinel in running for i in holder):
                over = True  # every rank finished: idle spares are told the job is over (rank -1)
                store.set(f"notice/{len(notices) + 1}", json.dumps(
                    dataclasses.asdict(Notice(len(notices) + 1, -1, None, time.time()))))
            left = deadline - time.monotonic()
            if left <= 0:
                raise InfeasibleError(f"the job did not finish within {join_s:g} s", field="--steps",
                                      fix="run fewer steps")
            for r, i in enumerate(holder):  # a hung rank the controller failed (heartbeats): end it for good
                if store.check([f"failed/{r}/{len(notices)}"]) and procs[i].is_alive():
                    procs[i].kill()
            for sentinel in mp_connection.wait(list(running), timeout=min(left, 0.05)):
                i = running.pop(sentinel)
                procs[i].join()
                if _finished(store, i):
                    continue
                t_detected = time.time()
                if i not in holder:  # an idle spare died: nothing to take over
                    idle = [s for s in idle if s != i]
                    continue
                rank = holder.index(i)
                spare = idle.pop(0) if idle else None
                notice = Notice(len(notices) + 1, rank, spare, t_detected)
                notices.append(notice)
                store.set(f"notice/{notice.generation}", json.dumps(dataclasses.asdict(notice)))
                if spare is None:
                    raise InfeasibleError(f"rank {rank} failed and no spare is left", field="--spares",
                                          fix="start the job with (more) --spares")
                holder[rank] = spare
        for i in holder:
            _raise_error(store, i)
        for i in idle:  # spares never used end with nothing to report; an error they hit is still one
            _raise_error(store, i)
        results = [pickle.loads(store.get(f"result/{i}")) for i in holder]
        marks = {}
        if store.check(["marks"]):
            for line in store.get("marks").decode().splitlines():
                marks.update(json.loads(line))
        return results, notices, marks
    finally:
        for p in procs:
            if p.is_alive():
                p.kill()
        for p in procs:
            p.join(5)


def _finished(store, proc: int) -> bool:
    return store.check([f"result/{proc}"]) or store.check([f"error/{proc}"])


def _raise_error(store, proc: int) -> None:
    if store.check([f"error/{proc}"]):
        kind, args, extra = pickle.loads(store.get(f"error/{proc}"))
        raise kind(*args, **extra)
