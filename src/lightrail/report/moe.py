"""What ``lightrail moe bench`` shows and writes: a table per variant, summary.json, and a bar plot."""

from __future__ import annotations

from pathlib import Path

from rich.console import Console
from rich.table import Table

from lightrail.report.files import write_json
from lightrail.units import format_size

__all__ = ["print_moe_bench", "write_moe_bench", "plot_moe_bench"]

VARIANT_LABELS = {"payload": "payload", "padded": "padded", "unpipelined": "unpipelined"}


def print_moe_bench(result: dict, console: Console, files: list[Path] = ()) -> None:
    c = result["config"]
    table = Table(title=f"MoE dispatch on {c['backend']}/{c['device']}: {c['ranks']} ranks, {c['tokens']} tokens, "
                        f"{c['experts']} experts, top-{c['topk']}, hidden {c['hidden']}, ffn {c['ffn']}, "
                        f"{c['tiles']} tiles")
    for name in ("variant", "fwd", "tokens/s", "wire (fwd)", "fwd+bwd", "imbal.", "dropped", "correct"):
        table.add_column(name, justify="left" if name == "variant" else "right")
    for v, r in result["variants"].items():
        bwd = f"{r['latency_fwd_bwd_s'] * 1e3:.1f} ms" if r.get("latency_fwd_bwd_s") is not None else "-"
        correct = {True: "yes", False: "NO", None: "-"}[r["correct"]]
        table.add_row(VARIANT_LABELS.get(v, v), f"{r['latency_s'] * 1e3:.1f} ms", f"{r['tokens_per_s']:,.0f}",
                      format_size(r["bytes_on_wire"]), bwd, f"{r['imbalance']:.2f}", str(r["dropped_assignments"]),
                      correct)
    console.print(table)
    console.print("payload: routed tokens only, pipelined in tiles; padded: GShard capacity slots; unpipelined: "
                  "payload in one tile, synchronous. fwd/fwd+bwd: median latency of the slowest rank; wire: bytes "
                  "sent to other ranks by the forward's dispatch and combine, summed over ranks.", highlight=False)
    console.print(f"bytes saved against padded dispatch: {format_size(result['bytes_saved_vs_padded'])} "
                  f"({result['bytes_saved_vs_padded_fraction']:.1%}); capacity factor {c['capacity_factor']}, "
                  f"capacity {result['variants']['padded']['capacity']} slots per expert per rank", highlight=False)
    for path in files:
        console.print(f"wrote {path}", highlight=False)


def plot_moe_bench(result: dict, path: Path) -> Path:
    """Bars of forward latency and bytes on the wire per variant."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    names = list(result["variants"])
    rows = [result["variants"][v] for v in names]
    fig, (ax_t, ax_b) = plt.subplots(1, 2, figsize=(10, 3.8))
    colors = ["#4C72B0", "#C44E52", "#55A868"][: len(names)]
    ax_t.bar(names, [r["latency_s"] * 1e3 for r in rows], color=colors, label="forward")
    if all(r.get("latency_fwd_bwd_s") is not None for r in rows):
        ax_t.scatter(names, [r["latency_fwd_bwd_s"] * 1e3 for r in rows], color="black", marker="_", s=400,
                     label="forward + backward", zorder=3)
        ax_t.legend(fontsize=8)
    ax_t.set_ylabel("latency (ms, median)")
    ax_b.bar(names, [r["bytes_on_wire"] / 2**20 for r in rows], color=colors)
    ax_b.set_ylabel("bytes on the wire, forward (MiB)")
    for ax in (ax_t, ax_b):
        ax.set_xlabel("dispatch variant")
        ax.grid(True, axis="y", alpha=0.3)
    c = result["config"]
    fig.suptitle(f"MoE dispatch: {c['ranks']} ranks, {c['tokens']} tokens, {c['experts']} experts, "
                 f"top-{c['topk']}, hidden {c['hidden']} ({c['backend']}/{c['device']})", fontsize=10)
    fig.tight_layout()
    from lightrail.report.plots import _write

    return _write(fig, path)


def write_moe_bench(result: dict, out_dir: Path, *, fmt: str = "png") -> list[Path]:
    """``summary.json`` (the ``--json`` object) and ``moe-bench.<fmt>`` in ``out_dir``."""
    out_dir = Path(out_dir)
    return [write_json(out_dir / "summary.json", result), plot_moe_bench(result, out_dir / f"moe-bench.{fmt}")]
