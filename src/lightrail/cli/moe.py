"""``lightrail moe bench``: the MoE layer's dispatch variants on torch.distributed (gloo on CPU).

Sizes are checked before any process starts; the errors name the flag (``--ranks`` not dividing
``--experts``, ``--topk`` above ``--experts``, ``--tokens`` below 1...) and exit 2."""

from __future__ import annotations

from pathlib import Path
from typing import Annotated

import typer

from lightrail.cli.app import LeanTyper, app, err, friendly, out
from lightrail.cli.options import (
    FigureFormat,
    JsonOut,
    check_count,
    check_fits,
    check_out,
    figure_suffix,
    old_spelling,
    renamed,
)
from lightrail.cli.output import print_json, writes_files
from lightrail.errors import ScenarioError

moe_app = LeanTyper(no_args_is_help=True, help="Mixture-of-experts: expert-parallel dispatch and combine.")
app.add_typer(moe_app, name="moe")


MAX_BENCH_RANKS = 64
"""Most gloo processes (FlashDMoE's largest runs are 8 GPUs)."""


def _check_bench_size(*, ranks: int, tokens: int, experts: int, topk: int, hidden: int, ffn: int, tiles: int,
                      capacity_factor: float, iters: int, warmup: int) -> None:
    """Upper bounds before any process starts (the library checks the lower ones and the divisibility)."""
    check_count(ranks, field="--ranks", lo=2, hi=MAX_BENCH_RANKS, what="gloo processes")
    check_count(iters, field="--repeats", hi=1000, what="timed repeats")
    check_count(warmup, field="--warmup", lo=0, hi=1000, what="warm-up iterations")
    check_count(tiles, field="--tiles", hi=max(1, tokens), what="tiles")
    if not 0 < capacity_factor <= 64:
        raise ScenarioError(f"{capacity_factor}", field="--capacity-factor", fix="use a factor in (0, 64], e.g. 1.25")
    # float32 expert weights (gate, up, down) with their gradients, in the ranks and the single-process reference,
    # and the routed tokens' activations (padded: capacity_factor x the uniform share per expert)
    width = max(hidden, ffn or hidden)
    weights = 4 * 3 * experts * hidden * (ffn or hidden) * 3
    tokens_bytes = 4 * tokens * max(1, topk) * width * 8 * max(1.0, capacity_factor)
    check_fits(weights + tokens_bytes, field="--hidden" if weights > tokens_bytes else "--tokens",
               value=f"{experts} experts of {hidden}x{ffn or hidden} and {tokens} tokens",
               fix="use fewer --experts, a smaller --hidden/--ffn or fewer --tokens")


@moe_app.command("bench")
@friendly
def moe_bench_cmd(
    ranks: Annotated[int, typer.Option("--ranks", "-n", help="Expert-parallel ranks (processes), dividing "
                                       "--experts.")] = 8,
    tokens: Annotated[int, typer.Option("--tokens", help="Tokens over all ranks (tokens / ranks each).")] = 8192,
    experts: Annotated[int, typer.Option("--experts", help="Routed experts.")] = 64,
    topk: Annotated[int, typer.Option("--topk", help="Experts per token.")] = 2,
    hidden: Annotated[int, typer.Option("--hidden", help="Model width.")] = 1024,
    ffn: Annotated[int, typer.Option("--ffn", help="Expert intermediate width (0: --hidden).")] = 0,
    tiles: Annotated[int, typer.Option("--tiles", help="Token tiles of the pipelined payload variant.")] = 4,
    capacity_factor: Annotated[float, typer.Option("--capacity-factor", help="Padded variant: slots per expert "
                                                   "over the uniform share.")] = 1.25,
    repeats: Annotated[int, typer.Option("--repeats", help="Timed trials (median), after --warmup.")] = 3,
    old_iters: Annotated[int | None, old_spelling("--iters", "--repeats")] = None,
    warmup: Annotated[int, typer.Option("--warmup", help="Untimed iterations first.")] = 1,
    backward: Annotated[bool, typer.Option("--backward/--no-backward", help="Also time forward + backward.")] = True,
    out_dir: Annotated[Path, typer.Option("--out", help="Folder for summary.json and moe-bench.png (or .svg/.pdf, "
                                          "see --format).")] = Path("out/moe-bench"),
    fmt: FigureFormat = "png",
    as_json: JsonOut = False,
):
    """Latency, tokens/s and bytes on the wire of payload-efficient pipelined dispatch, padded (GShard)
    dispatch and un-pipelined payload dispatch, each checked against a single-process reference."""
    from lightrail.moe.bench import BenchConfig, check_config, run_bench
    from lightrail.report.moe import print_moe_bench, write_moe_bench

    iters = renamed(repeats, old_iters, old="--iters", new="--repeats")  # as stragglar run's timed trials
    check_count(iters, field="--repeats", hi=1000, what="timed repeats")
    fmt = figure_suffix(fmt)
    cfg = check_config(BenchConfig(ranks=ranks, tokens=tokens, experts=experts, topk=topk, hidden=hidden, ffn=ffn,
                                   tiles=tiles, capacity_factor=capacity_factor, iters=iters, warmup=warmup,
                                   backward=backward))
    _check_bench_size(ranks=ranks, tokens=tokens, experts=experts, topk=topk, hidden=hidden, ffn=ffn, tiles=tiles,
                      capacity_factor=capacity_factor, iters=iters, warmup=warmup)
    check_out(out_dir if writes_files(as_json) else None)
    if not as_json:
        err.print(f"running {ranks} gloo processes ...", highlight=False)
    result = run_bench(cfg)
    files = write_moe_bench(result, out_dir, fmt=fmt) if writes_files(as_json) else []
    if as_json:
        print_json({k: v for k, v in result.items() if k != "variants"})
    else:
        print_moe_bench(result, out, files)
