"""Simulation: the iteration simulator (a Program executed under a Plan, event by event) and its trace;
the step-time engine it uses lives in :mod:`lightrail.timing`."""

from lightrail.fabric.params import RailFabric
from lightrail.sim.iteration import IterationResult, simulate_iteration
from lightrail.timing import CollectiveTiming, Engine, Routes, StepModel

__all__ = ["CollectiveTiming", "Engine", "Routes", "StepModel", "IterationResult", "RailFabric", "simulate_iteration"]
