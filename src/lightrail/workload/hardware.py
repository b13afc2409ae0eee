"""Accelerators: the datasheet numbers that turn FLOPs into seconds and size the links of a server.

Every figure is a vendor number with its source beside it, never a fit to measurements; how far a
real job falls short of peak is the job's ``mfu``, kept separate so that it stays visible.
"""

from __future__ import annotations

import math
import numbers
import re
from collections.abc import Mapping
from dataclasses import dataclass
from types import MappingProxyType

from lightrail.errors import ScenarioError
from lightrail.units import parse_rate, parse_size

__all__ = ["GPU", "GPUS", "gpu", "compute_seconds"]

_ARCHS = ("volta", "ampere", "hopper", "blackwell")  # lightrail.nccl.ARCHS (not imported: workload sits above)


@dataclass(frozen=True, kw_only=True)
class GPU:
    """One accelerator and its links, in FLOP/s, bytes and bytes/s."""

    name: str
    peak_flops: float
    """Dense (no structured sparsity) BF16 tensor-core FLOP/s."""
    memory_bytes: float
    """HBM capacity as the vendor quotes it (decimal GB)."""
    nvlink_bandwidth: float
    """Scale-up bandwidth per GPU per direction (half the bidirectional figure vendors quote)."""
    nic_bandwidth: float
    """Scale-out bandwidth of the GPU's own NIC (its rail), per direction."""
    nvls: bool = False
    """The server's NVSwitch reduces and multicasts (NVLink SHARP): NCCL may run its NVLS algorithm on it."""
    arch: str = "hopper"
    """GPU class as NCCL's tuning tables index it: volta, ampere, hopper or blackwell (``lightrail.nccl``)."""

    def __post_init__(self):
        if self.arch not in _ARCHS:
            raise ScenarioError(f"unknown GPU class {self.arch!r}", field="gpu.arch",
                                fix=f"use one of {', '.join(_ARCHS)}")
        if not isinstance(self.nvls, bool):
            raise ScenarioError(f"{self.nvls!r} is not true or false", field="gpu.nvls", fix="use true or false")
        for key in ("peak_flops", "memory_bytes", "nvlink_bandwidth", "nic_bandwidth"):
            value = getattr(self, key)
            if isinstance(value, bool) or not isinstance(value, numbers.Real) or not math.isfinite(value) \
                    or value <= 0:
                raise ScenarioError(f"{value!r} is not a positive number", field=f"gpu.{key}",
                                    fix="give FLOP/s, bytes or bytes/s as a positive number")
            object.__setattr__(self, key, float(value))


