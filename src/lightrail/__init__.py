"""lightrail: reconfigurable photonic networks for ML clusters."""

__version__ = "0.1.0"
