"""``lightrail export astra-sim``: the same job as ASTRA-sim inputs (analytical network backend).

Formats as ASTRA-sim 2.0 reads them (its ``examples/network/analytical/*.yml`` and
``examples/system/native_collectives/*.json``):

- ``network.yml``: one dimension per level, innermost first (``topology``, ``npus_count``, ``bandwidth`` in
  GB/s, ``latency`` in ns per link). A rail-optimized cluster is two switched dimensions: the NVLink switch of
  each server, then the rails (GPU i of every server on rail i), which is how lightrail numbers GPUs;
- ``system.json``: collective implementations per dimension and the scheduling knobs. lightrail charges a
  start-up ``alpha`` per step and no local-memory traffic, so ``endpoint-delay`` carries alpha (ns) and the
  local memory bandwidth is set far above the links;
- ``workload.RANK.et`` (Chakra, written with mlc-chakra's framing) and ``workload.json`` (communicator
  groups, ASTRA-sim's ``--comm-group-configuration``); ``remote_memory.json``; a README with the command.
"""

from __future__ import annotations

from collections.abc import Callable
from pathlib import Path

import yaml

from lightrail.report.files import write_atomic, write_json, write_text
from lightrail.workload.chakra import ChakraTrace, allgather_sizes, encode_rank

__all__ = ["astra_network", "astra_system", "write_astra_sim", "ASTRA_ALGORITHMS"]

ASTRA_ALGORITHMS = {"ring": "ring", "direct": "direct", "pairwise": "direct", "halving-doubling": "halvingDoubling",
                    "double-binary-tree": "doubleBinaryTree"}
"""lightrail's algorithm names and ASTRA-sim's native implementation of the same idea; others run as ring."""

ASTRA_GB = 2**30
"""Bytes in ASTRA-sim's "GB" of bandwidth: its analytical backend turns GB/s into bytes per ns as
``bw * 2**30 / 1e9`` (measured side by side: benchmarks/vs_astra_sim.py agrees to 1e-6 with this unit only)."""

LOCAL_MEM_BW_GBPS = 1e6
"""lightrail does not charge the local reduction's memory traffic; a bandwidth this high makes ASTRA-sim's
charge for it negligible, so the two model the same costs (set the GPU's HBM rate to add it)."""


def astra_network(world: int, gpus_per_server: int, nvlink_Bps: float, nic_Bps: float, latency_s: float) -> dict:
    """Analytical network dimensions: NVLink switch per server, then the rail switches."""
    g = min(gpus_per_server, world)
    servers = max(1, world // g)
    dims = [("Switch", g, nvlink_Bps)] + ([("Switch", servers, nic_Bps)] if servers > 1 else [])
    return {"topology": [d[0] for d in dims], "npus_count": [d[1] for d in dims],
            "bandwidth": [round(d[2] / ASTRA_GB, 6) for d in dims], "latency": [round(latency_s * 1e9, 3)] * len(dims)}


def astra_system(dims: int, algorithms: dict[str, str], alpha_s: float) -> dict:
    """System layer config: per collective, one implementation per network dimension."""
    impl = {kind: [ASTRA_ALGORITHMS.get(name, "ring")] * dims for kind, name in algorithms.items()}
    return {"scheduling-policy": "LIFO", "endpoint-delay": round(alpha_s * 1e9),
            "active-chunks-per-dimension": 1, "preferred-dataset-splits": 1,
            "all-reduce-implementation": impl.get("allreduce", ["ring"] * dims),
            "all-gather-implementation": impl.get("allgather", ["ring"] * dims),
            "reduce-scatter-implementation": impl.get("reducescatter", ["ring"] * dims),
            "all-to-all-implementation": impl.get("alltoall", ["direct"] * dims),
            "collective-optimization": "localBWAware", "local-mem-bw": LOCAL_MEM_BW_GBPS, "boost-mode": 0,
            "roofline-enabled": 0}


_README = """# {name}: lightrail's job as ASTRA-sim inputs

Exported by `lightrail export astra-sim`: {ranks} ranks ({ops}).

Run with ASTRA-sim's analytical backend (built from https://github.com/astra-sim/astra-sim):

    AstraSim_Analytical_Congestion_Aware \\
      --workload-configuration={out}/workload \\
      --comm-group-configuration={out}/workload.json \\
      --system-configuration={out}/system.json \\
      --remote-memory-configuration={out}/remote_memory.json \\
      --network-configuration={out}/network.yml

and the same job in lightrail with `lightrail simulate` on the scenario this came from (or on a scenario with
`workload: {{chakra: {out}}}`, which replays these very traces). Bandwidths are in ASTRA-sim's GB/s, of 2^30
bytes (its analytical backend's unit); all-gather sizes are each rank's contribution (Chakra's convention);
compute durations are whole microseconds, as Chakra stores them.
"""


def write_astra_sim(trace: ChakraTrace, out_dir: Path, *, name: str, network: dict, system: dict,
                    progress: Callable[[str], None] | None = None) -> list[Path]:
    """Write the traces and configs into ``out_dir`` (each file atomically); returns the config paths."""
    out_dir = Path(out_dir)
    for rank, nodes in enumerate(allgather_sizes(trace, whole=False).ranks):
        data = encode_rank(nodes, rank)
        write_atomic(out_dir / f"workload.{rank}.et", lambda tmp, data=data: tmp.write_bytes(data))
        if progress:
            progress(f"rank {rank}")
    ops = ", ".join(f"{v} {k}" for k, v in trace.ops().items() if ":" not in k)
    return [write_json(out_dir / "workload.json", {k: list(v) for k, v in trace.groups.items()}),
            write_text(out_dir / "network.yml",
                       "# lightrail export astra-sim: bandwidth in GB/s of 2^30 bytes, latency in ns\n"
                       + yaml.safe_dump(network, default_flow_style=None, sort_keys=False)),
            write_json(out_dir / "system.json", system),
            write_json(out_dir / "remote_memory.json", {"memory-type": "NO_MEMORY_EXPANSION"}),
            write_text(out_dir / "README.md", _README.format(name=name, ranks=trace.world, ops=ops,
                                                             out=out_dir.as_posix()))]
