"""OCS controller benchmark: start-up time, and request-to-acknowledge latency of ``acquire`` with 8 and
64 ranks on loopback, without OCS delay (``--ocs-delay 0``). Prints one JSON object; asserts nothing about speed.

Run: .venv/bin/python benchmarks/bench_controller.py [--rounds 300]
     .venv/bin/python benchmarks/bench_controller.py --ranks 1024 [--rounds 50] [--native-floor]
                        [--frontend auto|loop|native] [--emulated-ranks auto|native|python] [--pin auto|on|off]
     .venv/bin/python benchmarks/bench_controller.py --ranks 1024 --sweep   # latency against offered load
     .venv/bin/python benchmarks/bench_controller.py --grant-latency [--rounds 200] [--ocs-delay 2ms]

``--grant-latency`` runs only :func:`grant_latency`: the train-demo's job (8 ranks on 4 servers, 2 rails, leases on)
as 8 client processes against a controller with a 2 ms OCS, and prints the controller's grant latency by kind
(``grant_latency_s``: lit, revoke, switch, switch_overhead and its two parts switch_lag_before, ready to the switch's
start, and switch_lag_after, the switch's end to the grant), the revoke round trip (``revoke_rtt_s``) and the ranks'
check-in round trip (``check_in_rtt_s``), each as p50 and p90 in seconds.

By default ``--ranks N`` measures the controller as it is configured for that scale, on a load generator that
leaves it the CPU: the native front end, the native emulated ranks, and the controller alone on one CPU with the
rest of the run on the others (each where this machine can: Linux, a C compiler, 2 CPUs; else the loop front end,
the Python ranks, unpinned). The JSON says which (``frontend``, ``emulated_ranks``, ``pinned``);
``--frontend loop --emulated-ranks python --pin off`` is the all-Python run.

``--ranks N`` (issue 17's contract: prints ``p99_s`` and ``dropped``, with ``p50_s``, ``rate_per_s``, ``ranks``,
``groups``): N emulated ranks on loopback, one connection each, in 64-port rails (N/2 pair groups whose circuits are
lit after the first round: the skip-if-present path). Every pair runs its own loop at full rate (both members
acquire, then both release) for the warm-up plus ``--rounds`` rounds (``--pace``: seconds of "compute" between a
pair's rounds; ``--client-procs`` processes share the ranks, one asyncio loop each), while every rank also sends a
heartbeat when it sent nothing for 0.5 s (heartbeat_timeout / 4; any request is a sign of life). An acquire is
dropped if it gets an error or no reply within 10 s; the run is bounded by ``--time-limit`` seconds.
``controller_cpu_us_per_request`` (the controller's user+system CPU time over the requests it handled) does not
depend on what else the machine runs; the latencies do (on a shared 2-core machine they are an upper bound).
The emulated ranks are callbacks on uvloop (no task or future per request), since they share the cores with the
controller. At full rate every rank always has a request outstanding, so by Little's law a request waits about
N / (requests per second): the latency measures the machine's throughput. ``floor`` (skip: ``--no-floor``) is
the same run against the least a server can do (parse each line, answer, pair the acquires; no identity, state,
safety or metrics): the latency any Python server on uvloop gets from this machine and these clients.
``--native-ranks`` (``--emulated-ranks native``) runs the same pair loops in ``native/emulated_ranks.c`` (compiled
with the machine's ``cc``) on connections this script opened and greeted: a few microseconds of CPU per request
instead of 12-17, so on a 2-core machine the figures are the server's more than the emulator's. ``--native-floor``
also runs the same clients against ``native/floor_server.c`` (the floor's work in one C epoll loop: no interpreter,
no state beyond the waiting acquires), reported as ``native_floor``: what a native data plane's socket loop could
reach here, the kernel's loopback send and receive being all it pays for. ``--frontend native`` starts the
controller with its C connection concentrator (``controller serve --frontend native``), whose CPU is reported apart
(``frontend_cpu_us_per_request``). ``--pin`` (see :class:`Pinning`) runs the server under test (the controller, or a
floor) alone on one CPU.
``--sweep`` runs the Python ranks at a series of paces up to full rate, each on a fresh controller, and reports the
highest acquire rate whose p99 met the 20 ms target (out/bench/controller-load{,-native}.{json,png}, by front end).

Layout: rank r has NIC port r % 8 on rail r // 8 (8 ranks per rail, like GPU-local NICs of a rail-optimized
cluster; 8 ranks use rail0 only, 64 ranks use rail0..rail7). Ranks are grouped in pairs on their rail, like
DP pairs: set A = (0,1), (2,3), ... of each rail. Every round all ranks acquire their pair's group, wait for
the grant, then release it. In the ``flip`` variant the rounds alternate between set A and set B = (1,2),
(3,4), ..., (7,0) of each rail, whose circuits conflict with A's, so every round reconfigures every rail
(still with zero delay): this measures the reconfiguration path (change sets, busy-port checks, the SQLite
commit of the new circuits, the apply task).

Latency of one acquire = time from writing its request to reading its reply, so it includes the wait for
the pair's other member (both are sent back to back) and the queueing behind the other ranks' requests of
the same round (all ranks ask at once: the worst case for a controller that serves them one at a time).

Clients: one asyncio event loop with one TCP connection per rank (the same JSON-lines protocol as
ControllerClient). On a 2-core machine the controller process needs one core; 64 client threads (one
blocking ControllerClient each) would contend for the other core and for the GIL, and the time a woken
thread waits for the GIL would be counted as controller latency. A single loop sends all requests of a
round back to back and timestamps each reply as soon as it is read, which loads the controller at least as
hard (every rank at once) with a much smaller client-side error. For comparison, ``threads_64`` runs the
same rounds with 64 threads and blocking ControllerClient connections.
"""

from __future__ import annotations

import argparse
import array
import asyncio
import contextlib
import json
import os
import platform
import signal
import socket
import statistics
import subprocess
import sys
import tempfile
import threading
import time
from pathlib import Path

import httpx

from lightrail.runtime.controller.client import ControllerClient
from lightrail.runtime.controller.server import event_loop_run

RAIL_WIDTH = 8  # ranks (NIC ports) per rail
OUT = Path("out/bench")


def _command(state: Path, delay: str = "0", extra: tuple[str, ...] = ()) -> list[str]:
    exe = Path(sys.executable).with_name("lightrail")
    base = [str(exe)] if exe.exists() else [sys.executable, "-m", "lightrail.cli"]
    return [*base, "controller", "serve", "--port", "0", "--admin-port", "0", "--ocs-delay", delay,
            "--state", str(state), *extra]


def _start(state: Path, extra: tuple[str, ...] = (), delay: str = "0") -> tuple[subprocess.Popen, dict, float]:
    """Spawn the controller (its JSON log goes to ``<state>.log``); wall time from Popen to the ready line."""
    with open(state.with_suffix(".log"), "w") as log:
        start = time.perf_counter()
        proc = subprocess.Popen(_command(state, delay, extra), stdout=subprocess.PIPE, stderr=log, text=True)
    line = proc.stdout.readline()
    wall = time.perf_counter() - start
    if not line:
        raise RuntimeError(f"controller exited with {proc.wait()} before it was ready")
    return proc, json.loads(line), wall


def _log_tail(state: Path, lines: int = 5) -> list[str]:
    text = state.with_suffix(".log").read_text().splitlines()
    return [line for line in text if '"reconfigure"' not in line][-lines:]


def _stop(proc: subprocess.Popen) -> int:
    proc.send_signal(signal.SIGTERM)
    try:
        return proc.wait(15)
    except subprocess.TimeoutExpired:
        proc.kill()
        return proc.wait()


