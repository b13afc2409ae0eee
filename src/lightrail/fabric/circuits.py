"""OCS configurations: partial permutations of TX ports onto RX ports, and the circuit state of switches.

``perm[i] = j`` means a circuit from port i's transmitter to port j's receiver; ``-1`` leaves
port i dark. A duplex configuration is a symmetric one (``perm[perm[i]] == i``).

:class:`CircuitState` is the one model of what switches hold over time, shared by the iteration
simulator's rails and the runtime's emulated OCS: per device, the configuration as permutation
arrays, when each port is lit again (dark until), and when each port last carries traffic.
Applying a change returns when its circuits are lit.
"""

from __future__ import annotations

import numpy as np

from lightrail.errors import InfeasibleError

__all__ = ["is_partial_permutation", "check_partial_permutation", "is_duplex", "ring_permutation", "CircuitState"]


def is_partial_permutation(perm, n: int | None = None) -> bool:
    """True if no two inputs share an output, every port exists and none loops to itself.

    >>> is_partial_permutation([1, 0, -1]), is_partial_permutation([1, 1, 0])
    (True, False)
    """
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


class CircuitState:
    """Circuits of ``devices`` switches of ``ports`` ports each, as arrays (no I/O, no clock of its own).

    ``tx_target[d, i]``: the receiver port lit from transmitter i (-1: dark); ``rx_source`` is its
    inverse. ``tx_dark`` / ``rx_dark``: the time a port is lit again after a change;
    ``tx_busy`` / ``rx_busy``: the time its last traffic ends. A change switches only the ports it
    names and the old peers it darkens (partial reconfiguration); :meth:`rewrite` replaces a whole
    device's configuration (the whole switch goes dark, as Opus does).
    """

    def __init__(self, devices: int, ports: int, delay: float = 0.0):
        shape = (devices, ports)
        self.delay = float(delay)
        self.tx_target = np.full(shape, -1, np.int64)
        self.rx_source = np.full(shape, -1, np.int64)
        self.tx_dark, self.rx_dark = np.zeros(shape), np.zeros(shape)
        self.tx_busy, self.rx_busy = np.zeros(shape), np.zeros(shape)

    def present(self, dev, tx, rx) -> np.ndarray:
        """Per circuit, whether it is configured (lit or lighting)."""
        return self.tx_target[dev, tx] == rx

    def lit_at(self, dev, tx, rx) -> float:
        """When every one of these circuits' ports is lit."""
        if not len(np.atleast_1d(dev)):
            return 0.0
        return float(max(self.tx_dark[dev, tx].max(), self.rx_dark[dev, rx].max()))

    def switched_ports(self, dev, tx, rx):
        """Ports that lighting circuits ``tx -> rx`` would switch: (device, tx port) and (device, rx port)
        arrays, the new circuits' ends plus the old peers they darken (missing circuits only)."""
        dev, tx, rx = (np.asarray(a, np.int64) for a in (dev, tx, rx))
        miss = ~self.present(dev, tx, rx)
        dev, tx, rx = dev[miss], tx[miss], rx[miss]
        old_rx = self.tx_target[dev, tx]
        old_tx = self.rx_source[dev, rx]
        tx_dev = np.concatenate([dev, dev[old_tx >= 0]])
        tx_port = np.concatenate([tx, old_tx[old_tx >= 0]])
        rx_dev = np.concatenate([dev, dev[old_rx >= 0]])
        rx_port = np.concatenate([rx, old_rx[old_rx >= 0]])
        return (tx_dev, tx_port), (rx_dev, rx_port), (dev, tx, rx)

    def apply(self, dev, tx, rx, start) -> float:
        """Light circuits ``tx -> rx`` on devices ``dev``, the change starting at ``start`` (a scalar, or one
        time per device); returns when they are lit. Circuits already present are left alone."""
        (tx_dev, tx_port), (rx_dev, rx_port), (dev, tx, rx) = self.switched_ports(dev, tx, rx)
        if not len(dev):
            return 0.0
        start = np.broadcast_to(np.asarray(start, float), (self.tx_target.shape[0],))
        self.tx_dark[tx_dev, tx_port] = start[tx_dev] + self.delay
        self.rx_dark[rx_dev, rx_port] = start[rx_dev] + self.delay
        old_rx, old_tx = self.tx_target[dev, tx], self.rx_source[dev, rx]
        self.tx_target[dev[old_tx >= 0], old_tx[old_tx >= 0]] = -1
        self.rx_source[dev[old_rx >= 0], old_rx[old_rx >= 0]] = -1
        self.tx_target[dev, tx] = rx
        self.rx_source[dev, rx] = tx
        return float(np.max(start[dev])) + self.delay

    def rewrite(self, dev: int, perm: np.ndarray, start: float) -> tuple[float, int]:
        """Replace device ``dev``'s whole configuration by ``perm``; every port goes dark for the delay.
        Returns (lit at, number of transmitters whose circuit changed)."""
        perm = np.asarray(perm, np.int64)
        changed = int(np.sum(perm != self.tx_target[dev]))
        self.tx_target[dev] = perm
        self.rx_source[dev] = -1
        lit = np.flatnonzero(perm >= 0)
        self.rx_source[dev, perm[lit]] = lit
        self.tx_dark[dev] = self.rx_dark[dev] = start + self.delay
        return start + self.delay, changed

    def configure(self, dev: int, perm: np.ndarray, start: float) -> tuple[float, np.ndarray, np.ndarray]:
        """Move device ``dev`` to configuration ``perm``, darkening only the inputs and outputs whose
        circuit changes. Returns (lit at, changed inputs, changed outputs); lit at is ``start`` when
        nothing changes."""
        perm = np.asarray(perm, np.int64)
        source = np.full(len(perm), -1, np.int64)
        lit = np.flatnonzero(perm >= 0)
        source[perm[lit]] = lit
        ins = np.flatnonzero(perm != self.tx_target[dev])
        outs = np.flatnonzero(source != self.rx_source[dev])
        if not len(ins) and not len(outs):
            return start, ins, outs
        self.tx_target[dev], self.rx_source[dev] = perm, source
        self.tx_dark[dev, ins] = start + self.delay
        self.rx_dark[dev, outs] = start + self.delay
        return start + self.delay, ins, outs

    def occupy(self, dev, tx, rx, until: float) -> None:
        """Traffic on circuits ``tx -> rx`` until ``until``."""
        # one value for all: a repeated port gets the same max, so plain indexing is exact (and no ufunc.at)
        self.tx_busy[dev, tx] = np.maximum(self.tx_busy[dev, tx], until)
        self.rx_busy[dev, rx] = np.maximum(self.rx_busy[dev, rx], until)
