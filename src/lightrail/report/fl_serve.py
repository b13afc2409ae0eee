"""``lightrail fl demo`` for people: throughput, rounds, per-job completion, the double-booking check and the data
plane (root downloads vs. client model requests, the FedAvg check)."""

from __future__ import annotations

from rich.console import Console
from rich.table import Table

__all__ = ["print_demo", "print_ready"]


def print_ready(info: dict, console: Console) -> None:
    console.print(f"fl control plane ({info['policy']}): load balancer on port {info['load_balancer']}, job manager "
                  f"{info['job_manager']}, scheduler {info['scheduler']}, client managers "
                  f"{', '.join(map(str, info['client_managers']))}", highlight=False)


def print_demo(r: dict, console: Console) -> None:
    ok = "[green]0[/]" if r["double_bookings"] == 0 else f"[bold red]{r['double_bookings']}[/]"
    console.print(f"fl demo: {r['clients']} clients, {r['jobs']} jobs, policy {r['policy']}, "
                  f"{r['client_managers']} client managers, {r['concurrency']} concurrent clients", highlight=False)
    console.print(f"  {r['bindings']} bindings in {r['wall_s']:.2f} s = [bold]{r['bindings_per_s']:.1f} bindings/s[/] "
                  f"({r['checkins']} check-ins, {r['checkins_per_s']:.1f}/s; {r['empty_checkins']} got no job)",
                  highlight=False)
    console.print(f"  rounds completed {r['rounds_completed']}, all jobs completed: {r['all_jobs_completed']}, "
                  f"double bookings: {ok}, errors: {r['errors']}", highlight=False)
    p = r.get("data_plane")
    if p:
        exact = "[green]yes[/]" if p["model_exact"] else "[bold red]NO[/]"
        console.print(f"  data plane ({p['leaves']} leaves, model of {p['model_dim']}): {p['model_requests_clients']} "
                      f"client model requests served by {p['model_downloads_root']} root downloads "
                      f"([bold]{p['downloads_saved_ratio']}x[/]); {p['results_forwarded']} results forwarded in "
                      f"{p['batches_forwarded']} batches; final models = FedAvg of the updates sent: {exact}",
                      highlight=False)
        if p.get("leaf_killed"):
            k = p["leaf_killed"]
            console.print(f"  leaf {k['leaf']} (pid {k['pid']}) killed in round {k['round']} of job {k['job']}: "
                          f"{p['leaves_replaced']} leaf replaced, {p['recovered_results']} results recovered from "
                          f"its state, {p['leaf_retries']} client retries", highlight=False)
    table = Table(title="jobs")
    for col in ("job", "rounds", "demand", "completed", "completion"):
        table.add_column(col, justify="right")
    for j in r["per_job"]:
        table.add_row(str(j["job"]), str(j["rounds"]), str(j["demand"]), str(j["rounds_completed"]),
                      f"{j['completion_s']:.2f} s" if j["completion_s"] is not None else "-")
    console.print(table)
