"""Output of ``lightrail calibrate iterations``: the fit as a scenario fragment, a table, a plot and JSON."""

from __future__ import annotations

from pathlib import Path

import yaml

from lightrail.report.files import write_json, write_text
from lightrail.studies.calibrate_iterations import IterationCalibration, time_text
from lightrail.units import format_time

__all__ = ["fragment_yaml", "plot_iterations", "write_iterations", "print_iterations"]

_COLOURS = {"on-demand": "tab:red", "provisioned": "tab:blue", "electrical": "0.3"}


def _rms(value: float | None) -> str:
    return "n/a" if value is None else f"{value:.2%}"


def _fit_rows(cal: IterationCalibration) -> str:
    if cal.fit_delays_s is None:
        return "every row"
    return "electrical rows and the rows at " + ", ".join(time_text(d) for d in cal.fit_delays_s)


def fragment_yaml(cal: IterationCalibration) -> str:
    """The fitted parameters as a scenario fragment: paste its job and ocs fields into the scenario file."""
    rms = cal.rms_relative_error
    kept = [k for k, known in cal.identified.items() if not known]
    lines = [f"# fitted by lightrail calibrate iterations from {cal.source} on scenario {cal.scenario} "
             f"(policy {cal.policy}), on {_fit_rows(cal)}",
             f"# rms relative error: out-of-fit rows {_rms(rms['out_of_fit'])}, in-fit {_rms(rms['in_fit'])}, "
             f"all {_rms(rms['all'])}"]
    if kept:
        lines.append(f"# not identified by the rows, kept at the scenario's value: {', '.join(kept)}")
    lines += [f"# warning: {w}" for w in cal.warnings]
    return "\n".join(lines) + "\n" + yaml.safe_dump(cal.scenario_fragment(), sort_keys=False)


def plot_iterations(cal: IterationCalibration, path: Path) -> Path:
    """Measured (filled: in the fit; open: out of it, the model's test) and predicted iteration time against the
    OCS delay, per mode; the electrical rows as horizontal lines; the relative error below."""
    from lightrail.report.plots import _save, plt

    fig, (top, bottom) = plt.subplots(2, 1, figsize=(7, 6), sharex=True, height_ratios=(3, 1))
    photonic = [r for r in cal.rows if r["mode"] != "electrical"]
    positive = [r["delay_s"] for r in photonic if r["delay_s"] > 0]
    for mode in ("on-demand", "provisioned"):
        mine = sorted((r for r in photonic if r["mode"] == mode), key=lambda r: r["delay_s"])
        if not mine:
            continue
        colour = _COLOURS[mode]
        delays = sorted({r["delay_s"] for r in mine})
        predicted = {r["delay_s"]: r["predicted_s"] for r in mine}
        top.plot(delays, [predicted[d] for d in delays], "-", color=colour, lw=1.5, label=f"{mode}: model")
        for used, face, what in ((True, colour, "measured, in fit"), (False, "none", "measured, out of fit")):
            pts = [r for r in mine if r["used_in_fit"] == used]
            if pts:
                top.plot([r["delay_s"] for r in pts], [r["measured_s"] for r in pts], "o", ms=6, color=colour,
                         mfc=face, ls="none", label=f"{mode}: {what}")
                bottom.plot([r["delay_s"] for r in pts], [100 * r["relative_error"] for r in pts], "o", ms=5,
                            color=colour, mfc=face, ls="none")
    electrical = [r for r in cal.rows if r["mode"] == "electrical"]
    if electrical:
        top.axhline(electrical[0]["predicted_s"], color=_COLOURS["electrical"], ls="--", lw=1,
                    label="electrical: model")
        for r in electrical:
            top.axhline(r["measured_s"], color=_COLOURS["electrical"], ls=":", lw=1)
        top.plot([], [], ":", color=_COLOURS["electrical"], label="electrical: measured")
    top.set_xscale("symlog", linthresh=min(positive) if positive else 1e-3)
    top.set_yscale("log")
    top.set_ylabel("iteration time (s)")
    f = cal.fitted
    top.set_title(f"{cal.scenario}: mfu {f['mfu']:.3g}, check-in rtt {format_time(f['check_in_rtt_s'])}, command "
                  f"latency {format_time(f['command_latency_s'])}\nout-of-fit rms "
                  f"{_rms(cal.rms_relative_error['out_of_fit'])}, all rows {_rms(cal.rms_relative_error['all'])}",
                  fontsize=9)
    top.legend(fontsize=7)
    top.grid(True, which="both", alpha=0.3)
    bottom.axhline(0, color="k", lw=0.5)
    worst = max((abs(r["relative_error"]) for r in photonic), default=0.0)
    bottom.set_ylim(-max(1.0, 120 * worst), max(1.0, 120 * worst))  # at least +-1%: a perfect fit shows as flat
    bottom.set_ylabel("model error (%)")
    bottom.set_xlabel("OCS reconfiguration delay (s)")
    return _save(fig, path)


def write_iterations(cal: IterationCalibration, out_dir: Path, *, fmt: str = "png") -> list[Path]:
    """calibration.yaml (a scenario fragment), calibration.json and calibration.<fmt> in ``out_dir``, each
    written to a temporary file and renamed."""
    out_dir = Path(out_dir)
    fragment = fragment_yaml(cal)
    data = cal.to_dict()
    return [write_text(out_dir / "calibration.yaml", fragment), write_json(out_dir / "calibration.json", data),
            plot_iterations(cal, out_dir / f"calibration.{fmt}")]


def print_iterations(cal: IterationCalibration, console, written: list[Path]) -> None:
    """The fitted parameters against the scenario's, the rows (measured, predicted, error, in fit), warnings."""
    from rich.markup import escape
    from rich.table import Table

    f, before, known = cal.fitted, cal.scenario_values, cal.identified
    console.print(f"{cal.scenario} (policy {cal.policy}): fitted on {_fit_rows(cal)}, {cal.simulations} simulations")
    params = Table("parameter", "fitted", "scenario", "")
    params.add_row("job.mfu", f"{f['mfu']:.4g}", f"{before['mfu']:.4g}", "" if known["mfu"] else "kept")
    for key, name in (("check_in_rtt_s", "ocs.check_in_rtt"), ("command_latency_s", "ocs.command_latency")):
        params.add_row(name, format_time(f[key]), format_time(before[key]), "" if known[key] else "kept")
    console.print(params)
    rows = Table("line", "mode", "OCS delay", "measured", "predicted", "error", "in fit")
    for r in cal.rows:
        rows.add_row(str(r["line"]), r["mode"], "" if r["delay_s"] is None else time_text(r["delay_s"]),
                     format_time(r["measured_s"]), format_time(r["predicted_s"]), f"{r['relative_error']:+.2%}",
                     "yes" if r["used_in_fit"] else "[bold]no[/]")
    console.print(rows)
    rms = cal.rms_relative_error
    console.print(f"  rms relative error: out-of-fit rows {_rms(rms['out_of_fit'])} (the model's test), in-fit "
                  f"{_rms(rms['in_fit'])}, all {_rms(rms['all'])}")
    for w in cal.warnings:
        console.print(f"[yellow]warning: {escape(w)}[/]")
    for path in written:
        console.print(f"  wrote {path}")