def startup(tmp: Path, runs: int = 3) -> dict:
    walls, reported = [], []
    for i in range(runs):
        proc, info, wall = _start(tmp / f"startup{i}.db")
        walls.append(wall)
        reported.append(info["startup_s"])
        _stop(proc)
    median = statistics.median(walls)
    return {"runs": runs, "wall_s": [round(w, 3) for w in walls], "median_s": round(median, 3),
            "controller_reported_startup_s": reported, "target_s": 2.0, "meets_target": median < 2.0}


# --- layout ---------------------------------------------------------------------------------------------


def _port(rank: int) -> tuple[str, int]:
    return f"rail{rank // RAIL_WIDTH}", rank % RAIL_WIDTH


def _pairs(n: int, shift: int) -> list[tuple[int, int]]:
    """Pairs of ranks on each rail: (0,1), (2,3), ... (shift 0) or (1,2), ..., (7,0) (shift 1)."""
    out = []
    for base in range(0, n, RAIL_WIDTH):
        width = min(RAIL_WIDTH, n - base)
        out += [(base + (k + shift) % width, base + (k + shift + 1) % width) for k in range(0, width, 2)]
    return out


def _groups(n: int, flip: bool) -> list[dict[int, tuple[str, list[int], dict]]]:
    """Per set (A, and B if flip): rank -> (key, members, circuits) of its pair's group."""
    sets = []
    for name, shift in (("A", 0), ("B", 1))[: 2 if flip else 1]:
        by_rank = {}
        for a, b in _pairs(n, shift):
            (rail, pa), (_, pb) = _port(a), _port(b)
            group = (f"{name}{a}-{b}", sorted([a, b]), {rail: {str(pa): pb, str(pb): pa}})
            by_rank[a] = by_rank[b] = group
        sets.append(by_rank)
    return sets


def _summary(latencies: list[float]) -> dict:
    lat = sorted(latencies)
    q = lambda p: lat[min(len(lat) - 1, int(p * len(lat)))] * 1e3  # noqa: E731
    return {"acquires": len(lat), "p50_ms": round(q(0.50), 3), "p99_ms": round(q(0.99), 3),
            "max_ms": round(lat[-1] * 1e3, 3), "mean_ms": round(statistics.fmean(lat) * 1e3, 3)}


def _register(info: dict, job: str, world: int) -> str:
    """Register ``job`` with the operator token of the ready line; its ranks' token."""
    admin = f"http://{info['host']}:{info['admin_port']}"
    r = httpx.post(f"{admin}/jobs", json={"job": job, "world": world},
                   headers={"Authorization": f"Bearer {info['operator_token']}"}, timeout=10)
    r.raise_for_status()
    return r.json()["token"]


def _controller_metrics(admin: str) -> dict:
    text = httpx.get(f"{admin}/metrics", timeout=10).text
    values = {}
    for line in text.splitlines():
        if line and not line.startswith("#"):
            name, value = line.rsplit(" ", 1)
            values[name] = float(value)
    names = {f"p{round(float(q) * 100)}_ms": f'lightrail_acquire_latency_seconds{{quantile="{q}"}}'
             for q in ("0.5", "0.9", "0.99")}
    quantiles = {k: round(values[name] * 1e3, 3) for k, name in names.items() if name in values}
    return {"acquire_latency": {**quantiles, "count": int(values["lightrail_acquire_latency_seconds_count"])},
            "reconfigurations": int(sum(v for k, v in values.items()
                                        if k.startswith("lightrail_reconfigurations_total"))),
            "grants": int(values["lightrail_grants_total"]),
            "grants_without_change": int(values["lightrail_grants_without_change_total"]),
            "unsafe_reconfigurations": int(values["lightrail_unsafe_reconfigurations_total"]),
            "rank_failures": int(values.get("lightrail_rank_failures_total", 0)),
            "connection_timeouts": int(values.get("lightrail_connection_timeouts_total", 0))}


# --- asyncio client: one connection per rank -------------------------------------------------------------


class _Lines(asyncio.Protocol):
    """A JSON-lines connection with TCP_NODELAY (the emulated ranks' and the floor server's): each whole line
    read is decoded and handed to ``message`` with the time it was read."""

    buf = b""
    writer: asyncio.Transport | None = None

    def connection_made(self, transport: asyncio.Transport) -> None:
        self.writer = transport
        transport.get_extra_info("socket").setsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY, 1)

    def data_received(self, data: bytes) -> None:
        now = time.perf_counter()
        lines = (self.buf + data).split(b"\n")
        self.buf = lines.pop()
        for line in lines:
            self.message(json.loads(line), now)

    def message(self, message: dict, now: float) -> None:
        raise NotImplementedError


class _Rank(_Lines):
    """One emulated rank's connection, as an asyncio Protocol: a reply is matched to its request in
    ``data_received`` and timestamped there (a StreamReader task per rank would add a task wake-up per reply,
    client-side time the latencies would count against the controller)."""

    def __init__(self, rank: int):
        self.rank = rank
        self.next_id = 0
        self.waiting: dict[int, tuple[float, asyncio.Future]] = {}  # id -> (sent, its future)

    def message(self, reply: dict, now: float) -> None:
        entry = self.waiting.pop(reply.get("id"), None)  # None: a push, or a request already timed out
        if entry is not None and not entry[1].done():
            entry[1].set_result((now, reply))

    def connection_lost(self, exc) -> None:
        for _, fut in self.waiting.values():  # the controller closed the connection (or died), or we did
            if not fut.done():
                fut.set_exception(ConnectionError(f"rank {self.rank}: the connection closed"))
                fut.exception()  # a heartbeat's future is awaited by nobody: no "never retrieved" warning
        self.waiting.clear()

    def expire(self, before: float) -> int:
        """Fail the requests sent before ``before`` that got no reply (dropped); how many."""
        late = [i for i, (sent, _) in self.waiting.items() if sent < before]
        for i in late:
            fut = self.waiting.pop(i)[1]
            if not fut.done():
                fut.set_exception(TimeoutError(f"rank {self.rank}: no reply to request {i}"))
                fut.exception()
        return len(late)

    def send(self, op: str, **fields) -> tuple[float, asyncio.Future]:
        if self.writer.is_closing():
            raise ConnectionError(f"rank {self.rank}: the connection is closed")
        self.next_id += 1
        fut = asyncio.get_running_loop().create_future()
        data = json.dumps({"id": self.next_id, "op": op, **fields}, separators=(",", ":")).encode() + b"\n"
        sent = time.perf_counter()
        self.waiting[self.next_id] = (sent, fut)
        self.writer.write(data)
        return sent, fut


async def _connect(info: dict, rank: int) -> _Rank:
    _, rk = await asyncio.get_running_loop().create_connection(lambda: _Rank(rank), info["host"], info["port"])
    return rk


async def _call(client: _Rank, op: str, **fields) -> dict:
    _, fut = client.send(op, **fields)
    _, reply = await fut
    if not reply["ok"]:
        raise RuntimeError(reply["error"])
    return reply


async def _run_async(info: dict, n: int, rounds: int, flip: bool, warmup: int) -> dict:
    job = "bench"
    token = _register(info, job, n)
    ranks = [await _connect(info, r) for r in range(n)]
    for rk in ranks:
        rail, port = _port(rk.rank)
        await _call(rk, "hello", job=job, rank=rk.rank, world=n, ports={rail: port}, token=token)
    sets = _groups(n, flip)
    for by_rank in sets:
        for key, members, circuits in {g[0]: g for g in by_rank.values()}.values():
            await _call(ranks[members[0]], "group", job=job, key=key, phase="dp", members=members, circuits=circuits)
    latencies, round_s = [], []
    for i in range(warmup + rounds):
        by_rank = sets[i % len(sets)]
        start = time.perf_counter()
        sent = [rk.send("acquire", job=job, rank=rk.rank, key=by_rank[rk.rank][0]) for rk in ranks]
        replies = await asyncio.gather(*(fut for _, fut in sent))
        end = time.perf_counter()
        assert all(reply["ok"] for _, reply in replies), replies
        if i >= warmup:
            latencies += [got - t for (t, _), (got, _) in zip(sent, replies, strict=True)]
            round_s.append(end - start)
        released = [rk.send("release", job=job, rank=rk.rank, key=by_rank[rk.rank][0])[1] for rk in ranks]
        assert all(reply["ok"] for _, reply in await asyncio.gather(*released))
    for rk in ranks:
        rk.writer.close()
    return {**_summary(latencies), "round_median_ms": round(statistics.median(round_s) * 1e3, 3)}


