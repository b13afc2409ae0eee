"""FedAvg arithmetic of the parameter servers (Propius's data plane), apart from any HTTP.

The rule, one place for the root and the leaves:

* a client's result is an *update* ``u_i`` (a vector of the model's length) and optionally its sample count;
* a job's ``weighting`` is ``"uniform"`` (default: every result weighs 1, a plain mean) or ``"samples"``
  (result i weighs its ``samples``);
* leaves pre-aggregate ``sum = sum_i w_i * u_i`` (float64), ``weight = sum_i w_i`` and ``count`` (results);
* once a round has ``count >= expected`` results at the root, the new model is
  ``float32(float64(model) + sum / weight)`` - the old model plus the (weighted) mean update.

Partial sums are float64 and travel as JSON numbers (``repr`` round-trips a float64 exactly), so the result
does not depend on how the results split across leaves and batches beyond float64 rounding of the sum order.

>>> p = Partial.empty(2)
>>> p = p.add(np.array([1.0, 2.0]), 1.0).add(np.array([3.0, 6.0]), 1.0)
>>> p.count, p.weight, p.sum.tolist()
(2, 2.0, [4.0, 8.0])
>>> apply_mean(np.zeros(2, np.float32), p).tolist()
[2.0, 4.0]
"""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np

from lightrail.errors import ScenarioError

__all__ = ["WEIGHTINGS", "Partial", "apply_mean", "as_vector", "result_weight"]

WEIGHTINGS = ("uniform", "samples")


def as_vector(values, *, dim: int | None, field: str) -> np.ndarray:
    """``values`` (a list of numbers) as a float64 vector of length ``dim`` (any length if None); every
    entry finite. A ScenarioError naming ``field`` otherwise.

    >>> as_vector([1, 2], dim=3, field="update")
    Traceback (most recent call last):
    ...
    lightrail.errors.ScenarioError: update: has length 2, the model has length 3; send one number per model parameter
    """
    try:
        v = np.asarray(values, dtype=np.float64)
    except (TypeError, ValueError):
        raise ScenarioError("is not a list of numbers", field=field) from None
    if v.ndim != 1:
        raise ScenarioError(f"must be a flat list of numbers, not an array of shape {v.shape}", field=field)
    if dim is not None and len(v) != dim:
        raise ScenarioError(f"has length {len(v)}, the model has length {dim}", field=field,
                            fix="send one number per model parameter")
    if dim is None and len(v) == 0:
        raise ScenarioError("is empty", field=field, fix="a model has at least one parameter")
    if not np.isfinite(v).all():
        raise ScenarioError(f"has a non-finite entry at index {int(np.flatnonzero(~np.isfinite(v))[0])}",
                            field=field)
    return v


def result_weight(weighting: str, samples: int | None) -> float:
    """A client result's weight under the job's ``weighting``."""
    if weighting == "samples":
        if samples is None or samples <= 0:
            raise ScenarioError(f"is {samples!r}; this job weighs results by their sample count", field="samples",
                                fix="send samples >= 1")
        return float(samples)
    return 1.0


@dataclass(frozen=True)
class Partial:
    """A running (weighted) sum of client updates: ``sum`` (float64), ``weight``, ``count`` (results)."""

    sum: np.ndarray
    weight: float
    count: int

    @classmethod
    def empty(cls, dim: int) -> Partial:
        return cls(np.zeros(dim, np.float64), 0.0, 0)

    def add(self, update: np.ndarray, weight: float = 1.0) -> Partial:
        return Partial(self.sum + weight * np.asarray(update, np.float64), self.weight + weight, self.count + 1)

    def merge(self, other: Partial) -> Partial:
        return Partial(self.sum + other.sum, self.weight + other.weight, self.count + other.count)


def apply_mean(model: np.ndarray, total: Partial) -> np.ndarray:
    """FedAvg's step: the model plus the weighted mean update, in float64, stored as float32."""
    if total.count == 0 or total.weight <= 0:
        return np.asarray(model, np.float32).copy()
    return (np.asarray(model, np.float64) + total.sum / total.weight).astype(np.float32)
