"""Simulation: step timing of collectives on a network state (and, later, whole iterations)."""

from lightrail.sim.collective import CollectiveResult, evaluate, sweep
from lightrail.sim.engine import CollectiveTiming, Engine, Routes, StepModel

__all__ = ["CollectiveResult", "evaluate", "sweep", "CollectiveTiming", "Engine", "Routes", "StepModel"]
