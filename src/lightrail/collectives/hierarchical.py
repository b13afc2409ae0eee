"""Hierarchical AllReduce: reduce-scatter inside servers, AllReduce across, all-gather inside.

Only 1/g of the buffer crosses the inter-server network per rank (g ranks per server), and
each rank's cross-server ring carries its own block, so all rails work at once.
"""

from __future__ import annotations

from math import gcd

import numpy as np

from lightrail.collectives.collective import Kind
from lightrail.collectives.registry import register
from lightrail.collectives.ring import ring_allgather_into, ring_reduce_scatter_into
from lightrail.collectives.schedule import Schedule, ScheduleBuilder
from lightrail.defaults import GPUS_PER_SERVER

__all__ = ["hierarchical_allreduce"]


@register(Kind.ALLREDUCE, "hierarchical",
          summary="ring reduce-scatter in each server, ring AllReduce per rail, ring all-gather",
          steps="2(g-1) + 2(n/g-1)")
def hierarchical_allreduce(n: int, *, gpus_per_server: int = GPUS_PER_SERVER) -> Schedule:
    """Two-level AllReduce with servers of ``g = gcd(n, gpus_per_server)`` consecutive ranks.

    Chunk ``l*m + j`` (m = n/g servers) is block l's j-th part: local rank l owns block l after the
    intra-server reduce-scatter, and the ring across servers on rail l reduces it part by part.
    """
    g = gcd(n, gpus_per_server)
    m = n // g
    b = ScheduleBuilder(Kind.ALLREDUCE, n, n)
    servers = np.arange(n).reshape(m, g)
    local_blocks = np.broadcast_to(np.arange(n).reshape(1, g, m), (m, g, m))
    rails = servers.T  # rails[l, j]: local rank l of server j
    rail_blocks = np.arange(n).reshape(g, m, 1)
    step = ring_reduce_scatter_into(b, 0, servers, local_blocks)
    step = ring_reduce_scatter_into(b, step, rails, rail_blocks)
    step = ring_allgather_into(b, step, rails, rail_blocks)
    ring_allgather_into(b, step, servers, local_blocks)
    return b.build(f"hierarchical_allreduce(n={n},g={g})", gpus_per_server=g)
