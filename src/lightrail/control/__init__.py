"""Control planners: which circuits each phase needs, and when to reconfigure (Opus, later PCCL).

The names below are loaded on first use (PEP 562), so importing one planner (``control.pccl`` for
``lightrail collective``) does not import the others and the workload model behind Opus."""

__all__ = ["OpusParams", "OpusPlanner", "Requirement"]


def __getattr__(name: str):
    if name in __all__:
        from lightrail.control import opus

        return getattr(opus, name)
    raise AttributeError(f"module {__name__!r} has no attribute {name!r}")
