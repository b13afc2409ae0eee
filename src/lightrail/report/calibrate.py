"""Output of ``lightrail calibrate nccl-tests``: the fit as a table, a scenario fragment and a plot."""

from __future__ import annotations

from pathlib import Path

import yaml

from lightrail.report.files import write_json, write_text
from lightrail.studies.calibrate_nccl import Calibration
from lightrail.units import format_rate, format_size, format_time

__all__ = ["print_calibration", "write_calibration", "fragment_yaml", "plot_calibration"]


def fragment_yaml(cal: Calibration, source: str) -> str:
    """The fitted parameters as a scenario fragment: paste its cluster fields into a scenario file."""
    if cal.model == "nccl":
        lines = [f"# fitted by lightrail calibrate nccl-tests from {source}: NCCL's model of {cal.kind} on {cal.ranks} "
                 f"GPUs ({cal.communicator.get('nodes')} node(s)), algorithm {cal.algo}",
                 f"# rms relative error {cal.rms_relative_error:.3%}; alpha and latency are Simple's base and per-hop "
                 "latency; every NCCL parameter is in calibration.json (params)"]
        lines += [f"# warning: {w}" for w in cal.warnings]
        return "\n".join(lines) + "\n" + yaml.safe_dump(cal.scenario_fragment(), sort_keys=False)
    held = "" if cal.latency_fitted else " (held: alpha and latency are not separable on this schedule)"
    head = (f"# fitted by lightrail calibrate nccl-tests from {source}: {cal.kind} {cal.algo} on {cal.ranks} GPUs, "
            f"topology {cal.topology}\n# rms relative error {cal.rms_relative_error:.3%}; latency per hop"
            f"{held}\n")
    return head + yaml.safe_dump(cal.scenario_fragment(), sort_keys=False)


def plot_calibration(cal: Calibration, path: Path) -> Path:
    """Measured and model time against message size (log-log), and the relative residuals."""
    from lightrail.report.plots import _save, plt

    fig, (top, bottom) = plt.subplots(2, 1, figsize=(7, 6), sharex=True, height_ratios=(3, 1))
    for in_place, marker in ((False, "o"), (True, "x")):
        pts = [p for p in cal.points if p["in_place"] == in_place]
        if pts:
            top.loglog([p["size"] for p in pts], [p["measured_s"] * 1e6 for p in pts], marker, ms=4, ls="none",
                       label=f"measured ({'in-place' if in_place else 'out-of-place'})")
            bottom.semilogx([p["size"] for p in pts], [100 * p["relative_error"] for p in pts], marker, ms=4)
    sizes = sorted({p["size"] for p in cal.points})
    model = {p["size"]: p["model_s"] for p in cal.points}
    if cal.model == "nccl":
        _segments(top, cal, sizes, model)
        top.set_title(f"{cal.kind}, {cal.ranks} GPUs ({cal.communicator.get('nodes')} node(s)): measured vs NCCL's "
                      f"model (algo {cal.algo}), rms {cal.rms_relative_error:.1%}", fontsize=9)
    else:
        top.loglog(sizes, [model[s] * 1e6 for s in sizes], "-", color="k", lw=1,
                   label=f"model: alpha {format_time(cal.alpha_s)}, latency {format_time(cal.latency_s)}/hop, "
                         f"{format_rate(cal.bandwidth_Bps)}")
        top.set_title(f"{cal.kind} {cal.algo}, {cal.ranks} GPUs, {cal.topology}: measured vs model")
    top.set_ylabel("time (µs)")
    top.legend(fontsize=8)
    bottom.axhline(0, color="k", lw=0.5)
    bottom.set_ylabel("model error (%)")
    bottom.set_xlabel("message size (bytes)")
    return _save(fig, path)


def _segments(ax, cal: Calibration, sizes: list[int], model: dict) -> None:
    """The model's curve in one colour per (algorithm, protocol) it picks, each run of sizes a segment."""
    from lightrail.report.plots import plt

    pick = {c["size"]: (c["algorithm"], c["protocol"]) for c in cal.choices}
    colours = plt.get_cmap("tab10")
    order = list(dict.fromkeys(pick[s] for s in sizes))
    start = 0
    for i in range(1, len(sizes) + 1):
        if i == len(sizes) or pick[sizes[i]] != pick[sizes[start]]:
            key = pick[sizes[start]]
            run = sizes[start:min(i + 1, len(sizes))]  # joined to the next segment's first size
            first = all(pick[s] != key for s in sizes[:start])
            ax.loglog(run, [model[s] * 1e6 for s in run], "-", lw=2, color=colours(order.index(key) % 10),
                      label=f"model: {key[0]} / {key[1]}" if first else None)
            start = i


