"""Grant timing: per group grant, the time from ready (the last member's acquire in) to the grant, by what the grant
needed (``lit``, ``revoke``, ``switch``, with a switch's overhead beyond its delay beside it), and each revoke's round
trip (push to lease end), all in the controller's injected clock (virtual time here); then the /metrics families of a
real controller process that real clients drove through a lease, a revoke and a switch."""

from __future__ import annotations

import asyncio
import json
import signal
import subprocess
import sys

import pytest

from lightrail.runtime.controller.core import Controller
from lightrail.runtime.controller.process import start_controller
from lightrail.runtime.controller.protocol import Ack

D = 0.010  # make()'s OCS delay (rail0 and rail1, 8 ports each)


def ack(c: Controller, rank: int, key: str, lease: int, ops: int) -> dict:
    return c.ack(Ack(op="ack", job="j", rank=rank, key=key, lease=lease, ops=ops, inside=False))


def counts(c: Controller) -> dict[str, int]:
    return {**{k: t.count for k, t in c.grant_latency.items()}, "overhead": c.grant_overhead.count,
            "revoke_rtt": c.revoke_rtt.count}


def test_a_group_whose_circuits_are_lit_is_timed_lit_from_its_last_members_acquire(
        make, declare, acquire, release, job_of):
    """Ready is the last member's acquire, not the first: rank 0 waited 0.5 s for rank 1, the grant took 0."""
    async def run():
        c, vt = make()
        job_of(c, world=2)
        declare(c, "j", "pair", [0, 1], {"rail0": {0: 1, 1: 0}})
        for r in (0, 1):
            acquire(c, "j", r, "pair")
        await vt.settle()
        for r in (0, 1):
            release(c, "j", r, "pair")
        assert counts(c) == {"lit": 0, "revoke": 0, "switch": 1, "overhead": 1, "revoke_rtt": 0}  # the first lit it
        first = acquire(c, "j", 0, "pair")
        vt.now += 0.5
        second = acquire(c, "j", 1, "pair")
        await vt.settle()
        assert first.done() and second.done()
        assert counts(c) == {"lit": 1, "revoke": 0, "switch": 1, "overhead": 1, "revoke_rtt": 0}
        assert list(c.grant_latency["lit"].samples) == [0.0] and c.grant_latency["lit"].sum == 0.0
        assert sorted(c.latencies)[-1] == pytest.approx(0.5)  # the acquire latency does count rank 0's wait

    asyncio.run(run())


def test_a_switch_is_timed_from_ready_and_its_overhead_is_what_is_not_the_delay(
        make, declare, acquire, release, job_of):
    """A alone: a switch of exactly D, no overhead. B is ready while A's per-op round holds the ports it switches:
    0.3 s later A releases, B switches, and its latency is 0.3 + D, of which the overhead is the 0.3."""
    async def run():
        c, vt = make()
        job_of(c)
        declare(c, "j", "A", [0, 1], {"rail0": {0: 1, 1: 0}})
        declare(c, "j", "B", [2, 3], {"rail0": {1: 2, 2: 1}})  # switches port 1 (and darkens 0): A's
        for r in (0, 1):
            acquire(c, "j", r, "A")
        await vt.settle()
        assert list(c.grant_latency["switch"].samples) == pytest.approx([D])
        assert list(c.grant_overhead.samples) == pytest.approx([0.0], abs=1e-9)
        fb = [acquire(c, "j", r, "B") for r in (2, 3)]
        await vt.settle()
        assert not any(f.done() for f in fb)
        vt.now += 0.3
        for r in (0, 1):
            release(c, "j", r, "A")
        await vt.settle()
        assert all(f.done() for f in fb)
        assert counts(c) == {"lit": 0, "revoke": 0, "switch": 2, "overhead": 2, "revoke_rtt": 0}
        latency, overhead = c.grant_latency["switch"].samples[-1], c.grant_overhead.samples[-1]
        assert latency >= D and latency == pytest.approx(0.3 + D)
        assert overhead == pytest.approx(latency - D) and overhead == pytest.approx(0.3)
        assert c.grant_latency["switch"].sum == pytest.approx(0.3 + 2 * D)
        assert c.grant_overhead.sum == pytest.approx(0.3)
        # the overhead split where it falls: 0.3 s from ready to the switch's start (A's release), 0 after its end
        assert list(c.switch_lag["before"].samples) == pytest.approx([0.0, 0.3], abs=1e-9)
        assert list(c.switch_lag["after"].samples) == pytest.approx([0.0, 0.0], abs=1e-9)

    asyncio.run(run())