# --- threads + blocking ControllerClient (for comparison) -------------------------------------------------


def _run_threads(info: dict, n: int, rounds: int, flip: bool, warmup: int) -> dict:
    job = "bench-threads"
    token = _register(info, job, n)
    clients = [ControllerClient(info["host"], info["port"], job=job, rank=r, timeout=60, token=token)
               for r in range(n)]
    for r, c in enumerate(clients):
        rail, port = _port(r)
        c.hello(n, {rail: port})
    sets = _groups(n, flip)
    for by_rank in sets:
        for key, members, circuits in {g[0]: g for g in by_rank.values()}.values():
            clients[members[0]].declare(key, members, {d: {int(i): o for i, o in c.items()}
                                                       for d, c in circuits.items()}, phase="dp")
    barrier = threading.Barrier(n)
    latencies: list[list[float]] = [[] for _ in range(n)]
    errors = []

    def rank_loop(r: int) -> None:
        try:
            for i in range(warmup + rounds):
                key = sets[i % len(sets)][r][0]
                barrier.wait()
                t = time.perf_counter()
                clients[r].acquire(key)
                if i >= warmup:
                    latencies[r].append(time.perf_counter() - t)
                barrier.wait()
                clients[r].release(key)
        except Exception as e:  # noqa: BLE001 (reported)
            errors.append(repr(e))
            barrier.abort()

    threads = [threading.Thread(target=rank_loop, args=(r,)) for r in range(n)]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    for c in clients:
        c.close()
    if errors:
        raise RuntimeError(errors[0])
    return _summary([x for lat in latencies for x in lat])


def scenario(tmp: Path, name: str, n: int, rounds: int, *, flip: bool, threads: bool = False,
             warmup: int = 20) -> dict:
    proc, info, _ = _start(tmp / f"{name}.db")
    try:
        admin = f"http://{info['host']}:{info['admin_port']}"
        if threads:
            client = _run_threads(info, n, rounds, flip, warmup)
        else:
            client = asyncio.run(asyncio.wait_for(_run_async(info, n, rounds, flip, warmup), 600))
        controller = _controller_metrics(admin)
    except Exception as e:  # noqa: BLE001 (reported in the JSON, with the controller's last log lines)
        returncode = proc.poll()
        _stop(proc)
        return {"ranks": n, "rounds": rounds, "pairs_flip_each_round": flip, "error": repr(e),
                "controller_returncode": returncode, "controller_log_tail": _log_tail(tmp / f"{name}.db"),
                **({"target_p99_ms": 5.0, "meets_target": False} if n == 64 and not threads else {})}
    rc = _stop(proc)
    out = {"ranks": n, "rounds": rounds, "warmup_rounds": warmup, "pairs_flip_each_round": flip,
           "client": "threads+ControllerClient" if threads else "asyncio, one connection per rank",
           "acquire_latency_client": client, "controller_metrics": controller, "controller_exit_code": rc}
    if n == 64 and not threads:
        out["target_p99_ms"] = 5.0
        out["meets_target"] = client["p99_ms"] < 5.0
    return out


# --- --ranks N: many ranks, every pair at full rate, with heartbeats --------------------------------------------

WIDE_RAIL = 64  # ports per rail in the --ranks mode (1,024 ranks: 16 rails of 64)
DROP_AFTER_S = 10.0  # an acquire not answered within this is counted as dropped


class _PairRank(_Lines):
    """One emulated rank of the ``--ranks`` run: its connection, driven by callbacks (no task, future or
    gather per request: the client processes share the 2 cores with the controller, so every microsecond
    they spend is latency the run would count against the controller). Requests are pre-formatted bytes;
    a reply is parsed and timestamped in ``data_received``, and handed to the rank's pair."""

    def __init__(self, rank: int, on_reply):
        self.rank, self.on_reply = rank, on_reply
        self.pending: tuple[int, float] | None = None  # (id, sent) of the request in flight
        self.next_id = 0
        self.sent = 0  # acquires and releases (the measured loop's requests)
        self.last_sent = time.perf_counter()
        self.replies: dict[int, asyncio.Future] = {}  # set-up calls (hello, group) awaited by id

    def message(self, reply: dict, now: float) -> None:
        rid = reply.get("id")
        fut = self.replies.pop(rid, None)
        if fut is not None:
            fut.set_result(reply)
        elif self.pending is not None and rid == self.pending[0]:
            sent = self.pending[1]
            self.pending = None
            self.on_reply(self, reply["ok"], now - sent)
        # else: a heartbeat's reply, a push, or the reply to a request already counted as dropped

    def connection_lost(self, exc) -> None:
        for fut in self.replies.values():
            if not fut.done():
                fut.set_exception(ConnectionError(f"rank {self.rank}: the connection closed"))
        if self.pending is not None:
            self.pending = None
            self.on_reply(self, False, None)

    def send(self, line: bytes, *numbers: int) -> None:
        """Send one request line formatted with a fresh id (the first ``%d`` in ``line``; ``numbers`` fill the
        others) and wait for its reply."""
        self.next_id += 1
        self.sent += 1
        self.last_sent = now = time.perf_counter()
        self.pending = (self.next_id, now)
        self.writer.write(line % (self.next_id, *numbers))

    def heartbeat(self) -> None:
        self.next_id += 1
        self.last_sent = time.perf_counter()
        self.writer.write(b'{"id":%d,"op":"heartbeat"}\n' % self.next_id)

    async def call(self, op: str, **fields) -> dict:
        self.next_id += 1
        fut = self.replies[self.next_id] = asyncio.get_running_loop().create_future()
        self.writer.write(json.dumps({"id": self.next_id, "op": op, **fields}, separators=(",", ":")).encode()
                          + b"\n")
        reply = await fut
        if not reply["ok"]:
            raise RuntimeError(reply["error"])
        return reply


class _Pair:
    """A pair's loop as a state machine: both acquire, both get the grant, both release, both get the reply,
    (``pace`` seconds of compute,) again; ``rounds`` times or until ``deadline``."""

    def __init__(self, job: str, a: int, b: int, rounds: int, warmup: int, pace: float, deadline: float,
                 latencies: list[float], counts: dict, done: asyncio.Future):
        self.rounds, self.warmup, self.pace, self.deadline = rounds, warmup, pace, deadline
        self.latencies, self.counts, self.done = latencies, counts, done
        key = f"p{a}"
        # ControllerClient's lines: an acquire carries its op number (the rank's n-th op on the key), a release not
        self.release = {r: b'{"id":%%d,"op":"release","job":"%s","rank":%d,"key":"%s"}\n' % (job.encode(), r,
                                                                                          key.encode()) for r in (a, b)}
        self.acquire = {r: line.replace(b'"release"', b'"acquire"').replace(b'}\n', b',"op_no":%d}\n')
                        for r, line in self.release.items()}
        self.members: list[_PairRank] = []
        self.round, self.phase, self.answered, self.got = 0, "acquire", 0, []

    def start(self) -> None:
        if self.round >= self.warmup + self.rounds or time.perf_counter() > self.deadline:
            self.done.set_result(None)
            return
        self.phase, self.answered, self.got = "acquire", 0, []
        for rk in self.members:
            rk.send(self.acquire[rk.rank], self.round + 1)

    def on_reply(self, rk: _PairRank, ok: bool, latency: float | None) -> None:
        if self.done.done():
            return
        self.answered += 1
        if self.phase == "acquire":
            if ok:
                self.got.append(latency)
            if self.answered < 2:
                return
            self.counts["dropped"] += 2 - len(self.got)
            if self.round >= self.warmup:
                self.latencies.extend(self.got)
            self.phase, self.answered = "release", 0
            for member in self.members:
                member.send(self.release[member.rank])
            return
        if self.answered < 2:
            return
        self.round += 1
        if self.pace:
            asyncio.get_running_loop().call_later(self.pace, self.start)  # the pair's compute between collectives
        else:
            self.start()

    def expire(self, before: float) -> None:
        """Count a request unanswered since ``before`` as dropped, and stop the pair (its loop cannot go on)."""
        if not self.done.done() and any(rk.pending is not None and rk.pending[1] < before for rk in self.members):
            self.counts["dropped"] += sum(rk.pending is not None for rk in self.members) if self.phase == "acquire" \
                else 0
            for rk in self.members:
                rk.pending = None
            self.done.set_result(None)