def write_calibration(cal: Calibration, out_dir: Path, source: str, *, fmt: str = "png") -> list[Path]:
    """calibration.yaml, calibration.json and calibration.<fmt> in ``out_dir``."""
    out_dir = Path(out_dir)
    return [write_text(out_dir / "calibration.yaml", fragment_yaml(cal, source)),
            write_json(out_dir / "calibration.json", cal.to_dict()),
            plot_calibration(cal, out_dir / f"calibration.{fmt}")]


def _print_nccl(cal: Calibration, console) -> None:
    from rich.markup import escape
    from rich.table import Table

    c, q, nominal = cal.communicator, cal.params, cal.nominal
    console.print(f"{cal.kind} on {cal.ranks} GPUs ({c['nodes']} node(s) x {c['gpus_per_node']}, {c['arch']}, "
                  f"nvls {c['nvls']}, collnet {c['collnet']}): NCCL's model, algorithm {cal.algo}")
    console.print(f"  rms relative error {cal.rms_relative_error:.2%}, max {cal.max_relative_error:.2%}")
    links = [("NVLink", "nvlink_Bps")] + ([("NIC", "nic_Bps")] if c["nodes"] > 1 else [])
    identified = getattr(cal, "bandwidth_identified", {}) or {}
    for name, key in links:
        held = "" if identified.get(key, True) else "; not determined by the data: NCCL's default, held"
        console.print(f"  {name} bandwidth {format_rate(q[key])} ({q[key] / nominal[key]:.2f}x the nominal "
                      f"{format_rate(nominal[key])}{held})")
    if c["nodes"] > 1 and cal.kind in ("alltoall", "sendrecv") and "p2p_net_channel_Bps" in q:
        console.print(f"  p2p channel to another node {format_rate(q['p2p_net_channel_Bps'])} (NCCL "
                      "sizes channels by 14 GB/s: NCCL_P2P_PER_CHANNEL_NET_BW)")
    lat = Table("latency", "LL", "LL128", "Simple", title=None)
    for label, key in (("base", "base_latency_s"), ("per NVLink hop", "nvlink_latency_s"),
                       ("per network hop", "net_latency_s")):
        lat.add_row(label, *(format_time(v) for v in q[key]))
    console.print(lat)
    console.print(f"  efficiency: LL {q['ll_efficiency']:.3g}, LL128 {q['ll128_efficiency']:.3g}, "
                  f"NVLS {q['nvls_efficiency']:.3g}")
    runs, prev = [], None
    for ch in cal.choices:
        key = (ch["algorithm"], ch["protocol"])
        if key != prev:
            runs.append([key, ch["size"], ch["size"]])
            prev = key
        runs[-1][2] = ch["size"]
    console.print("  picks: " + "; ".join(f"{format_size(a)}..{format_size(b)} {k[0]}/{k[1]}" for k, a, b in runs))
    for w in cal.warnings:
        console.print(f"[yellow]warning: {escape(w)}[/]")


def print_calibration(cal: Calibration, console, written: list[Path]) -> None:
    from rich.table import Table

    if cal.model == "nccl":
        _print_nccl(cal, console)
        table = Table("size", "", "measured", "model", "error", "algorithm", "protocol")
        for p in cal.points:
            table.add_row(format_size(p["size"]), "in-place" if p["in_place"] else "", format_time(p["measured_s"]),
                          format_time(p["model_s"]), f"{p['relative_error']:+.2%}", p["algorithm"], p["protocol"])
        console.print(table)
        for path in written:
            console.print(f"  wrote {path}")
        return
    held = "" if cal.latency_fitted else " (held: not separable from alpha on this schedule)"
    console.print(f"{cal.kind} {cal.algo} on {cal.ranks} GPUs ({cal.topology}): alpha {format_time(cal.alpha_s)}, "
                  f"latency {format_time(cal.latency_s)} per hop{held}, bandwidth {format_rate(cal.bandwidth_Bps)}")
    console.print(f"  start-up per step {format_time(cal.startup_per_step_s)} ({cal.hops_per_step:g} hops); "
                  f"rms relative error {cal.rms_relative_error:.2%}, max {cal.max_relative_error:.2%}")
    table = Table("size", "", "measured", "model", "error")
    for p in cal.points:
        table.add_row(format_size(p["size"]), "in-place" if p["in_place"] else "", format_time(p["measured_s"]),
                      format_time(p["model_s"]), f"{p['relative_error']:+.2%}")
    console.print(table)
    for w in cal.warnings:
        console.print(f"[yellow]warning: {w}[/]")
    for path in written:
        console.print(f"  wrote {path}")