def test_a_switch_a_prepare_started_counts_only_from_ready_and_one_over_before_ready_is_lit(
        make, declare, acquire, release, job_of):
    """Provisioned: the members prepare, the switch starts; an acquire half-way through waits D/2 (all of it the
    switch: no overhead); a group whose prepared switch was over before its members acquired is lit."""
    async def run():
        c, vt = make()
        job_of(c)
        declare(c, "j", "A", [0, 1], {"rail0": {0: 1, 1: 0}})
        declare(c, "j", "B", [2, 3], {"rail1": {2: 3, 3: 2}})
        for r in (0, 1):
            acquire(c, "j", r, "A", op="prepare")
        for r in (2, 3):
            acquire(c, "j", r, "B", op="prepare")
        await asyncio.sleep(0)  # both switches start now (nothing else to wait for)
        assert c.groups[("j", "A")].status == "applying" and c.groups[("j", "B")].status == "applying"
        vt.now += D / 2
        fa = [acquire(c, "j", r, "A") for r in (0, 1)]
        await vt.settle()
        assert all(f.done() for f in fa)
        assert list(c.grant_latency["switch"].samples) == pytest.approx([D / 2])
        assert list(c.grant_overhead.samples) == pytest.approx([0.0], abs=1e-9)
        assert list(c.switch_lag["before"].samples) == [0.0]  # a prepare started it before ready
        vt.now += 1.0
        fb = [acquire(c, "j", r, "B") for r in (2, 3)]
        assert all(f.done() for f in fb)  # lit and settled: granted at the second acquire
        assert counts(c) == {"lit": 1, "revoke": 0, "switch": 1, "overhead": 1, "revoke_rtt": 0}
        assert list(c.grant_latency["lit"].samples) == [0.0]

    asyncio.run(run())


def test_a_group_blocked_by_a_lease_times_the_revoke_round_trip_and_its_switch(
        make, declare, acquire, release, job_of):
    """B needs A's lease ports: revoke pushed at t1, acks at t1 + 0.2 and t1 + 0.5, so the round trip is 0.5; B then
    switches (it needed a switch too: kind switch, not revoke) and its overhead is the 0.5 it waited for the lease."""
    async def run():
        c, vt = make()
        pushed = []
        c.notify = lambda job, rank, message: pushed.append((vt.now, rank, message["op"]))
        job_of(c)
        declare(c, "j", "A", [0, 1], {"rail0": {0: 1, 1: 0}}, phase="dp")
        declare(c, "j", "B", [0, 2], {"rail0": {0: 2, 2: 0}}, phase="pp")
        for r in (0, 1):
            acquire(c, "j", r, "A", lease=True)
        await vt.settle()
        lease = c.groups[("j", "A")].lease
        t1 = vt.now
        fb = [acquire(c, "j", r, "B") for r in (0, 2)]
        await vt.settle()
        assert sorted(pushed) == [(t1, 0, "revoke"), (t1, 1, "revoke")] and not any(f.done() for f in fb)
        vt.now += 0.2
        ack(c, 0, "A", lease, ops=1)
        assert c.revoke_rtt.count == 0  # rank 1 still holds the lease
        vt.now += 0.3
        ack(c, 1, "A", lease, ops=1)
        assert list(c.revoke_rtt.samples) == pytest.approx([0.5])
        await vt.settle()
        assert all(f.done() for f in fb)
        assert counts(c) == {"lit": 0, "revoke": 0, "switch": 2, "overhead": 2, "revoke_rtt": 1}
        latency, overhead = c.grant_latency["switch"].samples[-1], c.grant_overhead.samples[-1]
        assert latency == pytest.approx(0.5 + D) and overhead == pytest.approx(latency - D)

    asyncio.run(run())


