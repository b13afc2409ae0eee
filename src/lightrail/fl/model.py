"""Clients and jobs of collaborative ML as arrays, and who may serve whom.

A client is an edge device with a CPU speed (GHz), memory (GB) and an OS; a job asks for a minimum CPU speed and
memory and a set of OSes (Propius, sec. 3: jobs register client requirements), and runs ``rounds`` rounds, each
needing ``demand`` clients to return a result. ``eligible[c, j]`` is True where client c meets job j's requirements.
"""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np

from lightrail.errors import ScenarioError

__all__ = ["OSES", "Clients", "Jobs", "eligibility", "os_code"]

#: Operating systems of the emulated devices, in code order (a client's ``os`` is an index into this).
OSES = ("android", "ios", "linux", "windows")


def os_code(name: str, *, field: str = "os") -> int:
    try:
        return OSES.index(str(name).strip().lower())
    except ValueError:
        raise ScenarioError(f"unknown OS {name!r}", field=field, fix=f"one of: {', '.join(OSES)}") from None


@dataclass(frozen=True, eq=False)
class Clients:
    """``cpu_ghz``, ``memory_gb`` and ``os`` (index into OSES) per client; ``speed`` is work units per second."""

    cpu_ghz: np.ndarray
    memory_gb: np.ndarray
    os: np.ndarray
    speed: np.ndarray

    def __len__(self) -> int:
        return len(self.cpu_ghz)

    def attributes(self, c: int) -> dict:
        """Client ``c`` as the attributes it checks in with."""
        return {"cpu_ghz": float(self.cpu_ghz[c]), "memory_gb": float(self.memory_gb[c]), "os": OSES[int(self.os[c])]}


@dataclass(frozen=True, eq=False)
class Jobs:
    """Per job: requirements (``min_cpu_ghz``, ``min_memory_gb``, ``os_mask``: bit i allows OSES[i]), ``rounds``,
    ``demand`` (clients per round), ``work`` (work units one client computes per round) and ``arrival_s``."""

    min_cpu_ghz: np.ndarray
    min_memory_gb: np.ndarray
    os_mask: np.ndarray
    rounds: np.ndarray
    demand: np.ndarray
    work: np.ndarray
    arrival_s: np.ndarray

    def __len__(self) -> int:
        return len(self.rounds)

    def service(self) -> np.ndarray:
        """Client-rounds each job needs in all (its total service)."""
        return self.rounds * self.demand

    def requirements(self, j: int) -> dict:
        """Job ``j``'s requirements as it registers them."""
        return {"min_cpu_ghz": float(self.min_cpu_ghz[j]), "min_memory_gb": float(self.min_memory_gb[j]),
                "os": [o for i, o in enumerate(OSES) if int(self.os_mask[j]) >> i & 1]}


def eligibility(clients: Clients, jobs: Jobs) -> np.ndarray:
    """(C, J) booleans: client c meets job j's CPU, memory and OS requirements.

    >>> c = Clients(np.array([2.0, 3.0]), np.array([4.0, 8.0]), np.array([0, 2]), np.ones(2))
    >>> j = Jobs(np.array([2.5]), np.array([4.0]), np.array([0b0101]), np.array([1]), np.array([1]), np.ones(1),
    ...          np.zeros(1))
    >>> eligibility(c, j).ravel().tolist()
    [False, True]
    """
    cpu = clients.cpu_ghz[:, None] >= jobs.min_cpu_ghz[None, :]
    mem = clients.memory_gb[:, None] >= jobs.min_memory_gb[None, :]
    os_ok = (jobs.os_mask[None, :].astype(np.int64) >> clients.os[:, None].astype(np.int64)) & 1
    return cpu & mem & os_ok.astype(bool)