async def _many_part(info: dict, token: str, n: int, pairs: list[tuple[int, int]], rounds: int, warmup: int,
                     time_limit: float, pace: float, barrier, go) -> dict:
    """One client process's share of the ranks: connect, hello, declare its pairs' groups, wait for the other
    processes (``barrier``) and for the parent to start its measurement (``go``), then run every pair's loop; returns
    its latencies and counts."""
    job = "bench-many"
    loop = asyncio.get_running_loop()
    latencies: list[float] = []
    counts = {"dropped": 0, "heartbeats": 0}
    machines: list[_Pair] = []
    ranks: dict[int, _PairRank] = {}
    for a, b in pairs:
        pair = _Pair(job, a, b, rounds, warmup, pace, 0.0, latencies, counts, loop.create_future())
        machines.append(pair)
        for r in (a, b):
            ranks[r] = _PairRank(r, pair.on_reply)

    async def heartbeats() -> None:  # a heartbeat for every rank that sent nothing for 0.5 s (any request is a
        while True:                   # sign of life), and pairs with a request unanswered for DROP_AFTER_S stopped
            now = time.perf_counter()
            for pair in machines:
                pair.expire(now - DROP_AFTER_S)
            for rk in ranks.values():
                if now - rk.last_sent >= 0.5 and not rk.writer.is_closing():
                    rk.heartbeat()
                    counts["heartbeats"] += 1
            await asyncio.sleep(0.1)

    mine = sorted(ranks)
    for i in range(0, len(mine), 64):  # connect and say hello in batches (the controller's backlog is 1,024)
        batch = mine[i:i + 64]
        await asyncio.gather(*(loop.create_connection(lambda r=r: ranks[r], info["host"], info["port"])
                               for r in batch))
        await asyncio.gather(*(ranks[r].call("hello", job=job, rank=r, world=n, token=token,
                                             ports={f"rail{r // WIDE_RAIL}": r % WIDE_RAIL}) for r in batch))
    beater = asyncio.create_task(heartbeats())
    for pair, (a, b) in zip(machines, pairs, strict=True):
        pair.members = [ranks[a], ranks[b]]
        rail, pa, pb = f"rail{a // WIDE_RAIL}", a % WIDE_RAIL, b % WIDE_RAIL
        await ranks[a].call("group", job=job, key=f"p{a}", phase="dp", members=[a, b],
                            circuits={rail: {str(pa): pb, str(pb): pa}})
    await loop.run_in_executor(None, barrier.wait)
    if not await loop.run_in_executor(None, go.wait, time_limit):
        raise TimeoutError("the benchmark did not start the loops")
    start, cpu = time.perf_counter(), time.process_time()
    sent_before = sum(rk.sent for rk in ranks.values())
    for i, pair in enumerate(machines):
        pair.deadline = start + time_limit
        if pace:  # the pairs start spread over one period, as ranks of independent jobs would
            loop.call_later(pace * i / len(machines), pair.start)
        else:
            pair.start()
    await asyncio.gather(*(pair.done for pair in machines))
    wall, cpu = time.perf_counter() - start, time.process_time() - cpu
    beater.cancel()
    for rk in ranks.values():
        rk.writer.close()
    return {"latencies": latencies, "dropped": counts["dropped"], "heartbeats": counts["heartbeats"],
            "requests": sum(rk.sent for rk in ranks.values()) - sent_before + counts["heartbeats"], "wall_s": wall,
            "cpu_s": cpu}


def _many_proc(info, token, n, pairs, rounds, warmup, time_limit, pace, barrier, go, results) -> None:
    """A client process (multiprocessing target): its ranks in one asyncio loop."""
    try:
        out = event_loop_run()(_many_part(info, token, n, pairs, rounds, warmup, time_limit, pace, barrier, go))
    except Exception as e:  # noqa: BLE001 (reported by the parent)
        barrier.abort()
        out = {"error": repr(e)}
    results.put(out)


NATIVE = Path(__file__).with_name("native")  # emulated_ranks.c (--native-ranks), floor_server.c (--native-floor)


def native_program(tmp: Path, name: str, flag: str) -> Path:
    """``native/<name>.c`` compiled with the machine's C compiler; exit 2 with one line naming ``flag`` if there is
    none or it fails."""
    from lightrail.errors import ScenarioError
    from lightrail.runtime.controller.frontend import compile_c

    try:
        return compile_c(NATIVE / f"{name}.c", tmp / name, flag, "install cc, gcc or clang, or set CC")
    except ScenarioError as e:
        print(f"bench_controller: {flag} {e.message}", file=sys.stderr)
        raise SystemExit(2) from None


def _built(source: Path, binary: Path) -> Path | None:
    """``source`` compiled into ``binary`` where this machine can (Linux, a working C compiler), else None."""
    from lightrail.errors import ScenarioError
    from lightrail.runtime.controller.frontend import compile_c

    if not sys.platform.startswith("linux"):
        return None
    try:
        return compile_c(source, binary, "", "")
    except ScenarioError:
        return None


def native_or_fallback(tmp: Path, name: str, flag: str, asked: str) -> Path | None:
    """``asked`` "native": ``native/<name>.c`` compiled, or exit 2 naming ``flag``; "auto": compiled where this
    machine can, else None (the Python counterpart); anything else: None."""
    if asked == "native":
        return native_program(tmp, name, flag)
    return _built(NATIVE / f"{name}.c", tmp / name) if asked == "auto" else None


class Pinning:
    """``--pin``: the server under test (controller or floor, every thread of it) runs alone on the first CPU this
    process may use; everything else the run starts (the controller's front end, the emulated ranks, this process)
    on the others. On a 2-core machine the emulator would otherwise take turns with the server on its core, and a
    request's latency would include waiting for the emulator's time slice (at 1,024 ranks on this repository's
    2-core machine: p99 median 16.5 ms pinned, 12 runs; 18.6 ms not). None where there is a single CPU or no affinity
    call."""

    def __init__(self):
        cpus = sorted(os.sched_getaffinity(0))
        self.server, self.others, self.own = cpus[:1], cpus[1:], set(cpus)

    @classmethod
    def make(cls, on: bool) -> Pinning | None:
        if not on or not hasattr(os, "sched_setaffinity") or len(os.sched_getaffinity(0)) < 2:
            return None
        return cls()

    @staticmethod
    def _set(pid: int, cpus: list[int]) -> None:
        for task in Path(f"/proc/{pid}/task").iterdir():  # a thread's affinity is its own: set each one's
            try:
                os.sched_setaffinity(int(task.name), cpus)
            except ProcessLookupError:  # a thread that ended meanwhile
                pass

    def server_started(self, pid: int, frontend_pid: int | None = None) -> None:
        self._set(pid, self.server)
        if frontend_pid:
            self._set(frontend_pid, self.others)

    def __enter__(self) -> Pinning:
        os.sched_setaffinity(0, self.others)  # the emulated ranks are this process's children: they inherit it
        return self

    def __exit__(self, *exc) -> None:
        os.sched_setaffinity(0, self.own)

    def describe(self) -> dict:
        return {"server_cpus": self.server, "other_cpus": self.others}


