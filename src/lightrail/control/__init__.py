"""Control planners: which circuits each phase needs, and when to reconfigure (Opus, later PCCL)."""

from lightrail.control.opus import OpusParams, OpusPlanner, Requirement

__all__ = ["OpusParams", "OpusPlanner", "Requirement"]
