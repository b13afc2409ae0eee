"""Emulated edge clients and collaborative-ML jobs: a documented synthetic default, and trace files.

A :class:`Population` is the clients (:class:`~lightrail.fl.model.Clients`), their availability (online
sessions, ``[start_s, end_s)`` per client, non-overlapping) and the jobs (:class:`~lightrail.fl.model.Jobs`).

Synthetic default (:func:`synthetic_population`; every draw from one ``seed``):

- **Devices.** Mobile fleets are heterogeneous with heavy-tailed compute speed (FedScale, Lai et al., ICML 2022,
  sec. 3: client compute speeds from AI Benchmark device profiles and network speeds from MobiPerf spread over
  more than an order of magnitude). Here: CPU clock lognormal, median 2.0 GHz, sigma 0.25, clipped to
  [1.0, 3.5] GHz; memory from {2, 3, 4, 6, 8, 12} GB with probabilities {.10, .20, .25, .20, .15, .10} (the RAM
  tiers of phones in those profiles); ``speed`` (work units per second) = cpu / 2 GHz x lognormal(0, 0.6),
  so a median device does about one work unit per second and the fastest percent about 4-5.
- **OS mix.** android 0.70, ios 0.27, linux 0.02, windows 0.01 (StatCounter's mobile OS share, 2024, with a
  few desktop/edge boxes).
- **Availability.** Devices join FL when idle, charging and on Wi-Fi, which is mostly at night (the FedScale
  availability trace of Yang et al., WWW 2021, 136k phones): each client starts sessions as a Poisson process
  of diurnal rate ``sessions_per_day x (1 + 0.8 cos(2 pi (t - peak) / day))`` with a per-client phase (time
  zones) around the peak; session lengths are lognormal, median ``session_median_s`` (20 min), sigma 1.0
  (heavy-tailed: some devices stay plugged in for hours). Overlapping sessions of one client are merged. While
  online and idle a client checks in at Poisson times (``checkin_interval_s`` mean, in the simulator).
- **Jobs.** ``jobs`` jobs (20) with Poisson arrivals (mean gap ``job_gap_s``, 10 min, first at 0); a spread of
  requirements dealt in a fixed pattern and shuffled: open to all (40%), mid-range (>= 2.0 GHz, >= 4 GB, 30%),
  picky high-end (>= 2.4 GHz, >= 8 GB, 15%), iOS only (>= 4 GB, 15%); rounds uniform 5-50; demand uniform
  10-200 clients per round, capped at a quarter of the clients that can serve the job and at half of those
  static partitioning deals it (:func:`~lightrail.fl.policies.static_partition`; a round needs distinct
  clients, so a smaller partition could never finish a round: this keeps the static baseline viable);
  work per client per round lognormal, median 120 work units (two minutes on a median device), sigma 0.5.

Trace files (CSV, one header line, ``#`` lines are comments; see :func:`parse_clients`, :func:`parse_availability`,
:func:`parse_jobs`):

- clients: ``client_id,cpu_ghz,memory_gb,os,speed[,fp16_mem]`` (os one of ``OSES``, optionally with its version:
  ``android13``, ``ios17.2``; speed in work units per second > 0; ``fp16_mem``, optional, MB as Propius's device
  profiles give it);
- availability: ``client_id,start_s,end_s`` (sessions; a client may have many; overlapping ones are merged;
  clients with no line are never online). Without an availability file, the synthetic sessions are used;
- jobs: ``arrival_s,min_cpu_ghz,min_memory_gb,os,rounds,demand,work[,min_fp16_mem]`` (os: OSes joined by ``|``,
  each optionally with a least version, e.g. ``android>=7|ios``, or ``any``/``*``/empty for all).

A Propius evaluation setup becomes these files with ``benchmarks/propius_to_lightrail.py`` (see the README).
"""

from __future__ import annotations

import csv
import io
import math
from dataclasses import dataclass

import numpy as np

from lightrail.errors import ScenarioError
from lightrail.fl.model import OSES, Clients, Jobs, eligibility, os_name, parse_os
from lightrail.fl.policies import static_partition

__all__ = ["Population", "synthetic_population", "synthetic_clients", "synthetic_sessions", "synthetic_jobs",
           "parse_clients", "parse_availability", "parse_jobs", "clients_csv", "availability_csv", "jobs_csv",
           "CLIENTS_HEADER", "AVAILABILITY_HEADER", "JOBS_HEADER", "DAY"]