def _native_run(info, token, n, pairs, rounds, warmup, time_limit, binary, admin):
    """The ranks as the native program: this process connects them, says hello and declares the pairs' groups on
    blocking sockets, then hands the connections over (inherited descriptors) and runs the loops there."""
    job = "bench-many"
    socks = [socket.create_connection((info["host"], info["port"]), timeout=30) for _ in range(n)]
    for sock in socks:
        sock.setsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY, 1)
    files = [sock.makefile("rb") for sock in socks]

    def ask(ranks: list[int], message) -> None:  # send every request first, then read the replies (one each)
        for r in ranks:
            socks[r].sendall(json.dumps(message(r), separators=(",", ":")).encode() + b"\n")
        for r in ranks:
            reply = json.loads(files[r].readline() or b"null")
            if not (isinstance(reply, dict) and reply.get("ok")):
                raise RuntimeError(f"rank {r}: {reply}")

    try:
        ask(list(range(n)), lambda r: {"id": 1, "op": "hello", "job": job, "rank": r, "world": n, "token": token,
                                       "ports": {f"rail{r // WIDE_RAIL}": r % WIDE_RAIL}})
        # each pair's first member declares its group, the second sends a heartbeat (a silent rank fails after
        # heartbeat_timeout, 2 s: on a loaded machine the set-up of 1,024 connections can take that long)
        ask(list(range(n)), lambda r: {"id": 2, "op": "heartbeat"} if r % 2 else {
            "id": 2, "op": "group", "job": job, "key": f"p{r}", "phase": "dp", "members": [r, r + 1],
            "circuits": {f"rail{r // WIDE_RAIL}": {str(r % WIDE_RAIL): (r + 1) % WIDE_RAIL,
                                                   str((r + 1) % WIDE_RAIL): r % WIDE_RAIL}}})
        spec = f"{n} {rounds} {warmup} {time_limit} {DROP_AFTER_S}\n" + "".join(
            f"{socks[r].fileno()} {r} p{a} {job}\n" for a, b in pairs for r in (a, b))
        requests_before = _requests(admin) if admin else 0
        cpu_before = _cpu_times(info)
        done = subprocess.run([str(binary)], input=spec.encode(), capture_output=True,
                              pass_fds=[sock.fileno() for sock in socks], timeout=time_limit + 120)
        cpu = tuple(after - before for after, before in zip(_cpu_times(info), cpu_before, strict=True))
    finally:
        for f, sock in zip(files, socks, strict=True):
            f.close()
            sock.close()
    if done.returncode != 0:
        return [{"error": done.stderr.decode(errors="replace").strip()[-500:]}], 0.0, cpu, requests_before
    out = json.loads(done.stderr.decode().strip().splitlines()[-1])
    latencies = list(array.array("d", done.stdout))
    return [{**out, "latencies": latencies}], out["wall_s"], cpu, requests_before


def _python_run(info, token, n, pairs, rounds, warmup, time_limit, pace, procs, admin):
    """The ranks as ``procs`` Python client processes; their parts, the wall time, the server's CPU (user, system)
    over the measured loops, and the controller's request count before them."""
    import multiprocessing

    if pace:  # the pairs start spread over one period, as ranks of independent jobs would
        pairs = sorted(pairs, key=lambda p: (p[0] * 2654435761) % 2 ** 32)
    ctx = multiprocessing.get_context("spawn")
    barrier, go, results = ctx.Barrier(procs + 1), ctx.Event(), ctx.Queue()
    workers = [ctx.Process(target=_many_proc, args=(info, token, n, pairs[k::procs], rounds, warmup, time_limit,
                                                    pace, barrier, go, results)) for k in range(procs)]
    for w in workers:
        w.start()
    barrier.wait(timeout=time_limit)
    requests_before = _requests(admin) if admin else 0
    cpu_before, start = _cpu_times(info), time.perf_counter()
    go.set()  # the loops start only now: the counts above are from before their first request
    parts = [results.get(timeout=time_limit + 120) for _ in workers]
    cpu = tuple(after - before for after, before in zip(_cpu_times(info), cpu_before, strict=True))
    wall = max((p["wall_s"] for p in parts if "wall_s" in p), default=time.perf_counter() - start)  # the loops'
    for w in workers:
        w.join(30)
    return parts, wall, cpu, requests_before


def _many(info: dict, n: int, rounds: int, warmup: int, time_limit: float, pace: float, procs: int,
          floor: bool = False, native: Path | None = None) -> dict:
    """The ``--ranks`` run against the controller in ``info`` (or, with ``floor``, against the minimal server); with
    ``native`` (the compiled emulated_ranks.c), the ranks are that program's instead of Python client processes."""
    token = "floor" if floor else _register(info, "bench-many", n)
    pairs = [(a, a + 1) for a in range(0, n - 1, 2)]
    admin = None if floor else f"http://{info['host']}:{info['admin_port']}"
    if native is not None:
        parts, wall, (user, system, frontend), requests_before = _native_run(
            info, token, n, pairs, rounds, warmup, time_limit, native, admin)
        procs = 0
    else:
        parts, wall, (user, system, frontend), requests_before = _python_run(
            info, token, n, pairs, rounds, warmup, time_limit, pace, procs, admin)
    errors = [p["error"] for p in parts if "error" in p]
    if errors:
        raise RuntimeError(errors[0])
    cpu = user + system
    handled = _requests(admin) - requests_before if admin else sum(p["requests"] for p in parts)
    lat = sorted(x for p in parts for x in p["latencies"])
    expected = len(pairs) * 2 * rounds
    q = lambda p: round(lat[min(len(lat) - 1, int(p * len(lat)))], 6) if lat else None  # noqa: E731
    server = "floor_server" if floor else "controller"
    return {"ranks": n, "groups": len(pairs), "rounds": rounds, "warmup_rounds": warmup, "pace_s": pace,
            "emulated_ranks": "python" if native is None else "native", "client_processes": procs,
            "acquires": len(lat), "acquires_expected": expected,
            "dropped": max(sum(p["dropped"] for p in parts), expected - len(lat)),
            "p50_s": q(0.50), "p99_s": q(0.99), "max_s": round(lat[-1], 6) if lat else None,
            "rate_per_s": round(len(lat) * (warmup + rounds) / rounds / wall, 1) if lat else 0.0,
            "wall_s": round(wall, 3), "heartbeats_sent": sum(p["heartbeats"] for p in parts),
            "requests_handled": handled, f"{server}_cpu_s": round(cpu, 3),
            f"{server}_cpu_us_per_request": round(cpu / max(handled, 1) * 1e6, 1),
            f"{server}_user_us_per_request": round(user / max(handled, 1) * 1e6, 1),
            f"{server}_system_us_per_request": round(system / max(handled, 1) * 1e6, 1),
            f"{server}_cpu_share": round(cpu / wall, 3),
            **({"frontend_cpu_us_per_request": round(frontend / max(handled, 1) * 1e6, 1),
                "frontend_cpu_share": round(frontend / wall, 3)} if info.get("frontend_pid") else {}),
            "clients_cpu_us_per_request": round(sum(p["cpu_s"] for p in parts) / max(handled, 1) * 1e6, 1),
            "load_average": [round(x, 2) for x in os.getloadavg()]}


# --- the floor: the same clients against a server that only pairs acquires ------------------------------------


