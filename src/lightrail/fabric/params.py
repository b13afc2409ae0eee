"""Parameters of the fabrics lightrail simulates, and the hardware and control-plane facts behind
their defaults (each defined here once, with its source).

- :class:`RailFabric`: the scale-out rails of a GPU cluster, electrical packet switches, optical
  circuit switches (one per rail) or ideal OCS, with the controller's round trip and command latency.
- :class:`ReconfigurableFabric`: n GPUs with a few optical ports each into a circuit switch, over an
  optional static base (the reconfiguration-aware collectives' fabric).
"""

from __future__ import annotations

from dataclasses import dataclass
from enum import StrEnum
from typing import Literal

import numpy as np

from lightrail.defaults import ALPHA, HOP_LATENCY, OCS_DELAYS, RECONFIG_DELAY
from lightrail.errors import ScenarioError
from lightrail.fabric.builders import NIC_BANDWIDTH, NVLINK_BANDWIDTH, ring, square_shape, torus
from lightrail.fabric.topology import NodeKind, Topology

__all__ = ["RailFabric", "ReconfigurableFabric", "RECONFIG_DELAY", "OCS_DELAYS", "CHECK_IN_RTT", "COMMAND_LATENCY",
           "REVOKE_RTT",
           "HOP_LATENCY", "ALPHA", "FabricKind", "Base"]

# RECONFIG_DELAY, OCS_DELAYS, HOP_LATENCY and ALPHA are defined (with their sources) in lightrail.defaults,
# which the CLI reads without importing this module; re-exported here.


class FabricKind(StrEnum):
    """What the scale-out rails are made of (the strings are the JSON outputs' ``fabric``)."""

    ELECTRICAL = "electrical"
    """Electrical packet switches: no circuits, no controller."""
    PHOTONIC = "photonic"
    """Optical circuit switches with their reconfiguration delay and a controller."""
    IDEAL = "ideal"
    """Circuit switches that reconfigure instantly under an instant controller (the lower bound)."""


CHECK_IN_RTT = 0.42e-3
"""A rank's round trip to the controller: request to grant with the circuits present, p50 over 1,600
acquires at 8 ranks on loopback, measured with `.venv/bin/python benchmarks/bench_controller.py --rounds 200`
(`same_pairs_8`: 0.42 ms p50, 1.26 ms p99; 2 cores)."""
COMMAND_LATENCY = 0.93e-3
"""The controller's own cost of a reconfiguration (change set, busy-port checks, SQLite commit, apply task):
the same benchmark's p50 when every round reconfigures with zero OCS delay (`flip_8`: 1.35 ms) minus the
round trip above (0.42 ms)."""

REVOKE_RTT = 0.71e-3
"""From the controller's revoke to the end of the lease (every holder's ack in): p50 over 1,596 revocations of
the train-demo's job (8 ranks, 2 rails, leases alternating between a PP and a DP pair on each port), measured
with `.venv/bin/python benchmarks/bench_controller.py --grant-latency` (`revoke_rtt_s`: 0.71 ms p50, 1.14 ms
p90; 2 cores)."""