DAY = 86_400.0
CLIENTS_HEADER = ("client_id", "cpu_ghz", "memory_gb", "os", "speed")
AVAILABILITY_HEADER = ("client_id", "start_s", "end_s")
JOBS_HEADER = ("arrival_s", "min_cpu_ghz", "min_memory_gb", "os", "rounds", "demand", "work")
CLIENTS_OPTIONAL = ("fp16_mem",)
JOBS_OPTIONAL = ("min_fp16_mem",)
"""Columns a trace may add after the required ones (in this order)."""

_MEMORY_GB = (2.0, 3.0, 4.0, 6.0, 8.0, 12.0)
_MEMORY_P = (0.10, 0.20, 0.25, 0.20, 0.15, 0.10)
_OS_P = (0.70, 0.27, 0.02, 0.01)  # android, ios, linux, windows
_ALL_OS = (1 << len(OSES)) - 1
# requirement archetypes: (min_cpu_ghz, min_memory_gb, os_mask); the deal pattern gives 40/30/15/15 %
_KINDS = ((0.0, 0.0, _ALL_OS), (2.0, 4.0, _ALL_OS), (2.4, 8.0, _ALL_OS), (0.0, 4.0, 1 << OSES.index("ios")))
_DEAL = (0, 1, 0, 2, 0, 1, 3, 0, 1, 2, 0, 3, 1, 0, 2, 1, 0, 3, 0, 1)  # 8 open, 6 mid, 3 picky, 3 ios per 20


@dataclass(frozen=True, eq=False)
class Population:
    """Clients, their online sessions (sorted by client then start; ``session_client`` indexes ``clients``), jobs
    (sorted by arrival) and the time span the sessions cover, ``[0, horizon_s)``."""

    clients: Clients
    jobs: Jobs
    session_client: np.ndarray
    session_start: np.ndarray
    session_end: np.ndarray
    horizon_s: float
    client_ids: tuple[str, ...] | None = None
    source: str = "synthetic"

    def eligibility(self) -> np.ndarray:
        return eligibility(self.clients, self.jobs)

    def online_seconds(self, until: float) -> float:
        """Client-seconds online in ``[0, until)``."""
        return float(np.clip(np.minimum(self.session_end, until) - np.maximum(self.session_start, 0.0), 0, None).sum())


# ---- synthetic default ---------------------------------------------------------------------------------------

def synthetic_clients(n: int, rng: np.random.Generator) -> Clients:
    cpu = np.clip(2.0 * rng.lognormal(0.0, 0.25, n), 1.0, 3.5).round(2)
    mem = rng.choice(np.array(_MEMORY_GB), size=n, p=_MEMORY_P)
    os_ = rng.choice(len(OSES), size=n, p=_OS_P).astype(np.int64)
    speed = cpu / 2.0 * rng.lognormal(0.0, 0.6, n)
    return Clients(cpu, mem, os_, speed)


def synthetic_sessions(n: int, horizon_s: float, rng: np.random.Generator, *, sessions_per_day: float = 4.0,
                       session_median_s: float = 1200.0, amplitude: float = 0.8, peak_s: float = 2 * 3600.0,
                       phase_spread_s: float = 3 * 3600.0) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
    """Diurnal Poisson session starts per client (thinning of a ``(1 + amplitude)`` x peak-rate process), lognormal
    lengths, overlaps merged; sessions start from one day before 0 so that some clients are online at 0.
    Returns (client, start, end) sorted by client then start, clipped to ``[0, horizon_s]``."""
    lo = -DAY
    span = horizon_s - lo
    lam_max = sessions_per_day * (1 + amplitude) / DAY
    counts = rng.poisson(lam_max * span, n)
    client = np.repeat(np.arange(n, dtype=np.int64), counts)
    start = lo + rng.uniform(0.0, span, client.size)
    phase = rng.normal(0.0, phase_spread_s, n)[client]
    rate = (1 + amplitude * np.cos(2 * np.pi * (start - peak_s - phase) / DAY)) / (1 + amplitude)
    keep = rng.uniform(size=client.size) < rate
    client, start = client[keep], start[keep]
    end = start + session_median_s * rng.lognormal(0.0, 1.0, client.size)
    return _merge_sessions(client, start, end, 0.0, horizon_s)


