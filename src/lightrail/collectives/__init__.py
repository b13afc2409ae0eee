"""Collective schedules: what a collective must do, how an algorithm does it, and the proof."""

from lightrail.collectives.collective import FULL, Collective, Kind, bus_factor
from lightrail.collectives.registry import Algorithm, algorithms, generate, get, parse_kind, register, resolve
from lightrail.collectives.schedule import Combine, Schedule, ScheduleBuilder, Step
from lightrail.collectives.verify import Verification, is_correct, verify

__all__ = [
    "FULL", "Collective", "Kind", "bus_factor",
    "Algorithm", "algorithms", "generate", "get", "parse_kind", "register", "resolve",
    "Combine", "Schedule", "ScheduleBuilder", "Step",
    "Verification", "is_correct", "verify",
]
