"""The library's defaults and small vocabularies, defined here once, with the standard library only.

The library modules import them from here (``fabric.builders``, ``fabric.params``, ``control.plan``,
``control.pipswitch`` and ``collectives.collective`` re-export them under their old names), and the CLI
shows them in its help and defaults without importing numpy, scipy or the fabric: ``lightrail --version``
and ``lightrail algorithms`` start at once. Keep this module free of third-party imports (a test pins it).
"""

from __future__ import annotations

from enum import StrEnum

from lightrail.errors import ScenarioError

__all__ = ["NVLINK_BANDWIDTH", "NIC_BANDWIDTH", "GPUS_PER_SERVER", "HOSTS_PER_LEAF", "TOPOLOGIES",
           "RECONFIG_DELAY", "OCS_DELAYS", "HOP_LATENCY", "ALPHA", "MESHES", "MAX_PORTS", "Kind", "Mode"]

# ---- hardware (fabric.builders) ------------------------------------------------------------------------------

# H100/H200 HGX: NVLink 4 gives 900 GB/s per GPU bidirectional, i.e. 450 GB/s each way
# (NVIDIA H100 datasheet); one ConnectX-7 400 Gb/s NIC per GPU (DESIGN.md "Defaults").
NVLINK_BANDWIDTH = 450e9
NIC_BANDWIDTH = 400e9 / 8
GPUS_PER_SERVER = 8
"""GPUs of an HGX server (one NVLink domain), and so the rails of a rail-optimized cluster."""
HOSTS_PER_LEAF = 32
"""GPUs under one leaf switch of a fat-tree (half of a 64-port switch's ports face down)."""
TOPOLOGIES = ("switch", "ring", "torus2d", "torus3d", "fat-tree", "rails")
"""The static fabrics ``fabric.builders.build_topology`` builds by name."""

# ---- fabric timing (fabric.params) ---------------------------------------------------------------------------

RECONFIG_DELAY = 10e-3
"""A MEMS optical circuit switch's reconfiguration delay, seconds (e.g. Polatis: 10-25 ms; DESIGN.md)."""
OCS_DELAYS = (0.0, RECONFIG_DELAY, 50e-3, 100e-3, 250e-3, 500e-3, 750e-3, 1.0)
"""The OCS delays Opus sweeps (DESIGN.md "Defaults"), seconds: the delay sweep's default."""
HOP_LATENCY = 1e-6
"""Latency of one hop (a link and its switch or NIC), seconds: about a microsecond on InfiniBand-class links."""
ALPHA = 3e-6
"""Start-up cost of one collective step, seconds (~3 us on NVLink-class links; DESIGN.md)."""

# ---- PipSwitch (control.pipswitch) ---------------------------------------------------------------------------

MESHES = ("crossbar",)
"""Mesh kinds ``plan_pipswitch`` can route on."""
MAX_PORTS = 256
"""Largest switch ``plan_pipswitch`` takes: it holds every round's n x n cells (256 ports: ~15 s, ~0.6 GB)."""


# ---- vocabularies --------------------------------------------------------------------------------------------

class Kind(StrEnum):
    """A collective (``collectives.collective.Kind``)."""

    ALLREDUCE = "allreduce"
    REDUCESCATTER = "reducescatter"
    ALLGATHER = "allgather"
    ALLTOALL = "alltoall"
    BROADCAST = "broadcast"
    REDUCE = "reduce"


class Mode(StrEnum):
    """When a rail switches to the next phase's configuration (Opus, arXiv 2507.08119 section 5).

    One spelling everywhere (CLI, scenario files, JSON): ``on-demand`` and ``provisioned``. The old
    ``on_demand`` is still read (:meth:`parse`). Re-exported as ``control.plan.Mode``."""

    ON_DEMAND = "on-demand"
    """Switch when the phase's first op checks in."""
    PROVISIONED = "provisioned"
    """Switch as soon as the previous phase's last op has released, hiding the delay behind compute."""

    @classmethod
    def _missing_(cls, value):
        return cls.ON_DEMAND if value == "on_demand" else None

    @classmethod
    def parse(cls, value: str, *, field: str = "mode") -> Mode:
        """``on-demand`` (or the old ``on_demand``) or ``provisioned``; a ScenarioError naming ``field`` else.

        >>> Mode.parse("on_demand"), str(Mode.parse("provisioned"))
        (<Mode.ON_DEMAND: 'on-demand'>, 'provisioned')
        """
        try:
            return cls(value)
        except ValueError:
            raise ScenarioError(f"unknown mode {value!r}", field=field, fix="use on-demand or provisioned") from None
