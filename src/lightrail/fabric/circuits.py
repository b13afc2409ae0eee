"""OCS configurations: partial permutations of TX ports onto RX ports.

``perm[i] = j`` means a circuit from port i's transmitter to port j's receiver; ``-1`` leaves
port i dark. A duplex configuration is a symmetric one (``perm[perm[i]] == i``).
"""

from __future__ import annotations

import numpy as np

from lightrail.errors import InfeasibleError

__all__ = ["is_partial_permutation", "check_partial_permutation", "is_duplex", "ring_permutation"]


def is_partial_permutation(perm, n: int | None = None) -> bool:
    """True if no two inputs share an output, every port exists and none loops to itself."""
    perm = np.asarray(perm)
    if perm.ndim != 1 or not np.issubdtype(perm.dtype, np.integer) and len(perm):
        return False
    n = len(perm) if n is None else n
    lit = perm[perm >= 0]
    return bool(perm.ndim == 1 and np.all(perm >= -1) and np.all(lit < n)
                and len(np.unique(lit)) == len(lit) and not np.any(perm == np.arange(len(perm))))


def check_partial_permutation(perm, n: int | None = None, *, field: str = "configuration") -> np.ndarray:
    """Return ``perm`` as an int array, or raise :class:`InfeasibleError` naming the bad port."""
    perm = np.asarray(perm)
    if perm.ndim != 1 or not np.issubdtype(perm.dtype, np.integer):
        raise InfeasibleError("must be a flat list of port numbers (-1 for no circuit)", field=field)
    n = len(perm) if n is None else n
    bad = np.flatnonzero((perm < -1) | (perm >= n))
    if len(bad):
        raise InfeasibleError(f"port {bad[0]} points to {perm[bad[0]]}, which is not a port of {n}",
                              field=field, fix=f"use ports 0..{n - 1} or -1")
    loops = np.flatnonzero(perm == np.arange(len(perm)))
    if len(loops):
        raise InfeasibleError(f"port {loops[0]} is connected to itself", field=field)
    lit = np.flatnonzero(perm >= 0)
    out, first = np.unique(perm[lit], return_index=True)
    if len(out) < len(lit):
        dup = np.setdiff1d(np.arange(len(lit)), first)[0]
        j = perm[lit[dup]]
        inputs = lit[perm[lit] == j]
        raise InfeasibleError(f"inputs {inputs[0]} and {inputs[1]} both go to output {j}", field=field,
                              fix="an OCS output port takes one input at a time")
    return perm.astype(np.int64)


def is_duplex(perm) -> bool:
    """True if every circuit has its reverse (a matching of bidirectional circuits)."""
    perm = np.asarray(perm)
    lit = np.flatnonzero(perm >= 0)
    return bool(np.all(perm[perm[lit]] == lit))


def ring_permutation(n: int, step: int = 1) -> np.ndarray:
    """Port i to port (i + step) mod n: one direction of a ring."""
    return (np.arange(n) + step) % n
