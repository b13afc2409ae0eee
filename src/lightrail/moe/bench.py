"""``lightrail moe bench``: latency, throughput and bytes on the wire of each MoE dispatch variant.

All variants run in the same processes (``run_processes``: gloo on loopback, one process per rank), in
turn within each iteration (the order rotates), so load changes on a shared machine hit them alike.
Per iteration a variant's latency is the slowest rank's time from a barrier to the end of its forward
(and, separately, forward + backward); the figure is the median over iterations after one warm-up.

``correct``: each variant's forward on the same inputs is gathered to rank 0 and compared with the
single-process :class:`~lightrail.moe.layer.ReferenceMoE` (float32, rtol 1e-4, atol 1e-5; the padded
variant against the reference with the same capacity drops). Gradients are checked by the tests
(``tests/moe``), in float64, at small sizes.

``bytes_on_wire``: bytes the forward's dispatch and combine sent to other ranks (self-sends excluded),
summed over ranks; ``bytes_on_wire_fwd_bwd`` adds the backward's reverse all-to-alls (the same amount
again). Routing metadata (per-expert counts; the padded variant's max token count) is reported apart in
``metadata_bytes``.
"""

from __future__ import annotations

import statistics
import time
from dataclasses import asdict, dataclass

import torch
import torch.distributed as dist

from lightrail.errors import ScenarioError
from lightrail.moe import traffic
from lightrail.moe.layer import VARIANTS, MoELayer, ReferenceMoE, check_sizes

__all__ = ["BenchConfig", "run_bench", "check_config"]


@dataclass(frozen=True)
class BenchConfig:
    ranks: int = 8
    tokens: int = 8192
    """Tokens over all ranks (each rank holds tokens / ranks, the remainder spread over the first ranks)."""
    experts: int = 64
    topk: int = 2
    hidden: int = 1024
    ffn: int = 0
    """Expert intermediate width; 0 means ``hidden``."""
    tiles: int = 4
    capacity_factor: float = 1.25
    iters: int = 3
    warmup: int = 1
    backward: bool = True
    check: bool = True
    seed: int = 0

    @property
    def expert_ffn(self) -> int:
        return self.ffn or self.hidden

    def local_tokens(self) -> list[int]:
        return [len(c) for c in torch.arange(self.tokens).tensor_split(self.ranks)]


def check_config(cfg: BenchConfig) -> BenchConfig:
    """Every flag's check; errors name the flag's argument (``ranks``, ``topk``, ``tokens``...)."""
    if cfg.ranks < 2:
        raise ScenarioError(f"{cfg.ranks} ranks is too few", field="ranks", fix="use 2 or more ranks")
    if cfg.tokens < 1:
        raise ScenarioError(f"{cfg.tokens} tokens", field="tokens", fix="use 1 or more tokens")
    if cfg.ffn < 0:
        raise ScenarioError(f"{cfg.ffn} is negative", field="ffn", fix="use 0 (= hidden) or a positive width")
    for name in ("iters", "tiles"):
        if getattr(cfg, name) < 1:
            raise ScenarioError(f"{getattr(cfg, name)} is below 1", field=name, fix="use 1 or more")
    if cfg.warmup < 0:
        raise ScenarioError(f"{cfg.warmup} is negative", field="warmup", fix="use 0 or more")
    check_sizes(world=cfg.ranks, experts=cfg.experts, topk=cfg.topk, hidden=cfg.hidden, ffn=cfg.expert_ffn,
                tiles=cfg.tiles, capacity_factor=cfg.capacity_factor)
    return cfg


def _inputs(cfg: BenchConfig, rank: int, n_tokens: int) -> torch.Tensor:
    g = torch.Generator().manual_seed(cfg.seed * 7919 + rank)
    return torch.randn(n_tokens, cfg.hidden, generator=g)


def _timed(fn) -> float:
    dist.barrier()
    t0 = time.perf_counter()
    fn()
    return time.perf_counter() - t0


def _gather_rows(t: torch.Tensor, sizes: list[int], rank: int) -> torch.Tensor | None:
    """Rows of every rank on rank 0 (None elsewhere); ranks may hold different row counts."""
    padded = t.new_zeros(max(sizes), *t.shape[1:])
    padded[: t.shape[0]] = t
    parts = [torch.empty_like(padded) for _ in sizes] if rank == 0 else None
    dist.gather(padded, parts, dst=0)
    return torch.cat([p[:s] for p, s in zip(parts, sizes, strict=True)]) if rank == 0 else None