class _FloorProtocol(_Lines):
    """The least a rank-protocol server can do for the ``--ranks`` load: parse each JSON line, answer ``ok``, and
    answer a pair's two acquires once both arrived. No identity, state, safety, metrics or persistence: its
    latency is what this machine's loopback, event loop and emulated ranks allow any Python server."""

    waiting: dict[str, tuple[asyncio.Transport, int]] = {}  # group key -> (transport, id) of its first acquire

    def message(self, m: dict, now: float) -> None:
        if m["op"] != "acquire":
            self.writer.write(b'{"id":%d,"ok":true}\n' % m["id"])
            return
        first = self.waiting.pop(m["key"], None)
        if first is None:
            self.waiting[m["key"]] = (self.writer, m["id"])
            return
        first[0].write(b'{"id":%d,"ok":true,"granted":true}\n' % first[1])
        self.writer.write(b'{"id":%d,"ok":true,"granted":true}\n' % m["id"])


def _floor_serve() -> None:
    """Run the floor server (``--floor-server``, the child ``floor_server()`` starts): one ready line, then serve."""

    async def main() -> None:
        loop = asyncio.get_running_loop()
        server = await loop.create_server(_FloorProtocol, "127.0.0.1", 0, backlog=2048)
        print(json.dumps({"host": "127.0.0.1", "port": server.sockets[0].getsockname()[1]}), flush=True)
        await asyncio.Event().wait()

    event_loop_run()(main())


def floor(n: int, rounds: int, warmup: int, time_limit: float, pace: float, procs: int,
          native: Path | None = None, server: Path | None = None, pin: Pinning | None = None) -> dict:
    """The ``--ranks`` run against the floor server (same clients, same layout, same counts); ``server``: the
    compiled floor_server.c instead of the Python one (``--native-floor``)."""
    command = [str(server)] if server else [sys.executable, __file__, "--floor-server"]
    proc = subprocess.Popen(command, stdout=subprocess.PIPE, text=True)
    try:
        info = {**json.loads(proc.stdout.readline()), "pid": proc.pid}
        if pin is not None:
            pin.server_started(proc.pid)
        return _many(info, n, rounds, warmup, time_limit, pace, procs, floor=True, native=native)
    finally:
        proc.kill()
        proc.wait()


def _cpu_times(info: dict) -> tuple[float, float, float]:
    """User and system CPU seconds of the server process (Linux /proc; system time is mostly the loopback TCP
    stack, a reply's send, which no Python change removes), and the native front end's, user + system (0 without
    one: ``controller serve --frontend native`` names its process ``frontend_pid``)."""
    tick = os.sysconf("SC_CLK_TCK")

    def times(pid: int) -> tuple[float, float]:
        fields = Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()
        return int(fields[11]) / tick, int(fields[12]) / tick

    user, system = times(info["pid"])
    return user, system, sum(times(info["frontend_pid"])) if info.get("frontend_pid") else 0.0


def _requests(admin: str) -> float:
    text = httpx.get(f"{admin}/metrics", timeout=10).text
    return next(float(line.split()[-1]) for line in text.splitlines() if line.startswith("lightrail_requests_total "))


