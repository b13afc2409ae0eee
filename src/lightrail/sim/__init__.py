"""Simulation: step timing of collectives on a network state, whole training iterations on electrical
or photonic rails, and the power and cost of the rails."""

from lightrail.sim.collective import CollectiveResult, evaluate, sweep
from lightrail.sim.cost import CostComparison, CostFacts, FabricCost, compare, rail_fabric_cost
from lightrail.sim.iteration import IterationResult, RailFabric, simulate_iteration
from lightrail.timing import CollectiveTiming, Engine, Routes, StepModel

__all__ = ["CollectiveResult", "evaluate", "sweep", "CostComparison", "CostFacts", "FabricCost", "compare",
           "rail_fabric_cost", "CollectiveTiming", "Engine", "Routes", "StepModel", "IterationResult", "RailFabric",
           "simulate_iteration"]
