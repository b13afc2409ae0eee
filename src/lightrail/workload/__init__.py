"""The job side of a simulation: model shapes, accelerators, and (later) parallel layout and programs."""

from lightrail.workload.hardware import GPU, GPUS, compute_seconds, gpu
from lightrail.workload.importers import model_from_hf_config
from lightrail.workload.model import PRESETS, ModelSpec, preset

__all__ = ["ModelSpec", "PRESETS", "preset", "GPU", "GPUS", "gpu", "compute_seconds", "model_from_hf_config"]
