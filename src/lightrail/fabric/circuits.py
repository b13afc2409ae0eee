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


_REMEMBERED = 4096
"""Configurations, pairs of them and device arrays a :class:`CircuitState` remembers answers for (a plan has a
few dozen); past it, it forgets them all."""


_INDEX = (np.ndarray, int, np.integer)


def _indexes(dev, tx, rx) -> bool:
    """Whether these are arrays or integers: what :class:`CircuitState` remembers answers for (by identity)."""
    return isinstance(dev, _INDEX) and isinstance(tx, _INDEX) and isinstance(rx, _INDEX)


class CircuitState:
    """Circuits of ``devices`` switches of ``ports`` ports each, as arrays (no I/O, no clock of its own).

    ``tx_target[d, i]``: the receiver port lit from transmitter i (-1: dark); ``rx_source`` is its
    inverse. ``tx_dark`` / ``rx_dark``: the time a port is lit again after a change;
    ``tx_busy`` / ``rx_busy``: the time its last traffic ends. A change switches only the ports it
    names and the old peers it darkens (partial reconfiguration); :meth:`rewrite` replaces a whole
    device's configuration (the whole switch goes dark, as Opus does).

    Traffic is recorded lazily: :meth:`occupy` keeps, per set of circuits, the latest end it was given, and
    ``tx_busy`` / ``rx_busy`` apply them when read (a maximum is the same in any order and grouping); the
    latest end on each device is kept at once (:meth:`device_busy`), which is all a whole-switch rewrite reads.
    Answers about a set of circuits (:meth:`all_present`, :meth:`lit_at`) are remembered per set until one of its
    devices changes (each change through :meth:`apply`, :meth:`rewrite` or :meth:`configure` stamps its device):
    the simulator asks about the same circuits op after op. Write the configuration through these methods.
    """

    def __init__(self, devices: int, ports: int, delay: float = 0.0):
        shape = (devices, ports)
        self.delay = float(delay)
        self._tx_target = np.full(shape, -1, np.int64)
        self._rx_source = np.full(shape, -1, np.int64)
        self._tx_dark, self._rx_dark = np.zeros(shape), np.zeros(shape)
        self._rewritten: dict[int, tuple[np.ndarray, np.ndarray, float]] = {}  # dev -> (perm, its inverse, dark)
        self._switched: tuple | None = None  # switched_ports' last answer, with the old peers it found
        self._flat: dict[tuple[int, int, int], tuple] = {}  # array ids -> (the arrays, flat tx and rx indices)
        self._tx_busy, self._rx_busy = np.zeros(shape), np.zeros(shape)
        self._busy_device = np.zeros(devices)  # per device, the latest end of traffic on any of its ports
        self._pending: dict[tuple[int, int, int], list] = {}  # circuits' array ids -> [dev, tx, rx, until]
        self._devices: dict[int, tuple] = {}  # id(dev) -> (dev, its devices each once: an array, a tuple)
        self._row: list[np.ndarray | None] = [None] * devices  # the perm a device holds since its rewrite
        self._inverse: dict[int, tuple[np.ndarray, np.ndarray]] = {}  # id(perm) -> (perm, rx_source row)
        self._same: dict[tuple[int, int], tuple[np.ndarray, np.ndarray, bool, int]] = {}
        self._stamps = [0] * devices  # per device, changes so far
        self._dark: list[float | None] = [0.0] * devices  # per device, when all its ports are lit (None: not one time)
        self._memo: dict[tuple, tuple] = {}  # (question, array ids) -> (its devices' stamps, answer, the arrays)

    @property
    def tx_target(self) -> np.ndarray:
        """``tx_target[d, i]``: the receiver port lit from transmitter i of device d (-1: dark)."""
        self._settle()
        return self._tx_target

    @property
    def rx_source(self) -> np.ndarray:
        """The inverse of ``tx_target``: the transmitter lighting each receiver (-1: none)."""
        self._settle()
        return self._rx_source

    @property
    def tx_dark(self) -> np.ndarray:
        """When each transmitter is lit again after a change."""
        self._settle()
        return self._tx_dark

    @property
    def rx_dark(self) -> np.ndarray:
        """When each receiver is lit again after a change."""
        self._settle()
        return self._rx_dark

    def _settle(self) -> None:
        """Write the rows of the whole-device rewrites not written yet (a rewrite is a few numbers until read:
        the original Opus rewrites rails thousands of times an iteration and reads them through the
        remembered answers)."""
        if self._rewritten:
            for dev, (perm, source, dark) in self._rewritten.items():
                self._tx_target[dev], self._rx_source[dev] = perm, source
                self._tx_dark[dev] = self._rx_dark[dev] = dark
            self._rewritten.clear()

    @property
    def tx_busy(self) -> np.ndarray:
        """When each transmitter's last traffic ends."""
        self._flush()
        return self._tx_busy

    @property
    def rx_busy(self) -> np.ndarray:
        """When each receiver's last traffic ends."""
        self._flush()
        return self._rx_busy

    def device_busy(self, dev: int) -> float:
        """When the last traffic on any port of device ``dev`` ends (0 before any): ``max(tx_busy[dev].max(),
        rx_busy[dev].max(), 0)`` without applying the pending traffic."""
        return float(self._busy_device[dev])

    def _flush(self) -> None:
        if not self._pending:
            return
        ports = self._tx_busy.shape[1]
        tx_busy, rx_busy = self._tx_busy.reshape(-1), self._rx_busy.reshape(-1)
        for key, (dev, tx, rx, until) in self._pending.items():
            flat = self._flat.get(key)
            if flat is None or flat[0] is not dev:  # flat indices of a set of circuits, worked out once
                if len(self._flat) > _REMEMBERED:
                    self._flat.clear()
                flat = self._flat[key] = (dev, tx, rx, dev * ports + tx, dev * ports + rx)
            tx_busy[flat[3]] = np.maximum(tx_busy[flat[3]], until)
            rx_busy[flat[4]] = np.maximum(rx_busy[flat[4]], until)
        self._pending.clear()

    def present(self, dev, tx, rx) -> np.ndarray:
        """Per circuit, whether it is configured (lit or lighting)."""
        if self._rewritten:  # read the rewrites where they are, not written out first (asked at every check-in)
            target = np.stack([self._rewritten[d][0] if d in self._rewritten else self._tx_target[d]
                               for d in range(self._tx_target.shape[0])])
            return target[dev, tx] == rx
        return self._tx_target[dev, tx] == rx

    def all_present(self, dev, tx, rx) -> bool:
        """Whether every one of these circuits is configured: ``present(dev, tx, rx).all()``, remembered."""
        answer = lambda: bool(np.all(self.tx_target[dev, tx] == rx))  # noqa: E731
        if _indexes(dev, tx, rx):
            rows = [self._row[d] for d in self._device_set(dev)]
            if all(row is not None for row in rows):  # devices that hold rewritten configurations: a fixed fact
                key = ("held", *map(id, rows), id(dev), id(tx), id(rx))
                if key not in self._memo:
                    if len(self._memo) > _REMEMBERED:
                        self._memo.clear()
                    self._memo[key] = (None, answer(), rows, dev, tx, rx)  # the arrays held: their ids theirs
                return self._memo[key][1]
        return self._remembered("present", dev, tx, rx, answer)

    def lit_at(self, dev, tx, rx) -> float:
        """When every one of these circuits' ports is lit (remembered until one of their devices changes)."""
        if not len(np.atleast_1d(dev)):
            return 0.0
        if _indexes(dev, tx, rx):
            uniform = [self._dark[d] for d in self._device_set(dev)]
            if None not in uniform:  # whole devices dark until one time each (rewritten, or never changed)
                return float(max(uniform))
        return self._remembered("lit", dev, tx, rx,
                                lambda: float(max(self.tx_dark[dev, tx].max(), self.rx_dark[dev, rx].max())))

    def _remembered(self, question: str, dev, tx, rx, answer):
        """``answer()``, or what it gave for the same arrays while none of their devices has changed since."""
        if not _indexes(dev, tx, rx):
            return answer()
        value = self._recall(question, dev, tx, rx)
        if value is None:
            value = answer()
            self._remember(question, dev, tx, rx, value)
        return value

    def _recall(self, question: str, dev, tx, rx):
        """What was remembered of these arrays while none of their devices has changed since, else None."""
        hit = self._memo.get((question, id(dev), id(tx), id(rx)))
        if hit is not None and hit[0] == tuple([self._stamps[d] for d in self._device_set(dev)]):
            return hit[1]
        return None

    def _remember(self, question: str, dev, tx, rx, value) -> None:
        if len(self._memo) > _REMEMBERED:
            self._memo.clear()
        stamps = tuple([self._stamps[d] for d in self._device_set(dev)])
        self._memo[(question, id(dev), id(tx), id(rx))] = (stamps, value, dev, tx, rx)  # the arrays held

    def known_present(self, dev, tx, rx) -> bool:
        """:meth:`all_present` when it is known without looking at the circuits (remembered, or the devices hold
        rewritten configurations), else False; :meth:`switched_ports` remembers what it finds."""
        if not _indexes(dev, tx, rx):
            return False
        if all(self._row[d] is not None for d in self._device_set(dev)):
            return self.all_present(dev, tx, rx)
        return bool(self._recall("present", dev, tx, rx))

    def _device_set(self, dev) -> tuple[int, ...]:
        """The devices ``dev`` names, each once, in order (remembered per array)."""
        if not isinstance(dev, np.ndarray):
            return (int(dev),)
        devices = self._devices.get(id(dev))
        if devices is None:
            if len(self._devices) > _REMEMBERED:
                self._flush()  # no pending traffic refers to a forgotten entry
                self._devices.clear()
            # with return_counts np.unique skips its np.ma check: importing numpy.ma is ~20 ms of a small job
            unique = np.unique(np.asarray(dev, np.int64), return_counts=True)[0]
            devices = self._devices[id(dev)] = (dev, unique, tuple(unique.tolist()))
        return devices[2]

    def _changed(self, devices) -> None:
        for d in devices:
            self._stamps[d] += 1
            self._row[d] = None
            self._dark[d] = None

    def switched_ports(self, dev, tx, rx):
        """Ports that lighting circuits ``tx -> rx`` would switch: (device, tx port) and (device, rx port)
        arrays, the new circuits' ends plus the old peers they darken (missing circuits only)."""
        asked = (dev, tx, rx)
        dev, tx, rx = (np.asarray(a, np.int64) for a in (dev, tx, rx))
        ports = self._tx_target.shape[1]
        target, source = self.tx_target.reshape(-1), self.rx_source.reshape(-1)  # flat: one index, not two
        miss = target[dev * ports + tx] != rx
        if _indexes(*asked):
            self._remember("present", *asked, not miss.any())
        dev, tx, rx = dev[miss], tx[miss], rx[miss]
        old_rx = target[dev * ports + tx]
        old_tx = source[dev * ports + rx]
        tx_dev = np.concatenate([dev, dev[old_tx >= 0]])
        tx_port = np.concatenate([tx, old_tx[old_tx >= 0]])
        rx_dev = np.concatenate([dev, dev[old_rx >= 0]])
        rx_port = np.concatenate([rx, old_rx[old_rx >= 0]])
        switched = (tx_dev, tx_port), (rx_dev, rx_port), (dev, tx, rx)
        self._switched = (switched, old_rx, old_tx)  # what apply(switched=...) takes on
        return switched

    def apply(self, dev, tx, rx, start, *, switched=None) -> float:
        """Light circuits ``tx -> rx`` on devices ``dev``, the change starting at ``start`` (a scalar, or one
        time per device); returns when they are lit. Circuits already present are left alone. ``switched``:
        what :meth:`switched_ports` just said of these circuits (nothing changed since), not worked out again."""
        if switched is None or self._switched is None or self._switched[0] is not switched:
            switched = self.switched_ports(dev, tx, rx)
        _, old_rx, old_tx = self._switched
        self._switched = None
        (tx_dev, tx_port), (rx_dev, rx_port), (dev, tx, rx) = switched
        if not len(dev):
            return 0.0
        ports = self._tx_target.shape[1]
        start = np.broadcast_to(np.asarray(start, float), (self._tx_target.shape[0],))
        lit = start + self.delay  # per device: each port's is start[device] + delay, as before
        self.tx_dark.reshape(-1)[tx_dev * ports + tx_port] = lit[tx_dev]
        self.rx_dark.reshape(-1)[rx_dev * ports + rx_port] = lit[rx_dev]
        self._changed(np.flatnonzero(np.bincount(dev, minlength=len(self._stamps))).tolist())
        target, source = self._tx_target.reshape(-1), self._rx_source.reshape(-1)
        target[dev[old_tx >= 0] * ports + old_tx[old_tx >= 0]] = -1
        source[dev[old_rx >= 0] * ports + old_rx[old_rx >= 0]] = -1
        target[dev * ports + tx] = rx
        source[dev * ports + rx] = tx
        return float(np.max(start[dev])) + self.delay

    def rewrite(self, dev: int, perm: np.ndarray, start: float) -> tuple[float, int]:
        """Replace device ``dev``'s whole configuration by ``perm``; every port goes dark for the delay.
        Returns (lit at, number of transmitters whose circuit changed)."""
        perm = np.asarray(perm, np.int64)
        held = self._row[dev]
        changed = self._compare(held, perm)[1] if held is not None else int(np.sum(perm != self.tx_target[dev]))
        if id(perm) not in self._inverse:  # a plan's configurations repeat: each inverted once
            if len(self._inverse) > _REMEMBERED:
                self._inverse.clear()
            source = np.full(len(perm), -1, np.int64)
            lit = np.flatnonzero(perm >= 0)
            source[perm[lit]] = lit
            self._inverse[id(perm)] = (perm, source)
        dark = start + self.delay
        self._rewritten[dev] = (perm, self._inverse[id(perm)][1], dark)  # written when the arrays are next read
        self._changed((dev,))
        self._row[dev] = perm
        self._dark[dev] = float(dark)  # the float64 the row will hold
        return start + self.delay, changed

    def holds(self, dev: int, perm: np.ndarray) -> bool:
        """Whether device ``dev``'s configuration is ``perm`` (``np.array_equal``; remembered per pair of
        configurations while the device holds what :meth:`rewrite` wrote)."""
        held = self._row[dev]
        if held is None:
            return bool(np.array_equal(perm, self.tx_target[dev]))
        return held is perm or self._compare(held, perm)[0]

    def _compare(self, old: np.ndarray, new: np.ndarray) -> tuple[bool, int]:
        """(equal, transmitters whose target differs) between two configurations, computed once per pair."""
        key = (id(old), id(new))
        if key not in self._same:  # the arrays are kept with the answer: their ids stay theirs
            if len(self._same) > _REMEMBERED:
                self._same.clear()
            self._same[key] = (old, new, bool(np.array_equal(new, old)), int(np.sum(new != old)))
        return self._same[key][2:]

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
        self._changed((dev,))
        self.tx_target[dev], self.rx_source[dev] = perm, source
        self.tx_dark[dev, ins] = start + self.delay
        self.rx_dark[dev, outs] = start + self.delay
        return start + self.delay, ins, outs

    def occupy(self, dev, tx, rx, until: float) -> None:
        """Traffic on circuits ``tx -> rx`` until ``until``. Applied to ``tx_busy`` / ``rx_busy`` when they are
        next read (arrays, kept unchanged by the caller, that name the same circuits each time are applied once
        with their latest end); one value for all ports, so a repeated port gets the same maximum."""
        if not (isinstance(dev, np.ndarray) and isinstance(tx, np.ndarray) and isinstance(rx, np.ndarray)):
            # scalars, lists: applied now
            self._tx_busy[dev, tx] = np.maximum(self._tx_busy[dev, tx], until)
            self._rx_busy[dev, rx] = np.maximum(self._rx_busy[dev, rx], until)
            self._busy_device[dev] = np.maximum(self._busy_device[dev], until)
            return
        if not dev.size:
            return
        self._device_set(dev)
        unique = self._devices[id(dev)][1]
        self._busy_device[unique] = np.maximum(self._busy_device[unique], until)
        key = (id(dev), id(tx), id(rx))
        pending = self._pending.get(key)
        if pending is None:
            self._pending[key] = [dev, tx, rx, until]  # holding the arrays keeps their ids theirs
        elif until > pending[3]:
            pending[3] = until