def _merge_sessions(client, start, end, lo: float, hi: float):
    """Sort by (client, start), merge overlapping or touching sessions of one client, clip to [lo, hi]."""
    order = np.lexsort((start, client))
    client, start, end = client[order], start[order], end[order]
    if client.size:
        # running max of the end within each client: offset by client so the max never crosses clients
        span = float(max(np.abs(end).max(), np.abs(start).max(), 1.0)) * 4 + 1
        run = np.maximum.accumulate(end + client * span) - client * span
        new = np.ones(client.size, dtype=bool)
        new[1:] = (client[1:] != client[:-1]) | (start[1:] > run[:-1])
        group = np.cumsum(new) - 1
        gstart = start[new]
        gend = np.full(int(group[-1]) + 1, -np.inf)
        np.maximum.at(gend, group, end)
        gend = np.maximum(gend, gstart)
        client, start, end = client[new], gstart, gend
    start, end = np.clip(start, lo, hi), np.clip(end, lo, hi)
    keep = end > start
    return client[keep], start[keep], end[keep]


def synthetic_jobs(n: int, clients: Clients, rng: np.random.Generator, *, job_gap_s: float = 600.0) -> Jobs:
    kinds = rng.permutation(np.resize(np.array(_DEAL), n))
    cpu = np.array([_KINDS[k][0] for k in kinds], dtype=float)
    mem = np.array([_KINDS[k][1] for k in kinds], dtype=float)
    mask = np.array([_KINDS[k][2] for k in kinds], dtype=np.int64)
    rounds = rng.integers(5, 51, n).astype(np.int64)
    demand = rng.integers(10, 201, n).astype(np.int64)
    work = 120.0 * rng.lognormal(0.0, 0.5, n)
    gaps = rng.exponential(job_gap_s, n)
    arrival = np.concatenate([[0.0], np.cumsum(gaps[1:])]) if n else np.zeros(0)
    probe = Jobs(cpu, mem, mask, rounds, demand, work, arrival)
    elig = eligibility(clients, probe)
    owned = np.bincount(static_partition(elig), minlength=n + 1)[:n] if n else np.zeros(0, dtype=np.int64)
    cap = np.minimum(elig.sum(axis=0) // 4, owned // 2)
    demand = np.maximum(1, np.minimum(demand, cap)).astype(np.int64)
    return Jobs(cpu, mem, mask, rounds, demand, work, arrival)


def synthetic_population(clients: int = 10_000, jobs: int = 20, *, seed: int = 0, horizon_s: float = 7 * DAY,
                         job_gap_s: float = 600.0, sessions_per_day: float = 4.0,
                         session_median_s: float = 1200.0) -> Population:
    """The documented default population (module docstring); the same ``seed`` gives the same population."""
    if clients < 1:
        raise ScenarioError(f"clients={clients}", field="clients", fix="use 1 or more")
    if jobs < 1:
        raise ScenarioError(f"jobs={jobs}", field="jobs", fix="use 1 or more")
    if not horizon_s > 0:
        raise ScenarioError(f"horizon_s={horizon_s}", field="horizon_s", fix="use a positive time")
    rng = np.random.default_rng([seed, 0xF1])
    c = synthetic_clients(clients, rng)
    sc, ss, se = synthetic_sessions(clients, horizon_s, rng, sessions_per_day=sessions_per_day,
                                    session_median_s=session_median_s)
    j = synthetic_jobs(jobs, c, rng, job_gap_s=job_gap_s)
    return Population(c, j, sc, ss, se, float(horizon_s))


# ---- trace files ---------------------------------------------------------------------------------------------

def _rows(text: str, header: tuple[str, ...], name: str, field: str, optional: tuple[str, ...] = ()):
    """(line number, {column: text}) per data line, after checking the header (the required columns, then any
    leading part of ``optional``)."""
    lines = [(k, ln) for k, ln in enumerate(text.splitlines(), start=1)
             if ln.strip() and not ln.lstrip().startswith("#")]
    fix = f"write a CSV with the header {','.join(header)}" + (f" (optionally ,{','.join(optional)})"
                                                               if optional else "")
    if not lines:
        raise ScenarioError(f"{name}: empty file", field=field, fix=fix)
    k0, head = lines[0]
    got = [h.strip() for h in head.split(",")]
    if got[:len(header)] != list(header) or got[len(header):] != list(optional[:len(got) - len(header)]):
        raise ScenarioError(f"{name} line {k0}: header {','.join(got)!r} is not {','.join(header)}", field=field,
                            fix=fix)
    header = tuple(got)
    for k, ln in lines[1:]:
        parts = next(csv.reader(io.StringIO(ln)))
        if len(parts) != len(header):
            raise ScenarioError(f"{name} line {k}: {len(parts)} columns, expected {len(header)}", field=field,
                                fix=fix)
        yield k, dict(zip(header, (p.strip() for p in parts), strict=True))


def _num(row: dict, col: str, k: int, name: str, field: str, *, kind=float, lo: float | None = None,
         strict: bool = False) -> float:
    text = row[col]
    try:
        v = kind(text)
    except ValueError:
        raise ScenarioError(f"{name} line {k}, column {col}: cannot read {text!r}", field=field,
                            fix=f"a {'whole number' if kind is int else 'number'}") from None
    if kind is float and not math.isfinite(v):
        raise ScenarioError(f"{name} line {k}, column {col}: {text!r} is not finite", field=field, fix="a number")
    if lo is not None and (v <= lo if strict else v < lo):
        raise ScenarioError(f"{name} line {k}, column {col}: {text!r}", field=field,
                            fix=f"use a value {'above' if strict else 'of at least'} {lo:g}")
    return v


def parse_clients(text: str, *, name: str = "clients", field: str = "--clients-trace") -> tuple[Clients, tuple]:
    """Clients CSV ``client_id,cpu_ghz,memory_gb,os,speed[,fp16_mem]``; returns the clients and their ids (file
    order)."""
    ids, cpu, mem, os_, ver, speed, fp16 = [], [], [], [], [], [], []
    seen: set[str] = set()
    for k, row in _rows(text, CLIENTS_HEADER, name, field, CLIENTS_OPTIONAL):
        cid = row["client_id"]
        if not cid or cid in seen:
            raise ScenarioError(f"{name} line {k}, column client_id: {'empty' if not cid else 'repeated'} "
                                f"id {cid!r}", field=field, fix="one line per client, unique ids")
        seen.add(cid)
        ids.append(cid)
        cpu.append(_num(row, "cpu_ghz", k, name, field, lo=0.0))
        mem.append(_num(row, "memory_gb", k, name, field, lo=0.0))
        code, version = parse_os(row["os"], field=f"{field} ({name} line {k}, column os)")
        os_.append(code)
        ver.append(version)
        speed.append(_num(row, "speed", k, name, field, lo=0.0, strict=True))
        fp16.append(_num(row, "fp16_mem", k, name, field, lo=0.0) if "fp16_mem" in row else 0.0)
    if not ids:
        raise ScenarioError(f"{name}: no client", field=field, fix="one line per client after the header")
    return Clients(np.array(cpu), np.array(mem), np.array(os_, dtype=np.int64), np.array(speed),
                   os_version=np.array(ver), fp16_mem=np.array(fp16)), tuple(ids)


def parse_availability(text: str, client_ids: tuple[str, ...], *, name: str = "availability",
                       field: str = "--availability-trace") -> tuple[np.ndarray, np.ndarray, np.ndarray]:
    """Sessions CSV ``client_id,start_s,end_s`` for the clients ``client_ids``; returns (client, start, end)
    sorted and merged, not clipped (the caller clips to its horizon)."""
    index = {cid: i for i, cid in enumerate(client_ids)}
    cl, st, en = [], [], []
    for k, row in _rows(text, AVAILABILITY_HEADER, name, field):
        cid = row["client_id"]
        if cid not in index:
            raise ScenarioError(f"{name} line {k}, column client_id: unknown client {cid!r}", field=field,
                                fix="use ids from the clients file")
        s = _num(row, "start_s", k, name, field, lo=0.0)
        e = _num(row, "end_s", k, name, field)
        if e <= s:
            raise ScenarioError(f"{name} line {k}, column end_s: {row['end_s']!r} is not after start_s "
                                f"{row['start_s']!r}", field=field, fix="end_s > start_s")
        cl.append(index[cid])
        st.append(s)
        en.append(e)
    c, s, e = np.array(cl, dtype=np.int64), np.array(st, dtype=float), np.array(en, dtype=float)
    return _merge_sessions(c, s, e, 0.0, math.inf)


def _os_mask(text: str, k: int, name: str, field: str) -> tuple[int, list[float]]:
    """(mask of allowed OSes, least version per OS) from ``android>=7|ios``."""
    t = text.strip().lower()
    least = [0.0] * len(OSES)
    if t in ("", "*", "any", "all"):
        return _ALL_OS, least
    mask = 0
    where = f"{field} ({name} line {k}, column os)"
    for part in t.split("|"):
        fam, sep, ver = part.partition(">=")
        code, exact = parse_os(fam, field=where)
        if exact:
            raise ScenarioError(f"{name} line {k}, column os: {part.strip()!r} names a version without >=",
                                field=field, fix=f"a least version: {OSES[code]}>={exact:g}")
        if sep:
            least[code] = _num({"os": ver}, "os", k, name, field, lo=0.0)
        mask |= 1 << code
    return mask, least


def parse_jobs(text: str, *, name: str = "jobs", field: str = "--jobs-trace") -> Jobs:
    """Jobs CSV ``arrival_s,min_cpu_ghz,min_memory_gb,os,rounds,demand,work[,min_fp16_mem]``, sorted by arrival
    (stable: jobs arriving together keep the file's order)."""
    rows = []
    for k, row in _rows(text, JOBS_HEADER, name, field, JOBS_OPTIONAL):
        mask, least = _os_mask(row["os"], k, name, field)
        rows.append((_num(row, "arrival_s", k, name, field, lo=0.0),
                     _num(row, "min_cpu_ghz", k, name, field, lo=0.0),
                     _num(row, "min_memory_gb", k, name, field, lo=0.0),
                     mask,
                     _num(row, "rounds", k, name, field, kind=int, lo=1),
                     _num(row, "demand", k, name, field, kind=int, lo=1),
                     _num(row, "work", k, name, field, lo=0.0, strict=True),
                     least,
                     _num(row, "min_fp16_mem", k, name, field, lo=0.0) if "min_fp16_mem" in row else 0.0))
    if not rows:
        raise ScenarioError(f"{name}: no job", field=field, fix="one line per job after the header")
    rows.sort(key=lambda r: r[0])
    a, cpu, mem, mask, rounds, demand, work, least, fp16 = (list(x) for x in zip(*rows, strict=True))
    return Jobs(np.array(cpu, dtype=float), np.array(mem, dtype=float), np.array(mask, dtype=np.int64),
                np.array(rounds, dtype=np.int64), np.array(demand, dtype=np.int64), np.array(work, dtype=float),
                np.array(a, dtype=float), min_os_version=np.array(least, dtype=float).reshape(len(rows), len(OSES)),
                min_fp16_mem=np.array(fp16, dtype=float))


def clients_csv(clients: Clients, ids: tuple[str, ...] | None = None) -> str:
    """The clients as a trace file (``repr`` floats, so a parse gives them back exactly)."""
    ids = ids or tuple(f"c{i}" for i in range(len(clients)))
    fp16 = bool(clients.fp16_mem.any())
    lines = [",".join(CLIENTS_HEADER + (CLIENTS_OPTIONAL if fp16 else ()))]
    for i in range(len(clients)):
        lines.append(f"{ids[i]},{float(clients.cpu_ghz[i])!r},{float(clients.memory_gb[i])!r},"
                     f"{os_name(int(clients.os[i]), float(clients.os_version[i]))},{float(clients.speed[i])!r}"
                     + (f",{float(clients.fp16_mem[i])!r}" if fp16 else ""))
    return "\n".join(lines) + "\n"


def availability_csv(client, start, end, ids: tuple[str, ...] | None = None) -> str:
    lines = [",".join(AVAILABILITY_HEADER)]
    for c, s, e in zip(client.tolist(), start.tolist(), end.tolist(), strict=True):
        lines.append(f"{ids[c] if ids else f'c{c}'},{s!r},{e!r}")
    return "\n".join(lines) + "\n"


def jobs_csv(jobs: Jobs) -> str:
    fp16 = bool(jobs.min_fp16_mem.any())
    lines = [",".join(JOBS_HEADER + (JOBS_OPTIONAL if fp16 else ()))]
    for j in range(len(jobs)):
        lines.append(f"{float(jobs.arrival_s[j])!r},{float(jobs.min_cpu_ghz[j])!r},{float(jobs.min_memory_gb[j])!r},"
                     f"{jobs.os_text(j, _ALL_OS)},{int(jobs.rounds[j])},{int(jobs.demand[j])},{float(jobs.work[j])!r}"
                     + (f",{float(jobs.min_fp16_mem[j])!r}" if fp16 else ""))
    return "\n".join(lines) + "\n"


def trace_population(clients: Clients, ids: tuple[str, ...], jobs: Jobs, sessions=None, *, seed: int = 0,
                     horizon_s: float = 7 * DAY, source: str = "trace") -> Population:
    """A population from parsed trace files; without ``sessions`` the clients get synthetic diurnal sessions
    (seeded)."""
    if sessions is None:
        sessions = synthetic_sessions(len(clients), horizon_s, np.random.default_rng([seed, 0xA5]))
    c, s, e = _merge_sessions(*sessions, 0.0, horizon_s)
    return Population(clients, jobs, c, s, e, float(horizon_s), client_ids=tuple(ids), source=source)


__all__ += ["trace_population"]
