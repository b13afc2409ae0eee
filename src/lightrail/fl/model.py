"""Clients and jobs of collaborative ML as arrays, and who may serve whom.

A client is an edge device with a CPU speed (GHz), memory (GB), an OS and its version, and fp16 memory; a job asks
for a minimum CPU speed and memory, a set of OSes with an optional minimum version each, and a minimum fp16
memory (Propius, sec. 3: jobs register client requirements; its evaluation's public constraints are ``cpu_f``,
``ram``, ``fp16_mem`` and ``android_os``, each a minimum, ``propius/global_config.yml`` ``job_public_constraint``
and ``propius/controller/util/commons.py`` ``geq``), and runs ``rounds`` rounds, each needing ``demand`` clients to
return a result. ``eligible[c, j]`` is True where client c meets job j's requirements.
"""

from __future__ import annotations

import re
from dataclasses import dataclass

import numpy as np

from lightrail.errors import ScenarioError

__all__ = ["OSES", "Clients", "Jobs", "eligibility", "os_code", "parse_os", "os_name"]

#: Operating systems of the emulated devices, in code order (a client's ``os`` is an index into this).
OSES = ("android", "ios", "linux", "windows")


_OS_RE = re.compile(r"^([a-z]+)[\s_-]*(\d+(?:\.\d+)?)?$")


def parse_os(name: str, *, field: str = "os") -> tuple[int, float]:
    """An OS with an optional version, ``android``, ``android13``, ``android 13`` or ``ios17.2``: (index into
    OSES, version; 0 when not given).

    >>> parse_os("android13"), parse_os("iOS 17.2"), parse_os("linux")
    ((0, 13.0), (1, 17.2), (2, 0.0))
    """
    text = str(name).strip().lower()
    m = _OS_RE.match(text)
    if m is None or m.group(1) not in OSES:
        raise ScenarioError(f"unknown OS {name!r}", field=field,
                            fix=f"one of: {', '.join(OSES)}, optionally with a version: android13, ios17.2")
    return OSES.index(m.group(1)), float(m.group(2) or 0.0)


def os_code(name: str, *, field: str = "os") -> int:
    """The OS's index into OSES (a version, if given, is accepted and dropped)."""
    return parse_os(name, field=field)[0]


def os_name(code: int, version: float = 0.0) -> str:
    """``android13`` for (0, 13.0); ``android`` without a version."""
    if not version:
        return OSES[int(code)]
    return f"{OSES[int(code)]}{version:g}"


def _fill(obj, name: str, shape, value) -> None:
    """Default an optional array field of a frozen dataclass (older callers give the first fields only)."""
    if getattr(obj, name) is None:
        object.__setattr__(obj, name, np.full(shape, value, dtype=float))
    else:
        object.__setattr__(obj, name, np.asarray(getattr(obj, name), dtype=float))


@dataclass(frozen=True, eq=False)
class Clients:
    """``cpu_ghz``, ``memory_gb`` and ``os`` (index into OSES) per client; ``speed`` is work units per second;
    ``os_version`` (0: unknown, meets no minimum version) and ``fp16_mem`` (Propius's ``fp16_mem``, MB; 0 when
    unknown) default to zeros."""

    cpu_ghz: np.ndarray
    memory_gb: np.ndarray
    os: np.ndarray
    speed: np.ndarray
    os_version: np.ndarray | None = None
    fp16_mem: np.ndarray | None = None

    def __post_init__(self):
        _fill(self, "os_version", len(self.cpu_ghz), 0.0)
        _fill(self, "fp16_mem", len(self.cpu_ghz), 0.0)

    def __len__(self) -> int:
        return len(self.cpu_ghz)

    def attributes(self, c: int) -> dict:
        """Client ``c`` as the attributes it checks in with."""
        return {"cpu_ghz": float(self.cpu_ghz[c]), "memory_gb": float(self.memory_gb[c]),
                "os": os_name(int(self.os[c]), float(self.os_version[c]))}


@dataclass(frozen=True, eq=False)
class Jobs:
    """Per job: requirements (``min_cpu_ghz``, ``min_memory_gb``, ``os_mask``: bit i allows OSES[i]), ``rounds``,
    ``demand`` (clients per round), ``work`` (work units one client computes per round) and ``arrival_s``;
    ``min_os_version`` (J, len(OSES)): the least version of each allowed OS (0: any), and ``min_fp16_mem``
    default to zeros."""

    min_cpu_ghz: np.ndarray
    min_memory_gb: np.ndarray
    os_mask: np.ndarray
    rounds: np.ndarray
    demand: np.ndarray
    work: np.ndarray
    arrival_s: np.ndarray
    min_os_version: np.ndarray | None = None
    min_fp16_mem: np.ndarray | None = None

    def __post_init__(self):
        _fill(self, "min_os_version", (len(self.rounds), len(OSES)), 0.0)
        _fill(self, "min_fp16_mem", len(self.rounds), 0.0)

    def select(self, keep) -> Jobs:
        """The jobs at ``keep`` (an index or mask), every field."""
        return Jobs(*(getattr(self, f)[keep] for f in ("min_cpu_ghz", "min_memory_gb", "os_mask", "rounds", "demand",
                                                      "work", "arrival_s", "min_os_version", "min_fp16_mem")))

    def __len__(self) -> int:
        return len(self.rounds)

    def service(self) -> np.ndarray:
        """Client-rounds each job needs in all (its total service)."""
        return self.rounds * self.demand

    def requirements(self, j: int) -> dict:
        """Job ``j``'s requirements as it registers them."""
        return {"min_cpu_ghz": float(self.min_cpu_ghz[j]), "min_memory_gb": float(self.min_memory_gb[j]),
                "os": [o for i, o in enumerate(OSES) if int(self.os_mask[j]) >> i & 1]}

    def os_text(self, j: int, all_mask: int) -> str:
        """Job ``j``'s OSes as a trace file writes them: ``any``, ``android|ios`` or ``android>=7|ios``."""
        m = int(self.os_mask[j])
        if m == all_mask and not self.min_os_version[j].any():
            return "any"
        return "|".join(o + (f">={self.min_os_version[j, i]:g}" if self.min_os_version[j, i] else "")
                        for i, o in enumerate(OSES) if m >> i & 1)


def eligibility(clients: Clients, jobs: Jobs) -> np.ndarray:
    """(C, J) booleans: client c meets job j's CPU, memory, OS (and OS version) and fp16 memory requirements,
    each a minimum as Propius's ``geq`` compares them.

    >>> c = Clients(np.array([2.0, 3.0]), np.array([4.0, 8.0]), np.array([0, 2]), np.ones(2))
    >>> j = Jobs(np.array([2.5]), np.array([4.0]), np.array([0b0101]), np.array([1]), np.array([1]), np.ones(1),
    ...          np.zeros(1))
    >>> eligibility(c, j).ravel().tolist()
    [False, True]
    """
    cpu = clients.cpu_ghz[:, None] >= jobs.min_cpu_ghz[None, :]
    mem = clients.memory_gb[:, None] >= jobs.min_memory_gb[None, :]
    os_ok = (jobs.os_mask[None, :].astype(np.int64) >> clients.os[:, None].astype(np.int64)) & 1
    version = clients.os_version[:, None] >= jobs.min_os_version.T[clients.os.astype(np.int64)]
    fp16 = clients.fp16_mem[:, None] >= jobs.min_fp16_mem[None, :]
    return cpu & mem & os_ok.astype(bool) & version & fp16