def test_a_group_lit_by_another_groups_switch_after_a_revoke_is_timed_revoke(
        make, declare, acquire, release, job_of):
    """Skip-if-present grants a lit group whatever leases hold the same circuits, so a revoke without a switch of
    one's own takes a third group: W (ready first) and P both wait for A's lease; once it ends W switches, lighting
    P's circuits too, and P is granted when W's switch settles, with no switch of its own: kind revoke."""
    async def run():
        c, vt = make()
        job_of(c, world=6)
        declare(c, "j", "A", [0, 1], {"rail0": {0: 1, 1: 0}})
        declare(c, "j", "W", [4, 5], {"rail0": {0: 2, 2: 0, 1: 3, 3: 1}})
        declare(c, "j", "P", [2, 3], {"rail0": {0: 2, 2: 0}})
        for r in (0, 1):
            acquire(c, "j", r, "A", lease=True)
        await vt.settle()
        lease = c.groups[("j", "A")].lease
        fw = [acquire(c, "j", r, "W") for r in (4, 5)]  # t1: revoke pushed
        await vt.settle()
        vt.now += 0.1
        fp = [acquire(c, "j", r, "P") for r in (2, 3)]  # t1 + 0.1: P ready
        await vt.settle()
        assert c.counters["revocations"] == 1 and not any(f.done() for f in fw + fp)
        vt.now += 0.2
        for r in (0, 1):
            ack(c, r, "A", lease, ops=1)
        await vt.settle()
        assert all(f.done() for f in fw + fp)
        assert len(c.applies) == 2  # A's switch and W's: P never switched
        assert counts(c) == {"lit": 0, "revoke": 1, "switch": 2, "overhead": 2, "revoke_rtt": 1}
        assert list(c.revoke_rtt.samples) == pytest.approx([0.3])
        assert list(c.grant_latency["revoke"].samples) == pytest.approx([0.2 + D])  # from P's ready to W's settle
        w_latency, w_overhead = c.grant_latency["switch"].samples[-1], c.grant_overhead.samples[-1]
        assert w_latency == pytest.approx(0.3 + D) and w_overhead == pytest.approx(0.3)

    asyncio.run(run())


# --- a real controller process: the families on /metrics -------------------------------------------------------------