def many_ranks(tmp: Path, n: int, rounds: int, warmup: int, time_limit: float, pace: float = 0.0,
               procs: int = 2, with_floor: bool = True, native: Path | None = None,
               native_floor: Path | None = None, frontend: str = "loop", pin: Pinning | None = None) -> dict:
    rails = -(-n // WIDE_RAIL)
    with pin or contextlib.nullcontext():
        proc, info, wall = _start(tmp / "many.db", ("--rails", str(rails), "--ports", str(WIDE_RAIL),
                                                    "--frontend", frontend))
        info["pid"] = proc.pid
        try:
            if pin is not None:
                pin.server_started(proc.pid, info.get("frontend_pid"))
            out = _many(info, n, rounds, warmup, time_limit, pace, procs, native=native)
            out["controller_metrics"] = _controller_metrics(f"http://{info['host']}:{info['admin_port']}")
        except Exception as e:  # noqa: BLE001 (reported in the JSON)
            out = {"ranks": n, "error": repr(e), "p99_s": None, "dropped": None,
                   "controller_log_tail": _log_tail(tmp / "many.db")}
        out["controller_exit_code"] = _stop(proc)
        out["controller_startup_wall_s"] = round(wall, 3)
        if with_floor:
            try:
                out["floor"] = floor(n, rounds, warmup, time_limit, pace, procs, native, pin=pin)
            except Exception as e:  # noqa: BLE001 (reported in the JSON)
                out["floor"] = {"error": repr(e)}
        if native_floor is not None:
            try:
                out["native_floor"] = floor(n, rounds, warmup, time_limit, pace, procs, native, native_floor, pin)
            except Exception as e:  # noqa: BLE001 (reported in the JSON)
                out["native_floor"] = {"error": repr(e)}
    out["frontend"] = frontend
    out["pinned"] = pin.describe() if pin is not None else None
    out["target_p99_s"] = 0.020
    out["meets_target"] = out.get("p99_s") is not None and out["p99_s"] < 0.020 and out["dropped"] == 0
    out["machine"] = {"platform": platform.platform(), "python": sys.version.split()[0], "cpus": os.cpu_count()}
    return out


SWEEP_PACES = (0.4, 0.2, 0.1, 0.07, 0.05, 0.035, 0.025, 0.0)  # --sweep: each pair's compute between rounds (s)


def load_sweep(tmp: Path, n: int, rounds: int, warmup: int, time_limit: float, procs: int,
               paces: tuple[float, ...] = SWEEP_PACES, frontend: str = "loop", pin: Pinning | None = None) -> dict:
    """Latency against offered load at ``n`` ranks (``--sweep``): one run per pace, each on a fresh controller, from a
    slow one up to full rate (pace 0, the ``--ranks`` run). Answers "up to what acquire rate does one controller keep
    p99 under the target?", which full rate alone cannot: there, by Little's law, the latency is set by the
    throughput."""
    points = []
    for i, pace in enumerate(paces):
        (tmp / f"pace{i}").mkdir()
        run = many_ranks(tmp / f"pace{i}", n, rounds, warmup, time_limit, pace, procs, with_floor=False,
                         frontend=frontend, pin=pin)
        points.append({k: run.get(k) for k in ("pace_s", "rate_per_s", "p50_s", "p99_s", "max_s", "dropped",
                                                "acquires", "acquires_expected", "controller_cpu_share", "error")})
        print(f"pace {pace} s: {run.get('rate_per_s')} acquires/s, p99 {run.get('p99_s')} s", file=sys.stderr)
    target = 0.020
    meeting = [p["rate_per_s"] for p in points if p["p99_s"] is not None and p["p99_s"] < target and p["dropped"] == 0]
    full = points[-1] if paces[-1] == 0 else None
    return {"ranks": n, "rounds": rounds, "target_p99_s": target, "points": points,
            "max_rate_meeting_target_per_s": max(meeting, default=None),
            "p99_s": full["p99_s"] if full else None, "dropped": sum(p["dropped"] or 0 for p in points),
            "machine": {"platform": platform.platform(), "python": sys.version.split()[0], "cpus": os.cpu_count()}}


# --- --grant-latency: grant latency by kind and the revoke round trip, for a train-demo sized job ----------------

GRANT_TP, GRANT_DP, GRANT_PP = 2, 2, 2  # the train-demo's layout: 8 ranks on 4 servers of 2, one rail per local rank


def _demo_rank(rank: int) -> tuple[str, int, dict[str, tuple[str, list[int], dict]]]:
    """Rank ``rank`` of the tp=dp=pp=2 job (Megatron order: tp fastest, then dp, then pp): its rail, its port there
    (its server) and its groups, by role: ``pp`` and ``dp`` (leases, on the same rail, sharing its port: they
    alternate, so every op revokes the other's lease and switches), ``loss`` (per op, the dp pair's circuits, lit
    then: the skip-if-present path)."""
    tp, dp, pp = rank % GRANT_TP, rank // GRANT_TP % GRANT_DP, rank // (GRANT_TP * GRANT_DP)
    rail = f"rail{tp}"
    server = lambda r: r // GRANT_TP  # noqa: E731 (a server holds tp ranks; its port on each rail is its number)
    dp_members = [tp + GRANT_TP * d + GRANT_TP * GRANT_DP * pp for d in range(GRANT_DP)]
    pp_members = [tp + GRANT_TP * dp + GRANT_TP * GRANT_DP * p for p in range(GRANT_PP)]

    def pair(members):
        a, b = (server(m) for m in members)
        return {rail: {a: b, b: a}}

    return rail, server(rank), {"pp": (f"pp.t{tp}d{dp}", pp_members, pair(pp_members)),
                                "dp": (f"dp.t{tp}p{pp}", dp_members, pair(dp_members)),
                                "loss": (f"loss.t{tp}p{pp}", dp_members, pair(dp_members))}


def _grant_rank(info: dict, token: str, rank: int, world: int, iterations: int, op_s: float, compute_s: float,
                barrier, results) -> None:
    """One rank as its own process (multiprocessing target), with the blocking ControllerClient the torch backend
    uses: per iteration a pp op and a dp op on leases (``enter`` under a lease still standing, else ``acquire``,
    ``leave`` after), then a per-op loss op (acquire, release); ``compute_s`` between ops. Puts the rank's
    round trips of the requests answered at once (release, ack) and the iterations it ran."""
    try:
        rail, port, groups = _demo_rank(rank)
        client = ControllerClient(info["host"], info["port"], job="demo", rank=rank, timeout=60, token=token)
        client.hello(world, {rail: port})
        barrier.wait(timeout=60)  # every port is claimed (a group's circuits may use a peer's)
        for key, members, circuits in groups.values():
            if members[0] == rank:
                client.declare(key, members, circuits, phase=key.split(".")[0])
        barrier.wait(timeout=60)  # every group is declared
        client.round_trips.clear()  # hello and group are set-up, not the loop's check-ins
        done = 0
        for _ in range(iterations):  # a fixed count: a rank stopping early would leave its peers' acquires waiting
            for role in ("pp", "dp"):
                key = groups[role][0]
                if not client.enter(key):
                    client.acquire(key, lease=True)
                time.sleep(op_s)
                client.leave(key)
                time.sleep(compute_s)
            key = groups["loss"][0]
            client.acquire(key)
            time.sleep(op_s)
            client.release(key)
            time.sleep(compute_s)
            done += 1
        barrier.wait(timeout=60)  # nobody leaves (bye) while a peer may still need it in a barrier
        client.bye()
        client.close()
        results.put({"rank": rank, "round_trips": client.round_trips, "iterations": done})
    except Exception as e:  # noqa: BLE001 (reported by the parent)
        barrier.abort()
        results.put({"rank": rank, "error": repr(e)})


def _metric_quantiles(text: str, name: str, labels: str = "") -> dict:
    """p50 and p90 (seconds) and the count of a summary on /metrics (``labels``: e.g. ``kind="lit"``), from its
    quantile samples; None while it has no sample."""
    values = dict(line.rsplit(" ", 1) for line in text.splitlines() if line.startswith(name))
    series = lambda suffix, extra: f"{name}{suffix}{{{','.join(x for x in (labels, extra) if x)}}}"  # noqa: E731
    quantile = lambda q: float(values[key]) if (key := series("", f'quantile="{q}"')) in values else None  # noqa: E731
    count = values.get(series("_count", "") if labels else f"{name}_count", 0)
    return {"p50": quantile(0.5), "p90": quantile(0.9), "count": int(float(count))}


def _quantiles(xs: list[float]) -> dict:
    xs = sorted(xs)
    q = lambda p: xs[min(len(xs) - 1, int(p * len(xs)))] if xs else None  # noqa: E731
    return {"p50": q(0.5), "p90": q(0.9), "count": len(xs)}


def grant_latency(tmp: Path, iterations: int, ocs_delay: str, *, op_s: float = 0.001, compute_s: float = 0.001,
                  time_limit: float = 120.0) -> dict:
    """``--grant-latency``: the train-demo's job (tp=dp=pp=2: 8 ranks, 4 servers, 2 rails; leases on) as 8 client
    processes over loopback against a real ``lightrail controller serve`` with an OCS delay of ``ocs_delay``. On each
    rail a pp pair and a dp pair share a port, so every pp and dp op revokes the other's lease and switches; the per-op
    loss op finds its circuits lit. From the controller's /metrics: the grant latency by kind (ready, the last
    member's acquire in, to the grant; ``switch_overhead``: a switch grant's latency minus the switch delay waited)
    and the revoke round trip (push to lease end); from the ranks: the round trip of a request answered at once
    (``check_in_rtt_s``: release, ack). Figures are over the whole run (the first iteration included)."""
    import multiprocessing

    world = GRANT_TP * GRANT_DP * GRANT_PP
    servers = world // GRANT_TP
    state = tmp / "grant.db"
    proc, info, _ = _start(state, extra=("--rails", str(GRANT_TP), "--ports", str(servers)), delay=ocs_delay)
    admin = f"http://{info['host']}:{info['admin_port']}"
    try:
        token = httpx.post(f"{admin}/jobs", json={"job": "demo", "world": world},
                           headers={"Authorization": f"Bearer {info['operator_token']}"}, timeout=10).json()["token"]
        ctx = multiprocessing.get_context("spawn")
        barrier, results = ctx.Barrier(world), ctx.Queue()
        start = time.perf_counter()
        workers = [ctx.Process(target=_grant_rank, args=(info, token, r, world, iterations, op_s, compute_s,
                                                          barrier, results)) for r in range(world)]
        for w in workers:
            w.start()
        parts = [results.get(timeout=time_limit) for _ in workers]
        wall = time.perf_counter() - start
        for w in workers:
            w.join(30)
        errors = [p["error"] for p in parts if "error" in p]
        if errors:
            raise RuntimeError(errors[0])
        text = httpx.get(f"{admin}/metrics", timeout=10).text
        controller = _controller_metrics(admin)
    except Exception as e:  # noqa: BLE001 (reported in the JSON, with the controller's last log lines)
        returncode = proc.poll()
        _stop(proc)
        return {"error": repr(e), "controller_returncode": returncode, "controller_log_tail": _log_tail(state)}
    _stop(proc)
    kinds = {kind: _metric_quantiles(text, "lightrail_grant_latency_seconds", f'kind="{kind}"')
             for kind in ("lit", "revoke", "switch")}
    kinds["switch_overhead"] = _metric_quantiles(text, "lightrail_grant_overhead_seconds", 'kind="switch"')
    for side in ("before", "after"):  # the overhead split where it acts: ready -> switch start, switch end -> grant
        kinds[f"switch_lag_{side}"] = _metric_quantiles(text, "lightrail_switch_lag_seconds", f'kind="{side}"')
    return {"ranks": world, "servers": servers, "rails": GRANT_TP, "layout": "tp=2 dp=2 pp=2, leases on pp and dp",
            "ocs_delay": ocs_delay, "op_s": op_s, "compute_s": compute_s,
            "iterations": min(p["iterations"] for p in parts),
            "wall_s": round(wall, 3),
            "grant_latency_s": kinds,
            "revoke_rtt_s": _metric_quantiles(text, "lightrail_revoke_seconds"),
            "check_in_rtt_s": _quantiles([x for p in parts for x in p["round_trips"]]),
            "revocations": int(_sample(text, "lightrail_revocations_total")),
            "reconfigurations": controller["reconfigurations"], "grants": controller["grants"],
            "unsafe_reconfigurations": controller["unsafe_reconfigurations"],
            "machine": {"platform": platform.platform(), "python": sys.version.split()[0], "cpus": os.cpu_count()},
            "load_average": [round(x, 2) for x in os.getloadavg()]}


def _sample(text: str, series: str) -> float:
    return next((float(line.rsplit(" ", 1)[1]) for line in text.splitlines() if line.split(" ", 1)[0] == series), 0.0)


def _frontend(tmp: Path, asked: str) -> str:
    """``--frontend``: auto is native where the controller's concentrator builds here (Linux, a C compiler)."""
    from lightrail.runtime.controller.frontend import SOURCE

    if asked != "auto":
        return asked
    return "native" if _built(SOURCE, tmp / "concentrator") else "loop"


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--rounds", type=int, default=None, help="rounds per scenario (default 300; 50 with --ranks)")
    parser.add_argument("--ranks", type=int, default=None, help="only the many-ranks run, with this many ranks")
    parser.add_argument("--warmup", type=int, default=5, help="--ranks: warm-up rounds (not measured)")
    parser.add_argument("--time-limit", type=float, default=300.0, help="--ranks: bound on the run, seconds")
    parser.add_argument("--pace", type=float, default=0.0, help="--ranks: seconds each pair computes between rounds "
                        "(0: full rate, every pair back to back)")
    parser.add_argument("--client-procs", type=int, default=2, help="--ranks: client processes sharing the ranks")
    parser.add_argument("--no-floor", action="store_true", help="--ranks: skip the run against the floor server")
    parser.add_argument("--emulated-ranks", choices=("auto", "native", "python"), default="auto",
                        help="--ranks: native, the pair loops of native/emulated_ranks.c (compiled with cc), a few "
                        "us of CPU per request; python, Python client processes (12-17 us, more than the controller "
                        "itself on 2 cores). auto (default): native where it builds, at full rate with an even "
                        "--ranks; else python")
    parser.add_argument("--native-ranks", dest="emulated_ranks", action="store_const", const="native",
                        help="--ranks: --emulated-ranks native")
    parser.add_argument("--native-floor", action="store_true", help="--ranks: also run the same clients against "
                        "native/floor_server.c (the floor's work in C, compiled with cc): what a native data plane's "
                        "socket loop could reach on this machine")
    parser.add_argument("--frontend", choices=("auto", "loop", "native"), default="auto", help="--ranks: the "
                        "controller's front end (controller serve --frontend): native, its C concentrator owns the "
                        "connections, the controller's configuration for 1,024 ranks; auto (default): native where "
                        "it builds (Linux, cc), else loop")
    parser.add_argument("--pin", choices=("auto", "on", "off"), default="auto", help="--ranks: run the server under "
                        "test alone on one CPU, its front end and the emulated ranks on the others; auto (default): "
                        "on with the native emulated ranks (the Python ones need every core)")
    parser.add_argument("--sweep", action="store_true", help="--ranks: latency against offered load (one run per "
                        "pace, up to full rate); writes out/bench/controller-load{,-native}.{json,png}")
    parser.add_argument("--paces", default=",".join(map(str, SWEEP_PACES)),
                        help="--sweep: the paces, seconds, comma-separated (0: full rate)")
    parser.add_argument("--floor-server", action="store_true", help=argparse.SUPPRESS)
    parser.add_argument("--grant-latency", action="store_true", help="only the grant-latency run: the train-demo's "
                        "job (8 ranks, 4 servers, 2 rails, leases on) as client processes; the controller's grant "
                        "latency by kind (lit, revoke, switch, switch overhead) and revoke round trip from /metrics, "
                        "the ranks' check-in round trip (--rounds: iterations, default 200)")
    parser.add_argument("--ocs-delay", default="2ms", help="--grant-latency: the emulated OCS delay (default 2ms)")
    args = parser.parse_args()
    if args.floor_server:
        _floor_serve()
        return
    if args.grant_latency:
        with tempfile.TemporaryDirectory(prefix="lightrail-bench-controller-") as tmpdir:
            out = grant_latency(Path(tmpdir), args.rounds or 200, args.ocs_delay, time_limit=args.time_limit)
        print(json.dumps(out, indent=2))
        return
    if args.ranks is not None:
        if not 2 <= args.ranks <= 65536:
            parser.error("--ranks must be in 2..65536")
        if args.emulated_ranks == "native" and (args.pace or args.ranks % 2):
            parser.error("--native-ranks (--emulated-ranks native) runs full rate (no --pace) with an even --ranks")
        if args.sweep:
            if args.emulated_ranks == "native" or args.native_floor or args.pace:
                parser.error("--sweep sets the pace itself, with the Python emulated ranks (and no floor)")
            try:
                paces = tuple(sorted({float(p) for p in args.paces.split(",")}, reverse=True))
            except ValueError:
                parser.error(f"--paces {args.paces!r}: give seconds, comma-separated, e.g. 0.1,0.05,0")
            if not all(0 <= p <= 60 for p in paces):
                parser.error(f"--paces {args.paces!r}: each in 0..60 s")
            with tempfile.TemporaryDirectory(prefix="lightrail-bench-controller-") as tmpdir:
                frontend = _frontend(Path(tmpdir), args.frontend)
                out = load_sweep(Path(tmpdir), args.ranks, args.rounds or 20, args.warmup, args.time_limit,
                                 args.client_procs, paces, frontend, Pinning.make(args.pin == "on"))
            from lightrail.report.files import write_json
            from lightrail.report.plots import plot_controller_load

            stem = "controller-load" + ("-native" if frontend == "native" else "")  # one file per front end
            out["frontend"] = frontend
            write_json(OUT / f"{stem}.json", out)
            plot_controller_load(out["points"], OUT / f"{stem}.png", out["target_p99_s"],
                                 f"{args.ranks} emulated ranks on loopback, pairs, lit circuits, {frontend} front "
                                 f"end ({os.cpu_count()} cores shared with the emulator)")
            print(json.dumps(out, indent=2))
            return
        with tempfile.TemporaryDirectory(prefix="lightrail-bench-controller-") as tmpdir:
            tmp = Path(tmpdir)
            full_rate = not args.pace and args.ranks % 2 == 0
            native = native_or_fallback(tmp, "emulated_ranks", "--native-ranks",
                                        args.emulated_ranks if full_rate else "python")
            server = native_program(tmp, "floor_server", "--native-floor") if args.native_floor else None
            pin = Pinning.make(args.pin == "on" or (args.pin == "auto" and native is not None))
            out = many_ranks(tmp, args.ranks, args.rounds or 50, args.warmup, args.time_limit,
                             args.pace, args.client_procs, with_floor=not args.no_floor, native=native,
                             native_floor=server, frontend=_frontend(tmp, args.frontend), pin=pin)
        print(json.dumps(out, indent=2))
        return
    args.rounds = args.rounds or 300
    with tempfile.TemporaryDirectory(prefix="lightrail-bench-controller-") as tmpdir:
        tmp = Path(tmpdir)
        out = {
            "machine": {"platform": platform.platform(), "python": sys.version.split()[0],
                        "cpus": os.cpu_count()},
            "startup": startup(tmp),
            "latency": {
                "same_pairs_8": scenario(tmp, "same8", 8, args.rounds, flip=False),
                "same_pairs_64": scenario(tmp, "same64", 64, args.rounds, flip=False),
                "flip_8": scenario(tmp, "flip8", 8, args.rounds, flip=True),
                "flip_64": scenario(tmp, "flip64", 64, args.rounds, flip=True),
                "threads_same_pairs_64": scenario(tmp, "threads64", 64, min(args.rounds, 200), flip=False,
                                                  threads=True),
                "threads_flip_64": scenario(tmp, "threadsflip64", 64, min(args.rounds, 200), flip=True,
                                            threads=True),
            },
        }
    out["targets"] = {"startup_median_under_2s": out["startup"]["meets_target"],
                      "p99_under_5ms_64_ranks_no_reconfiguration": out["latency"]["same_pairs_64"]["meets_target"],
                      "p99_under_5ms_64_ranks_reconfiguring_every_round": out["latency"]["flip_64"]["meets_target"]}
    out["meets_target"] = all(out["targets"].values())
    print(json.dumps(out, indent=2))


if __name__ == "__main__":
    main()