@dataclass(frozen=True, kw_only=True)
class RailFabric:
    """The scale-out rails: electrical packet switches, optical circuit switches, or ideal OCS.

    Errors name the scenario file's field:

    >>> RailFabric(ocs_delay=-1.0)
    Traceback (most recent call last):
    ...
    lightrail.errors.ScenarioError: ocs.reconfig_delay: ocs_delay=-1.0; use 0 or more seconds
    """

    kind: FabricKind = FabricKind.PHOTONIC
    """A FabricKind, or its string."""
    ocs_delay: float = RECONFIG_DELAY
    """OCS reconfiguration delay in seconds (MEMS: 10-25 ms, DESIGN.md); ignored by other kinds."""
    nic_bandwidth: float = NIC_BANDWIDTH
    nvlink_bandwidth: float = NVLINK_BANDWIDTH
    latency: float = HOP_LATENCY
    """Per hop (link) latency in seconds."""
    alpha: float = ALPHA
    """Start-up cost per collective step in seconds."""
    check_in_rtt: float = CHECK_IN_RTT
    """Round trip between a rank and the controller, in seconds (photonic only)."""
    revoke_rtt: float = REVOKE_RTT
    """From the controller's revoke of a lease to the lease's end (its holders' acks), in seconds (photonic only)."""
    command_latency: float = COMMAND_LATENCY
    """From the controller's decision to the start of the switch, in seconds (photonic only)."""
    switch_grant_latency: float = 0.0
    """From the end of a switch to the controller's grant of the group that waited for it (its timer's wake-up and
    the grant), in seconds (photonic only; a rank asking after the switch ended is granted at once). The default
    0: :data:`COMMAND_LATENCY` was measured as a switch's whole overhead, this part included. ``train-demo``
    reads it from its controller (``lightrail_switch_lag_seconds{kind="after"}``)."""
    routing: Literal["pxn", "ecmp"] = "pxn"
    """Electrical rails: NCCL's PXN (one rail per flow, as on photonic rails) or ECMP over two rails."""
    drain: bool = True
    """False only for the overhead breakdown's counterfactual: circuits switch even under traffic."""
    sharing: Literal["fair", "none"] = "fair"
    """Ops in flight at once share the links they both cross at max-min fair rates (``fair``, as flow-level
    simulators do: :mod:`lightrail.sharing`), or each runs as if alone (``none``)."""
    host_cores: int | None = None
    """An emulation on one host (``train-demo``): every rank is a process computing on these CPU cores, so the
    compute ops of stages computing at the same time share them (processor sharing: ``n`` busy ranks on ``c``
    cores each compute at ``min(1, c / n)`` of a core, :mod:`lightrail.sharing`'s max-min rates on one CPU
    link), and a stage computes faster while another waits. None: every rank has its own accelerator (a real
    cluster), compute ops take their time whatever the others do."""
    collectives: Literal["nccl", "schedules"] = "nccl"
    """How a collective whose algorithm is ``auto`` is timed on rails: as NCCL runs it (``nccl``: the algorithm and
    protocol NCCL's tuner picks per size, with its latencies and protocol efficiencies, :mod:`lightrail.nccl_cost`)
    or as the step engine times the registry's schedule (``schedules``: textbook alpha-beta per step)."""

    def __post_init__(self):
        try:
            object.__setattr__(self, "kind", FabricKind(self.kind))
        except ValueError:
            raise ScenarioError(f"unknown fabric {self.kind!r}", field="fabric.kind",
                                fix="use electrical, photonic or ideal") from None
        # named as the scenario file names them (its ocs section; ocs_delay is the file's reconfig_delay)
        for name in ("ocs_delay", "check_in_rtt", "command_latency", "revoke_rtt", "switch_grant_latency"):
            if getattr(self, name) < 0:
                key = "reconfig_delay" if name == "ocs_delay" else name
                raise ScenarioError(f"{name}={getattr(self, name)}", field=f"ocs.{key}",
                                    fix="use 0 or more seconds")
        if self.host_cores is not None and (isinstance(self.host_cores, bool) or not isinstance(self.host_cores, int)
                                            or self.host_cores < 1):
            raise ScenarioError(f"host_cores={self.host_cores!r}", field="host_cores",
                                fix="use a positive number of CPU cores, or None for one accelerator per rank")
        if self.routing not in ("pxn", "ecmp"):
            raise ScenarioError(f"unknown routing {self.routing!r}", field="cluster.routing", fix="use pxn or ecmp")
        if self.sharing not in ("fair", "none"):
            raise ScenarioError(f"unknown sharing {self.sharing!r}", field="engine.sharing", fix="use fair or none")
        if self.collectives not in ("nccl", "schedules"):
            raise ScenarioError(f"unknown collectives {self.collectives!r}", field="engine.collectives",
                                fix="use nccl or schedules")

    @property
    def delay(self) -> float:
        return self.ocs_delay if self.kind is FabricKind.PHOTONIC else 0.0

    @property
    def rtt(self) -> float:
        """Check-in round trip: photonic rails only (electrical rails need no controller; the ideal rail
        is an ideal OCS with an ideal controller)."""
        return self.check_in_rtt if self.kind is FabricKind.PHOTONIC else 0.0

    @property
    def revoke(self) -> float:
        return self.revoke_rtt if self.kind is FabricKind.PHOTONIC else 0.0

    @property
    def command(self) -> float:
        return self.command_latency if self.kind is FabricKind.PHOTONIC else 0.0

    @property
    def switch_grant(self) -> float:
        return self.switch_grant_latency if self.kind is FabricKind.PHOTONIC else 0.0

    @property
    def circuits(self) -> bool:
        return self.kind is not FabricKind.ELECTRICAL


