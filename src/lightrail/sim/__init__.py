"""Simulation: step timing of collectives on a network state (and, later, whole iterations)."""

from lightrail.sim.engine import CollectiveTiming, Engine, Routes, StepModel

__all__ = ["CollectiveTiming", "Engine", "Routes", "StepModel"]
