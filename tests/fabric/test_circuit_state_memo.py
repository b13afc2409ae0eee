"""CircuitState remembers answers (circuits present, when they are lit, per-device traffic) and applies traffic
lazily: after any sequence of changes and traffic, every answer must equal the one worked out from the arrays."""

from __future__ import annotations

import numpy as np
import pytest

from lightrail.fabric.circuits import CircuitState
from lightrail.sim.rails import _rail_runs

DEVICES, PORTS = 3, 6


def _circuits(rng, rows: list[np.ndarray]) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
    """A set of circuits, sorted by device as the planner's are, one per transmitter and receiver per device."""
    dev, tx, rx = [], [], []
    for d in sorted(rng.choice(DEVICES, size=rng.integers(1, DEVICES + 1), replace=False).tolist()):
        perm = rows[d] if rng.random() < 0.5 else rng.permutation(PORTS)
        keep = np.flatnonzero(rng.random(PORTS) < 0.6)
        dev += [d] * len(keep)
        tx += keep.tolist()
        rx += perm[keep].tolist()
    return np.array(dev, np.int64), np.array(tx, np.int64), np.array(rx, np.int64)


@pytest.mark.parametrize("seed", range(20))
def test_remembered_answers_equal_the_arrays_after_random_changes_and_traffic(seed):
    rng = np.random.default_rng(seed)
    state = CircuitState(DEVICES, PORTS, delay=0.5)
    rows = [rng.permutation(PORTS) for _ in range(DEVICES)]  # configurations a rewrite installs, reused by object
    sets = [_circuits(rng, rows) for _ in range(6)]  # circuit sets asked about again and again, by object
    tx_busy, rx_busy = np.zeros((DEVICES, PORTS)), np.zeros((DEVICES, PORTS))  # traffic applied at once
    now = 0.0
    for _ in range(60):
        now += float(rng.random())
        dev, tx, rx = sets[rng.integers(len(sets))]
        match int(rng.integers(4)):
            case 0:
                state.apply(dev, tx, rx, now)
            case 1:
                d = int(rng.integers(DEVICES))
                state.rewrite(d, rows[d] if rng.random() < 0.7 else rng.permutation(PORTS), now)
            case 2:
                state.occupy(dev, tx, rx, now)
                tx_busy[dev, tx] = np.maximum(tx_busy[dev, tx], now)
                rx_busy[dev, rx] = np.maximum(rx_busy[dev, rx], now)
            case _:
                state.configure(int(rng.integers(DEVICES)), rng.permutation(PORTS), now)
        for dev, tx, rx in sets:
            truth = bool(np.all(state.tx_target[dev, tx] == rx))
            assert not state.known_present(dev, tx, rx) or truth  # known: never wrongly
            if rng.random() < 0.5:
                assert (len(state.switched_ports(dev, tx, rx)[2][0]) == 0) == truth
                assert state.known_present(dev, tx, rx) == truth  # switched_ports remembered what it found
            assert state.all_present(dev, tx, rx) == truth
            assert state.lit_at(dev, tx, rx) == float(max(state.tx_dark[dev, tx].max(), state.rx_dark[dev, rx].max()))
        for d in range(DEVICES):
            assert state.device_busy(d) == max(0.0, tx_busy[d].max(), rx_busy[d].max())
            assert state.holds(d, rows[d]) == bool(np.array_equal(rows[d], state.tx_target[d]))
    assert np.array_equal(state.tx_busy, tx_busy) and np.array_equal(state.rx_busy, rx_busy)


def test_a_rewrite_counts_the_transmitters_that_change_against_what_the_device_holds():
    state = CircuitState(1, 4)
    first, second = np.array([1, 0, 3, 2]), np.array([1, 2, 3, 0])
    assert state.rewrite(0, first, 0.0)[1] == 4  # from dark
    assert state.rewrite(0, second, 1.0)[1] == 2
    assert state.rewrite(0, first, 2.0)[1] == 2  # the pair's answer remembered: the same count
    state.apply(np.array([0]), np.array([1]), np.array([2]), 3.0)  # 1 -> 2, darkening 3 -> 2: neither now
    assert state.tx_target[0].tolist() == [1, 2, 3, -1] and not state.holds(0, first)
    assert state.rewrite(0, first, 4.0)[1] == 2  # counted against the arrays, not the pair remembered


def test_rail_runs_start_where_the_rail_changes():
    rng = np.random.default_rng(0)
    for _ in range(50):
        parts = [np.sort(rng.integers(0, 5, size=rng.integers(1, 9))) for _ in range(rng.integers(1, 4))]
        rail = np.concatenate(parts).astype(np.int64)
        starts = _rail_runs(rail)
        ends = [*starts[1:].tolist(), len(rail)]
        assert starts[0] == 0
        for a, z in zip(starts.tolist(), ends, strict=True):
            assert (rail[a:z] == rail[a]).all() and (z == len(rail) or rail[z] != rail[a])