Base = Literal["none", "ring", "torus"]


@dataclass(frozen=True, kw_only=True)
class ReconfigurableFabric:
    """n GPUs with ``ports`` optical ports each into a circuit switch, over an optional static base."""

    n: int
    ports: int = 2
    base: Base = "none"
    bandwidth: float = NIC_BANDWIDTH
    """Per optical port and per base link, bytes/s."""
    latency: float = HOP_LATENCY
    """Per hop (switching, serialisation), seconds."""
    propagation: float = 0.0
    """Fibre delay added to every circuit hop (5 ns/m, DESIGN.md), seconds."""
    ocs_delay: float = 10e-6
    """Circuit reconfiguration delay, seconds (default: a microsecond-class photonic switch, not MEMS)."""
    alpha: float = ALPHA
    initial: Literal["ring", "none"] = "ring"
    """Circuits installed before the collective: a bidirectional ring (uses up to two ports) or none."""

    def __post_init__(self):
        if self.n < 2:
            raise ScenarioError(f"{self.n} GPUs", field="ranks", fix="use 2 or more")
        if self.ports < 1:
            raise ScenarioError(f"{self.ports} ports", field="ports", fix="use 1 or more optical ports per GPU")
        if self.base not in ("none", "ring", "torus"):
            raise ScenarioError(f"unknown base {self.base!r}", field="base", fix="use none, ring or torus")
        if self.ocs_delay < 0 or self.propagation < 0:
            raise ScenarioError("delays must be non-negative", field="ocs_delay")
        if self.base == "none" and self.initial == "none":
            raise ScenarioError("no base topology and no initial circuits leave GPUs unconnected", field="initial",
                                fix="use initial='ring' or a base topology")

    def initial_codes(self) -> np.ndarray:
        """Initial circuits as codes ``src * n + dst``."""
        n = self.n
        if self.initial == "none":
            return np.zeros(0, np.int64)
        r = np.arange(n)
        codes = [r * n + (r + 1) % n]
        if self.ports >= 2 and n > 2:
            codes.append(r * n + (r - 1) % n)
        return np.unique(np.concatenate(codes))

    def base_topology(self) -> Topology:
        if self.base == "ring":
            return ring(self.n, bandwidth=self.bandwidth, latency=self.latency)
        if self.base == "torus":
            return torus(square_shape(self.n, 2), bandwidth=self.bandwidth, latency=self.latency)
        empty = np.zeros(0, np.int32)
        return Topology(f"ports(n={self.n})", self.n, np.full(self.n, NodeKind.GPU), empty, empty, np.zeros(0),
                        np.zeros(0), None)

    def topology(self, codes: np.ndarray) -> Topology:
        """The state graph: base links plus one circuit link per code."""
        base = self.base_topology()
        if not len(codes):
            return base
        return base.with_links(codes // self.n, codes % self.n, self.bandwidth, self.latency + self.propagation,
                               name=f"{base.name}+{len(codes)} circuits")

    def fits(self, codes: np.ndarray) -> bool:
        """True if no GPU needs more than ``ports`` circuits out or in."""
        if not len(codes):
            return True
        return (np.bincount(codes // self.n, minlength=self.n).max() <= self.ports
                and np.bincount(codes % self.n, minlength=self.n).max() <= self.ports)