def test_metrics_show_grant_latency_by_kind_the_switch_overhead_and_the_revoke_round_trip(tmp_path):
    httpx = pytest.importorskip("httpx")  # the optional extra "service"
    pytest.importorskip("uvicorn")
    pytest.importorskip("prometheus_client")
    from lightrail.runtime.controller.client import ControllerClient

    proc, info = start_controller(tmp_path / "c.db", rails=2, ports=8, ocs_delay=0.005)
    admin = f"http://{info['host']}:{info['admin_port']}"
    try:
        r = httpx.post(f"{admin}/jobs", json={"job": "j", "world": 3},
                       headers={"Authorization": f"Bearer {info['operator_token']}"}, timeout=10)
        assert r.status_code == 200, r.text
        token = r.json()["token"]
        clients = [ControllerClient(info["host"], info["port"], job="j", rank=k, timeout=20, token=token)
                   for k in range(3)]
        for k, client in enumerate(clients):
            client.hello(3, {"rail0": k})
        clients[0].declare("A", [0, 1], {"rail0": {0: 1, 1: 0}}, phase="dp")
        clients[0].declare("B", [0, 2], {"rail0": {0: 2, 2: 0}}, phase="pp")

        def op(ranks, key, lease):
            threads = [asyncio.to_thread(clients[k].acquire, key, lease=lease) for k in ranks]
            return asyncio.gather(*threads)

        async def run():
            await op((0, 1), "A", True)  # a switch, then a lease
            for k in (0, 1):
                clients[k].leave("A")
            await op((0, 2), "B", False)  # revokes A (the clients ack at once), then a switch
            for k in (0, 2):
                clients[k].release("B")
            await op((0, 2), "B", False)  # lit
            for k in (0, 2):
                clients[k].release("B")

        asyncio.run(run())
        text = httpx.get(f"{admin}/metrics", timeout=10).text
        for client in clients:
            client.bye()
            client.close()
    finally:
        proc.send_signal(signal.SIGTERM)
        try:
            proc.wait(15)
        except subprocess.TimeoutExpired:
            proc.kill()
            proc.wait()
        proc.stdout.close()
    lines = text.splitlines()
    for family in ("lightrail_grant_latency_seconds", "lightrail_grant_overhead_seconds", "lightrail_revoke_seconds"):
        assert f"# TYPE {family} summary" in lines
    values = {name: float(value) for name, value in (line.rsplit(" ", 1) for line in lines if not line.startswith("#"))}
    assert values['lightrail_grant_latency_seconds_count{kind="switch"}'] == 2
    assert values['lightrail_grant_latency_seconds_count{kind="lit"}'] == 1
    assert values['lightrail_grant_latency_seconds_count{kind="revoke"}'] == 0
    assert values['lightrail_grant_overhead_seconds_count{kind="switch"}'] == 2
    assert values["lightrail_revoke_seconds_count"] == 1 and values["lightrail_revocations_total"] == 1
    for q in ("0.5", "0.9", "0.99"):
        switch = values[f'lightrail_grant_latency_seconds{{kind="switch",quantile="{q}"}}']
        overhead = values[f'lightrail_grant_overhead_seconds{{kind="switch",quantile="{q}"}}']
        assert 0.005 <= switch and 0 <= overhead < switch  # a switch waits the 5 ms delay; the overhead excludes it
        assert values[f'lightrail_revoke_seconds{{quantile="{q}"}}'] > 0
        assert values[f'lightrail_grant_latency_seconds{{kind="lit",quantile="{q}"}}'] >= 0
    assert 'lightrail_grant_latency_seconds{kind="revoke",quantile="0.5"}' not in values  # no sample: no quantile
    assert values['lightrail_grant_latency_seconds_sum{kind="switch"}'] >= 2 * 0.005


def test_bench_controller_grant_latency_prints_every_kind_and_round_trip():
    """``benchmarks/bench_controller.py --grant-latency`` (a few iterations): the train-demo's 8 ranks as processes
    against a real controller; every op is one group grant (pp and dp switch, loss is lit), every revoke a round
    trip. The figures are the benchmark's, never asserted."""
    pytest.importorskip("httpx")
    pytest.importorskip("uvicorn")
    from pathlib import Path

    bench = Path(__file__).resolve().parents[3] / "benchmarks" / "bench_controller.py"
    done = subprocess.run([sys.executable, str(bench), "--grant-latency", "--rounds", "3"], capture_output=True,
                          text=True, timeout=300)
    assert done.returncode == 0, done.stderr[-2000:]
    out = json.loads(done.stdout)
    assert "error" not in out, out
    kinds = out["grant_latency_s"]
    assert set(kinds) == {"lit", "revoke", "switch", "switch_overhead", "switch_lag_before", "switch_lag_after"}
    assert out["iterations"] == 3 and out["grants"] == 12 * 3  # pp, dp and loss of 4 pairs each, per iteration
    assert kinds["lit"]["count"] + kinds["revoke"]["count"] + kinds["switch"]["count"] == out["grants"]
    assert kinds["switch"]["count"] == kinds["switch_overhead"]["count"] >= 8 * 3 - 4
    assert out["revoke_rtt_s"]["count"] == out["revocations"] > 0 and out["unsafe_reconfigurations"] == 0
    for figure in (kinds["switch"], kinds["switch_overhead"], out["revoke_rtt_s"], out["check_in_rtt_s"]):
        assert 0 <= figure["p50"] <= figure["p90"]
    assert kinds["switch"]["p50"] >= 0.002  # the 2 ms OCS delay is in every switch grant
