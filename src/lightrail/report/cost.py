"""The table of rail network power and cost across cluster sizes (``lightrail cost``)."""

from __future__ import annotations

from rich.console import Console
from rich.table import Table

from lightrail.studies.cost import CostSweep

__all__ = ["print_cost"]


def print_cost(sweep: CostSweep, console: Console) -> None:
    table = Table(title=f"rail networks at {sweep.rail_speed}, {sweep.gpus_per_server} GPUs per server "
                        f"(electrical / photonic)")
    for col in ("GPUs", "EPS tiers", "EPS switches", "OCS ports", "power (kW)", "cost ($M)", "power ratio",
                "cost ratio"):
        table.add_column(col, justify="right")
    for r in sweep.rows():
        table.add_row(str(r["gpus"]), str(r["electrical_tiers"]), str(r["electrical_switches"]), str(r["ocs_ports"]),
                      f"{r['electrical_power_w'] / 1e3:,.1f} / {r['photonic_power_w'] / 1e3:,.1f}",
                      f"{r['electrical_capex_usd'] / 1e6:,.2f} / {r['photonic_capex_usd'] / 1e6:,.2f}",
                      f"{r['power_ratio']:.1f}x", f"{r['cost_ratio']:.2f}x")
    console.print(table)