def _presets() -> Mapping[str, GPU]:
    # nvls: NVLink SHARP (in-switch reductions and multicast; NCCL's NVLS algorithm) needs a third-generation
    # NVSwitch (NVLink 4) or later and a Hopper or later GPU. NCCL added NVLS for single-node Hopper/NVSwitch 3
    # systems in 2.17 (release notes, docs.nvidia.com/deeplearning/nccl/release-notes/rel_2-17-1.html) and its
    # inter-node forms (NVLS with IB SHARP, NVLSTree) in 2.18 (rel_2-18-1.html); NCCL's environment docs
    # (NCCL_NVLS_ENABLE) state the NVSwitch 3 / Hopper requirement. HGX H100/H200 carry NVSwitch 3, HGX B200
    # NVSwitch 4 (NVLink 5); DGX/HGX A100 carry NVSwitch 2, which has no SHARP.
    specs = {
        # H100 SXM5: NVIDIA H100 Tensor Core GPU Architecture whitepaper (2022), table of H100 SXM5 peak
        # rates: BF16 989.4 TFLOPS dense (1978.9 with sparsity); H100 datasheet: 80 GB HBM3, NVLink 900 GB/s
        # bidirectional (NVLink 4, 18 links); HGX/DGX H100 pair each GPU with a 400 Gb/s ConnectX-7 NIC.
        "h100": GPU(name="H100 SXM", peak_flops=989.4e12, memory_bytes=parse_size("80GB"),
                    nvlink_bandwidth=parse_rate("450GB/s"), nic_bandwidth=parse_rate("400Gbps"), nvls=True,
                    arch="hopper"),
        # H200 SXM: NVIDIA H200 datasheet: same Hopper compute as H100 SXM (BF16 1979 TFLOPS with sparsity),
        # 141 GB HBM3e, NVLink 900 GB/s bidirectional; HGX H200 keeps 400 Gb/s ConnectX-7 per GPU.
        "h200": GPU(name="H200 SXM", peak_flops=989.4e12, memory_bytes=parse_size("141GB"),
                    nvlink_bandwidth=parse_rate("450GB/s"), nic_bandwidth=parse_rate("400Gbps"), nvls=True,
                    arch="hopper"),
        # B200 (HGX, 1000 W): HGX B200 datasheet: FP16/BF16 36 PFLOPS with sparsity for 8 GPUs, i.e. 4.5 PFLOPS
        # sparse and 2.25 PFLOPS dense per GPU; DGX B200 datasheet: 1440 GB GPU memory for 8 GPUs, i.e. 180 GB
        # per GPU usable (the package carries 8 x 24 GB = 192 GB of HBM3e), NVLink 5 1.8 TB/s bidirectional
        # per GPU, 8 single-port 400 Gb/s ConnectX-7. GB200 NVL72 runs the die at 1200 W (2.5 PFLOPS dense
        # BF16), and DESIGN.md takes 800 Gb/s NICs for GB200 NVL-style systems: build a GPU(...) for that case.
        "b200": GPU(name="B200", peak_flops=2.25e15, memory_bytes=parse_size("180GB"),
                    nvlink_bandwidth=parse_rate("900GB/s"), nic_bandwidth=parse_rate("400Gbps"), nvls=True,
                    arch="blackwell"),
        # A100 SXM4 80GB: NVIDIA A100 datasheet: BF16 312 TFLOPS dense (624 with sparsity), 80 GB HBM2e,
        # NVLink 3 600 GB/s bidirectional; DGX A100 has one 200 Gb/s HDR InfiniBand ConnectX-6 per GPU.
        "a100": GPU(name="A100 SXM 80GB", peak_flops=312e12, memory_bytes=parse_size("80GB"),
                    nvlink_bandwidth=parse_rate("300GB/s"), nic_bandwidth=parse_rate("200Gbps"), nvls=False,
                    arch="ampere"),
    }
    return MappingProxyType(specs)


GPUS: Mapping[str, GPU] = _presets()
"""Preset accelerators by short key (``h100``, ``h200``, ``b200``, ``a100``), read-only."""


def _key(name: str) -> str:
    return re.sub(r"[^0-9a-z]", "", str(name).lower())


def gpu(name: str) -> GPU:
    """The preset named ``name``: its key or full name, ignoring case, spaces and dashes ("H100", "h100-sxm")."""
    wanted = _key(name)
    for key, spec in GPUS.items():
        if wanted in (key, _key(spec.name)):
            return spec
    raise ScenarioError(f"unknown GPU {name!r}", field="gpu",
                        fix=f"use one of: {', '.join(key.upper() for key in GPUS)}, or describe it with GPU(...)")


def compute_seconds(flops: float, gpu: GPU, mfu: float) -> float:
    """Roofline time of ``flops`` on ``gpu`` running at ``mfu`` (model FLOPs utilisation) of its peak."""
    if isinstance(mfu, bool) or not isinstance(mfu, numbers.Real) or not 0 < mfu <= 1:
        raise ScenarioError(f"{mfu!r} is not a fraction of peak", field="job.mfu",
                            fix="use 0 < mfu <= 1; 0.3 to 0.5 is typical of large training jobs")
    if isinstance(flops, bool) or not isinstance(flops, numbers.Real) or not 0 <= flops < math.inf:
        raise ScenarioError(f"{flops!r} is not a number of FLOPs", field="flops", fix="give a finite number >= 0")
    return flops / (gpu.peak_flops * mfu)
