"""``lightrail study collectives``: when does reconfiguring the fabric per step pay?"""

from __future__ import annotations

from pathlib import Path
from typing import Annotated

import typer
from rich.table import Table

from lightrail.cli.app import app, friendly, out
from lightrail.cli.options import (
    Alpha,
    Bandwidth,
    JsonOut,
    Latency,
    parse_kind,
    parse_sizes,
    print_json,
    progress_bar,
)
from lightrail.errors import ScenarioError
from lightrail.units import format_size, format_time, parse_rate, parse_time

study_app = typer.Typer(no_args_is_help=True, help="Studies over grids of cases.")
app.add_typer(study_app, name="study")


@study_app.command("collectives")
@friendly
def study_collectives_cmd(
    ops: Annotated[str, typer.Option("--ops", help="Comma list of collectives.")] =
    "allreduce,reducescatter,allgather,alltoall",
    ranks: Annotated[str, typer.Option("--ranks", help="Comma list of rank counts.")] = "8,16,32,64,128,256,1024",
    sizes: Annotated[str, typer.Option("--sizes", help="1KiB..4GiB (powers of two) or a comma list.")]
    = "1KiB..4GiB",
    delays: Annotated[str, typer.Option("--delays", help="Comma list of reconfiguration delays.")]
    = "0,1us,10us,100us,1ms,10ms",
    ports: Annotated[int, typer.Option("--ports", help="Optical ports per GPU.")] = 2,
    bandwidth: Bandwidth = "400Gbps",
    latency: Latency = "1us",
    alpha: Alpha = "3us",
    propagation: Annotated[str, typer.Option("--propagation", help="Fibre delay per circuit hop.")] = "0",
    out_dir: Annotated[Path, typer.Option("--out", help="Folder for study.json, summary.csv and heat maps.")]
    = Path("out/study-collectives"),
    as_json: JsonOut = False,
):
    """When does reconfiguring the fabric per step pay? Static ring, torus and switch against a
    reconfigurable fabric, every algorithm planned exactly, over ops x ranks x sizes x delays."""
    import numpy as np

    from lightrail.report.files import write_json, write_text
    from lightrail.report.plots import plot_speedup_heatmaps
    from lightrail.studies.collective_study import StudyGrid, collective_study

    op_list = [parse_kind(o).value for o in ops.split(",") if o.strip()]
    try:
        rank_list = [int(r) for r in ranks.split(",") if r.strip()]
    except ValueError:
        raise ScenarioError(f"{ranks!r} is not a list of rank counts", field="--ranks", fix="e.g. 8,64,1024") from None
    if not rank_list or min(rank_list) < 2:
        raise ScenarioError("rank counts must be 2 or more", field="--ranks", fix="e.g. 8,64,1024")
    if ports < 1:
        raise ScenarioError(f"{ports} ports", field="--ports", fix="use 1 or more")
    grid = StudyGrid(ops=tuple(op_list), ranks=tuple(rank_list), sizes=tuple(parse_sizes(sizes)),
                     delays=tuple(parse_time(d, field="--delays") for d in delays.split(",") if d.strip()),
                     ports=ports, bandwidth=parse_rate(bandwidth, field="--bandwidth"),
                     latency=parse_time(latency, field="--latency"), alpha=parse_time(alpha, field="--alpha"),
                     propagation=parse_time(propagation, field="--propagation"))
    progress, task = progress_bar(len(op_list) * len(rank_list), "collective study", as_json)
    with progress:
        result = collective_study(grid, progress=lambda name: progress.update(task, advance=1, description=name))
    tables = result.pop("_tables")
    for op in op_list:
        speedup = {}
        for n in rank_list:
            t = tables[(op, n)]
            best_ring = np.min(list(t["static"]["ring"].values()), axis=0)
            best_reconf = np.min([v[0] for v in t["reconfigurable"].values()], axis=0)
            speedup[n] = best_ring[None, :] / best_reconf
        plot_speedup_heatmaps(op, rank_list, grid.sizes, grid.delays, speedup, out_dir / f"heatmap-{op}.png",
                              title=f"{op}: reconfigurable ({ports} ports) vs the best algorithm on a static ring")
    lines = ["op,ranks,size_bytes,delay_s,static_ring,static_ring_s,static_torus,static_torus_s,switch,switch_s,"
             "reconfigurable,reconfigurable_s,reconfigurations,speedup_vs_static_ring,speedup_vs_best_static"]
    for c in result["cells"]:
        st, rc = c["best_static"], c["best_reconfigurable"]
        lines.append(",".join(str(x) for x in (
            c["op"], c["ranks"], int(c["size_bytes"]), c["delay_s"], st["ring"]["algorithm"],
            f"{st['ring']['time_s']:.6g}", st["torus"]["algorithm"], f"{st['torus']['time_s']:.6g}",
            st["switch"]["algorithm"], f"{st['switch']['time_s']:.6g}", rc["algorithm"], f"{rc['time_s']:.6g}",
            rc["reconfigurations"], f"{c['speedup_vs_static_ring']:.4g}", f"{c['speedup_vs_best_static']:.4g}")))
    write_text(out_dir / "summary.csv", "\n".join(lines) + "\n")
    write_json(out_dir / "study.json", result)
    if as_json:
        print_json(result)
        return
    table = Table(title="reconfigurable vs static ring: best speedup per (op, ranks), and where")
    for col in ("op", "ranks", "max speedup", "at size", "at delay", "algorithm", "reconfigs"):
        table.add_column(col, justify="right" if col not in ("op", "algorithm") else "left")
    for op in op_list:
        for n in rank_list:
            mine = [c for c in result["cells"] if c["op"] == op and c["ranks"] == n]
            best = max(mine, key=lambda c: c["speedup_vs_static_ring"])
            rc = best["best_reconfigurable"]
            table.add_row(op, str(n), f"{best['speedup_vs_static_ring']:.2f}x", format_size(best["size_bytes"]),
                          format_time(best["delay_s"]) if best["delay_s"] else "0", rc["algorithm"],
                          str(rc["reconfigurations"]))
    out.print(table)
    for f in result["findings"]:
        if f["finding"].startswith("static ring"):
            out.print(f"n={f['ranks']:>5}: on a static ring, Ring AllReduce beats recursive doubling from "
                      f"{format_size(f['ring_wins_from_bytes']) if f['ring_wins_from_bytes'] else 'no size'} up"
                      f" (at the smallest size recursive doubling takes {f['ratio_rd_over_ring_at_smallest']:.2f}x"
                      f" Ring's time)")
        elif f["finding"].startswith("short-circuited"):
            reach = ", ".join(f"{format_time(float(d)) if float(d) else '0'}: "
                              f"{format_size(s) if s else 'none'}" for d, s in f["wins_up_to_size_by_delay"].items())
            out.print(f"n={f['ranks']:>5}: short-circuited recursive doubling beats Ring on the static ring up to "
                      f"(delay: size) {reach}; static recursive doubling only up to "
                      f"{format_size(f['static_wins_up_to_size']) if f['static_wins_up_to_size'] else 'none'}")
    out.print(f"wrote {out_dir / 'study.json'}, {out_dir / 'summary.csv'}, heat maps {out_dir}/heatmap-*.png")
