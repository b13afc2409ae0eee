"""Traffic matrices: a gravity model with a diurnal cycle per node (local time from longitude) and
per-matrix noise, the usual synthetic WAN workload (Roughan's gravity model; diurnal variation as
in measured backbone traces such as GEANT's and Abilene's).

A node's mass is its measured traffic where the dataset has one (SNDlib's demands), else a
lognormal draw (heavy-tailed, as PoP traffic is). ``d_ij(t) = m_i m_j * sqrt(f_i(t) f_j(t)) * e_ij(t)``
with ``f_i(t) = 1 + amplitude * sin(2 pi (t + lon_i / 15 h) / 24 h)`` and lognormal noise ``e``
of the given sigma; matrices are ``interval_min`` apart. Units are relative (the mean matrix sums
to 1); ``decentral.scale_to_load`` sets Gbps.
"""

from __future__ import annotations

import numpy as np

from lightrail.errors import ScenarioError
from lightrail.te.network import Wan

__all__ = ["gravity"]


def gravity(wan: Wan, matrices: int, *, seed: int = 0, interval_min: float = 5.0, amplitude: float = 0.4,
            noise: float = 0.1) -> np.ndarray:
    """``matrices`` gravity traffic matrices, shape (T, n, n), zero diagonal.

    >>> tm = gravity(Wan.from_edges("pair", ["a", "b"], [(0, 1)]), 3, noise=0.0, amplitude=0.0)
    >>> tm.shape, float(tm[0, 0, 1]), float(tm[0, 1, 0])
    ((3, 2, 2), 0.5, 0.5)
    """
    if not isinstance(matrices, int | np.integer) or matrices < 1:
        raise ScenarioError(f"{matrices!r} traffic matrices", field="--matrices", fix="use an integer >= 1")
    if not 0 <= amplitude < 1:
        raise ScenarioError(f"diurnal amplitude {amplitude}", field="amplitude", fix="use 0 <= amplitude < 1")
    if noise < 0:
        raise ScenarioError(f"noise sigma {noise}", field="noise", fix="use a sigma >= 0")
    rng = np.random.default_rng(seed)
    n = wan.n
    mass = wan.mass if wan.mass is not None else rng.lognormal(0.0, 1.0, n)
    mass = np.asarray(mass, dtype=float) / mass.sum()
    base = np.outer(mass, mass)
    np.fill_diagonal(base, 0.0)
    base /= base.sum()
    hours = np.arange(matrices)[:, None] * interval_min / 60.0
    lon = np.nan_to_num(wan.lon, nan=0.0)[None, :]
    f = 1.0 + amplitude * np.sin(2 * np.pi * (hours + lon / 15.0) / 24.0)  # (T, n)
    tms = base[None] * np.sqrt(f[:, :, None] * f[:, None, :])
    if noise > 0:
        tms = tms * rng.lognormal(-noise * noise / 2, noise, tms.shape)  # mean-one noise
    tms[:, np.arange(n), np.arange(n)] = 0.0
    return tms
