"""Fabrics: the network as arrays, its builders, and OCS circuit configurations."""

from lightrail.fabric.builders import (
    NIC_BANDWIDTH,
    NVLINK_BANDWIDTH,
    TOPOLOGIES,
    build_topology,
    circuits,
    fat_tree,
    rails,
    ring,
    square_shape,
    switch,
    torus,
)
from lightrail.fabric.circuits import (
    check_partial_permutation,
    is_duplex,
    is_partial_permutation,
    ring_permutation,
)
from lightrail.fabric.topology import NodeKind, Topology

__all__ = [
    "NIC_BANDWIDTH", "NVLINK_BANDWIDTH", "TOPOLOGIES", "build_topology", "circuits", "fat_tree", "rails", "ring",
    "square_shape", "switch", "torus", "check_partial_permutation", "is_duplex", "is_partial_permutation",
    "ring_permutation", "NodeKind", "Topology",
]
