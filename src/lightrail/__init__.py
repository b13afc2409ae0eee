"""lightrail: reconfigurable photonic networks for ML clusters.

The main jobs are calls (:mod:`lightrail.api`): ``lightrail.simulate()``, ``sweep()``, ``collective()`` and
``calibrate()``; importing the package loads none of them until one is used (the CLI starts in milliseconds).
"""

__version__ = "0.1.0"

__all__ = ["simulate", "sweep", "collective", "calibrate", "__version__"]


def __getattr__(name: str):
    if name in ("simulate", "sweep", "collective", "calibrate"):
        from lightrail import api

        return getattr(api, name)
    raise AttributeError(f"module 'lightrail' has no attribute {name!r}")