def _worker(rank: int, n: int, cfg: BenchConfig) -> dict:
    torch.set_num_threads(1)  # one process per rank shares the machine's cores
    sizes = cfg.local_tokens()
    x = _inputs(cfg, rank, sizes[rank])
    gy = torch.randn(x.shape, generator=torch.Generator().manual_seed(cfg.seed + 104729 * (rank + 1)))
    layers = {v: MoELayer(cfg.hidden, cfg.expert_ffn, cfg.experts, cfg.topk, variant=v, tiles=cfg.tiles,
                          capacity_factor=cfg.capacity_factor, seed=cfg.seed) for v in VARIANTS}
    fwd = {v: [] for v in VARIANTS}
    fwd_bwd = {v: [] for v in VARIANTS}
    outs, stats = {}, {}
    for it in range(cfg.warmup + cfg.iters):
        order = VARIANTS[it % 3:] + VARIANTS[: it % 3]
        for v in order:
            with torch.no_grad():
                t = _timed(lambda v=v: outs.__setitem__(v, layers[v](x)))
            stats[v] = layers[v].stats
            if it >= cfg.warmup:
                fwd[v].append(t)
            if cfg.backward:
                xg = x.clone().requires_grad_(True)
                t = _timed(lambda v=v, xg=xg: (layers[v](xg) * gy).sum().backward())
                layers[v].zero_grad(set_to_none=True)
                if it >= cfg.warmup:
                    fwd_bwd[v].append(t)
    result = {"fwd": fwd, "fwd_bwd": fwd_bwd, "stats": {v: s.to_dict() for v, s in stats.items()}, "correct": {}}
    if cfg.check:
        gathered_x = _gather_rows(x, sizes, rank)
        gathered = {v: _gather_rows(outs[v], sizes, rank) for v in VARIANTS}
        if rank == 0:
            torch.set_num_threads(max(1, torch.get_num_threads()))
            ref = ReferenceMoE(cfg.hidden, cfg.expert_ffn, cfg.experts, cfg.topk, seed=cfg.seed)
            with torch.no_grad():
                want = ref(gathered_x)
                cap = traffic.capacity(max(sizes), cfg.topk, cfg.experts, cfg.capacity_factor)
                want_padded = ref(gathered_x, chunks=sizes, capacity=cap)
            for v in VARIANTS:
                target = want_padded if v == "padded" else want
                result["correct"][v] = bool(torch.allclose(gathered[v], target, rtol=1e-4, atol=1e-5))
                result.setdefault("max_abs_error", {})[v] = float((gathered[v] - target).abs().max())
    return result


def run_bench(cfg: BenchConfig) -> dict:
    """Run the bench on ``cfg.ranks`` gloo processes; the contract's JSON object (see the module docstring)."""
    from lightrail.runtime.launch import run_processes

    check_config(cfg)
    per_rank = run_processes(_worker, cfg.ranks, cfg)
    sizes = cfg.local_tokens()
    dtype_bytes = 4
    variants = {}
    for v in VARIANTS:
        stats = [r["stats"][v] for r in per_rank]
        lat = statistics.median(max(r["fwd"][v][i] for r in per_rank) for i in range(cfg.iters))
        wire = sum(s["bytes_on_wire"] for s in stats)
        received = [s["rows_received"] for s in stats]
        entry = {
            "latency_s": lat,
            "tokens_per_s": cfg.tokens / lat,
            "bytes_on_wire": wire,
            "correct": per_rank[0]["correct"].get(v),
            "bytes_on_wire_fwd_bwd": 2 * wire if cfg.backward else None,
            "latency_fwd_bwd_s": statistics.median(max(r["fwd_bwd"][v][i] for r in per_rank)
                                                   for i in range(cfg.iters)) if cfg.backward else None,
            "metadata_bytes": sum(s["metadata_bytes"] for s in stats),
            "rows_received_per_rank": received,
            "imbalance": traffic.imbalance(received),
            "dropped_assignments": sum(s["dropped"] for s in stats),
            "capacity": stats[0]["capacity"] or None,
            "max_in_flight": max(s["max_in_flight"] for s in stats),
            "max_abs_error": per_rank[0].get("max_abs_error", {}).get(v),
        }
        entry["tokens_per_s_fwd_bwd"] = cfg.tokens / entry["latency_fwd_bwd_s"] if cfg.backward else None
        variants[v] = entry
    payload, padded = variants["payload"]["bytes_on_wire"], variants["padded"]["bytes_on_wire"]
    uniform = sum(2 * traffic.payload_bytes(t, cfg.topk, cfg.hidden, dtype_bytes, cfg.ranks) for t in sizes)
    return {
        "config": asdict(cfg) | {"ffn": cfg.expert_ffn, "dtype": "float32", "backend": "gloo", "device": "cpu"},
        "variants": variants,
        **variants,
        "bytes_saved_vs_padded": padded - payload,
        "bytes_saved_vs_padded_fraction": (padded - payload) / padded if padded else 0.0,
        "payload_bytes_uniform_model": uniform,
        "padded_bytes_model": sum(2 * traffic.padded_bytes(max(sizes), cfg.topk, cfg.hidden, dtype_bytes, cfg.ranks,
                                                             cfg.experts, cfg.capacity_factor) for _ in sizes),
        "notes": "latency_s: median over iters of the slowest rank's forward (after warm-up); bytes_on_wire: forward "
                 "dispatch + combine sent to other ranks, summed over ranks (backward not included; "
                 "bytes_on_wire_fwd_bwd includes it); correct: forward output vs the single-process reference.",
    }
