"""Spare splicing (issue 17 part 4, LUMION): a rank killed mid-training is replaced by an idle spare, the
job rebuilds its groups and resumes from the checkpoint a DP peer holds in memory, with the loss curve of
an uninterrupted run; with no spare left the run ends in one line, exit 2."""

from __future__ import annotations

import subprocess
import sys

import pytest

pytest.importorskip("torch")

import torch  # noqa: E402

from lightrail.control.plan import Policy, runtime_plan  # noqa: E402
from lightrail.errors import ScenarioError  # noqa: E402
from lightrail.runtime.torch_backend import Agent, BackendConfig, Inner, circuits_of, spare_ports  # noqa: E402
from lightrail.studies.train_demo import DemoConfig, Failure, _bits, _Replica, _woken_by  # noqa: E402
from lightrail.studies.train_demo.measure import _failure, run_photonic_demo  # noqa: E402
from lightrail.workload.parallel import Dim, Layout  # noqa: E402

LAYOUT = Layout.from_degrees(8, tp=2, pp=2, dp=2, gpus_per_server=2)
TINY = DemoConfig(tp=2, pp=2, dp=2, steps=4, layers=2, d_model=32, heads=2, microbatches=2, seq=16)
ONE = DemoConfig(tp=1, pp=1, dp=1, steps=4, layers=2, d_model=32, heads=2, microbatches=2, seq=16)


def test_a_failed_ranks_port_moves_to_its_spares_in_every_circuit():
    # rank 2 sits on server 1, rail 0; spare 0 has port servers + 0 = 4 on every rail
    assert spare_ports(LAYOUT, 0) == {"rail0": 4, "rail1": 4} and spare_ports(LAYOUT, 1) == {"rail0": 5, "rail1": 5}
    moved = {("rail0", 1): 4}
    ring = [(0, 2), (2, 4), (4, 6), (6, 0)]  # DP-like ring on rail 0: servers 0 -> 1 -> 2 -> 3
    before, after = circuits_of(LAYOUT, ring), circuits_of(LAYOUT, ring, moved)
    assert before == {"rail0": {0: 1, 1: 2, 2: 3, 3: 0}}
    assert after == {"rail0": {0: 4, 4: 2, 2: 3, 3: 0}}  # the controller's rewrite: port 1 -> 4 on both ends
    assert circuits_of(LAYOUT, [(1, 3)], moved) == circuits_of(LAYOUT, [(1, 3)])  # rail 1 is untouched


def test_kill_flags_are_checked_before_any_work():
    assert _failure(TINY, 1, 3, 2) == Failure(3, 2)
    assert _failure(TINY, 1, None, None) is None
    cases = [((TINY, 1, 3, None), "--kill-at-step"), ((TINY, 1, None, 2), "--kill-rank"),
             ((TINY, 1, 8, 2), "--kill-rank"), ((TINY, 1, 3, 4), "--kill-at-step"),
             ((TINY, -1, 3, 2), "--spares"), ((DemoConfig(tp=2, pp=2, dp=1, steps=4), 1, 1, 2), "--dp")]
    for args, field in cases:
        with pytest.raises(ScenarioError) as e:
            _failure(*args)
        assert e.value.field == field, (args, e.value)


def _replica(config: DemoConfig = ONE) -> _Replica:
    torch.set_num_threads(1)
    return _Replica(config, 0, {Dim.TP: None, Dim.DP: None, Dim.PP: None}, None)


def test_rolling_back_to_a_checkpoint_replays_the_same_losses():
    replica = _replica()
    replica.snapshot(-1)
    for step in range(3):
        replica.step(step)
        replica.snapshot(step)
    first = [_bits(x) for x in replica.losses]
    replica.rollback(0)  # what a survivor does: back to the last step every rank completed
    assert len(replica.losses) == 1 and replica.optimizer.t == 1
    for step in (1, 2):
        replica.step(step)
    assert [_bits(x) for x in replica.losses] == first
    with pytest.raises(Exception, match="no checkpoint of step 7"):
        replica.rollback(7)


def test_a_spare_restored_from_a_peers_state_trains_on_identically():
    peer, spare = _replica(), _replica()
    peer.snapshot(-1)
    for step in range(2):
        peer.step(step)
        peer.snapshot(step)
    flat = peer.state_vector(1)
    assert flat.numel() == spare.vector_size(1)
    spare.load_state_vector(flat.clone(), 1)  # what the broadcast from the DP peer delivers
    assert spare.optimizer.t == peer.optimizer.t == 2
    assert [_bits(x) for x in spare.losses] == [_bits(x) for x in peer.losses]
    assert all(torch.equal(a, b) for a, b in zip(spare.params, peer.params, strict=True))
    assert len(spare.times) == 2  # steps it did not run count no time of its own
    peer.step(2)
    spare.step(2)
    assert _bits(spare.losses[-1]) == _bits(peer.losses[-1])


def test_how_a_rank_was_woken_is_read_from_its_error():
    assert _woken_by("RuntimeError: [gloo/transport/tcp/pair.cc:553] Connection closed by peer") == "connection"
    assert _woken_by("RuntimeError: [gloo/transport/tcp/unbound_buffer.cc:78] Timed out waiting 30000ms") == "timeout"
    assert _woken_by("ControllerError: rank 3 failed") == "controller"


@pytest.mark.skipif(not torch.cuda.is_available(), reason="needs a CUDA GPU (NCCL path)")
def test_nccl_circuits_are_released_only_after_the_data_moved():
    """The op is queued on the GPU and its work's wait() returns at once (as NCCL's does): the release must
    still come after the GPU finished it."""
    agent = Agent(BackendConfig(layout=LAYOUT, inner=Inner.NCCL, plan=runtime_plan(LAYOUT, Policy(leases=False))))
    seen = []

    class Client:
        requests = 0

        def declare(self, *a, **k):
            pass

        def acquire(self, key, lease=False):
            return {"granted": True}

        def release(self, key, then_prepare=None):
            seen.append(torch.cuda.current_stream().query())  # True: nothing left on the stream

    class Work:
        def wait(self):
            return True

    x = torch.randn(4096, 4096, device="cuda")

    def op():
        for _ in range(20):
            x.copy_(x @ x / 4096)  # long enough to be still running when wait() returns
        return Work()

    agent.client = Client()
    agent.run_op("dp:0,2", [0, 2], {"rail0": {0: 1, 1: 0}}, op)
    assert seen == [True]


@pytest.mark.slow
def test_a_killed_rank_is_replaced_by_a_spare_and_training_resumes_with_the_same_losses():
    result = run_photonic_demo(TINY, ocs_delay=0.002, spares=1, kill_rank=3, kill_at_step=2).to_dict()
    rec = result["recovery"]
    assert rec is not None and rec["rank"] == 3 and rec["spare"] == 8 and result["spares"] == 1
    for key in ("detect_s", "rewire_s", "rebuild_s", "restore_s", "first_step_s"):
        assert rec[key] >= 0, (key, rec)
    assert rec["detect_s"] <= rec["first_step_s"]
    assert rec["detect_s"] + rec["rebuild_s"] + rec["restore_s"] <= rec["first_step_s"]
    assert rec["detected_by"] == "controller"
    # the kill came at the start of step 2: steps 0 and 1 were complete everywhere, none is redone
    assert rec["checkpoint_step"] == 1 and rec["steps_lost"] == 0
    # every survivor was woken by a closed connection or the controller, none by gloo's timeout
    assert sum(rec["woken_by"].values()) == TINY.world - 1 and "timeout" not in rec["woken_by"]
    assert rec["losses_match_uninterrupted"] and result["losses_identical"]
    assert result["lightrail_losses"] == result["losses"] and len(result["losses"]) == TINY.steps
    assert result["unsafe_reconfigurations"] == 0


@pytest.mark.slow
def test_a_rank_dying_with_no_spare_left_ends_in_one_line_exit_2(tmp_path):
    # two ranks (DP replicas, one per server) are enough to lose one: no spare, so the job cannot go on
    cmd = [sys.executable, "-m", "lightrail.cli", "train-demo", "--ranks", "2", "--tp", "1", "--pp", "1", "--dp", "2",
           "--steps", "3", "--spares", "0", "--kill-rank", "1", "--kill-at-step", "1", "--json", "--out",
           str(tmp_path / "out")]
    done = subprocess.run(cmd, capture_output=True, text=True, timeout=600)
    assert done.returncode == 2, done.stderr[-2000:]
    lines = [line for line in done.stderr.splitlines() if line.strip()]
    assert len(lines) == 1 and "rank 1 failed and no spare is left" in lines[0], done.stderr[-2000:]
    assert done.stdout == "" and not (tmp_path / "out").exists()


@pytest.mark.slow
def test_a_hung_rank_is_failed_by_its_heartbeats_and_replaced(tmp_path):
    """SIGSTOP: the process lives on, holding its sockets; the controller fails it when its heartbeats stop,
    a survivor tells the launcher, which kills it, and the job recovers as from a kill."""
    import functools

    from lightrail.runtime import torch_backend
    from lightrail.runtime.controller.process import register_job, start_controller
    from lightrail.studies.train_demo import run_demo, run_failover_demo

    layout = Layout.from_degrees(8, tp=2, pp=2, dp=2, gpus_per_server=2)
    operator = "operator-token-of-this-test-0123456789"
    proc, info = start_controller(tmp_path / "c.db", rails=2, ports=layout.servers + 1, ocs_delay=0.002,
                                  operator_token=operator)
    try:
        token = register_job(info["admin_port"], operator, "hung", 8, 1)
        config = BackendConfig(controller=f"127.0.0.1:{info['port']}", job="hung", layout=layout, token=token)
        run = run_failover_demo(TINY, spares=1, failure=Failure(3, 2, hang=True), backend="lightrail",
                                init=functools.partial(torch_backend.setup, config))
    finally:
        proc.kill()
        proc.wait(30)
    (rec,) = run.recoveries
    assert (rec.rank, rec.spare, rec.checkpoint_step, rec.steps_lost, rec.detected_by) == (3, 8, 1, 0, "controller")
    assert 0 <= rec.detect_s <= rec.first_step_s and "timeout" not in rec.woken_by
    assert run.main.losses_consistent and run.main.loss_bits == run_demo(TINY).main.loss_bits


def test_waiting_for_a_failover_no_process_announces_ends_in_one_line():
    """A rank whose op failed while no process died (a controller that stopped answering, say) waits for the
    launcher's notice; none comes, and the wait ends in a LightrailError naming it, not a bare store timeout
    (issue 31: the stall was reported as ``DistStoreError: wait timeout ... /notice/2``)."""
    from datetime import timedelta

    import torch.distributed as dist

    from lightrail.errors import InfeasibleError
    from lightrail.runtime.launch import Elastic, Notice

    store = dist.TCPStore("127.0.0.1", 0, is_master=True, wait_for_workers=False, timeout=timedelta(seconds=10))
    elastic = Elastic(store.port, 0, 2, 1, timeout_s=0.2)
    with pytest.raises(InfeasibleError, match=r"no process failed within 0.2 s \(no failover notice 1\)") as info:
        elastic.notice(1, timeout_s=0.2)
    assert info.value.field == "--spares"
    store.set("notice/1", '{"generation": 1, "rank": 3, "spare": 2, "t_detected": 0.0}')
    assert elastic.notice(1, timeout_s=0.2) == Notice(1, 3, 2, 0.0)


@pytest.mark.parametrize("taker", ["spare", "survivor"])
def test_a_failover_push_sets_its_news_before_the_rank_takes_it_in(taker):
    """The reader thread fails the requests a failover push makes moot (``interrupt``: the client's news) before
    it wakes ``Agent.failover``, which ends the news (``forget_holds``) and, in a spare, says hello as the rank it
    takes over. Woken first, the rank ended the news before it was set, and its next acquire failed with the old
    push (issue 31's intermittent stall: a spare then said bye as rank 3, releasing the ports its peers' new
    groups use). A slow interrupt stands in for the reader thread losing the CPU at that moment."""
    import threading
    import time as clock

    events = []

    class Client:
        rank = None

        def interrupt(self, error):
            clock.sleep(0.2)
            events.append("news")

        def forget_holds(self):
            events.append("forgotten")

        def hello(self, world, ports, spare=False):
            events.append("hello")

    agent = Agent(BackendConfig(layout=LAYOUT))
    agent.client = Client()
    agent.rank = None if taker == "spare" else 0
    push = {"op": "failover", "job": "j", "rank": 3, "spare": 8, "epoch": 1, "ports": {"rail1": 4}}
    reader = threading.Thread(target=agent._on_push, args=(push,))
    reader.start()
    marks = agent.failover(3, 8, spare_index=0, timeout_s=5)
    reader.join()
    assert events == (["news", "forgotten", "hello"] if taker == "spare" else ["news", "forgotten"])
    assert marks["epoch"] == 1 and agent.pending_failure() is None
    assert agent.moved == {("rail1", 1): 4}  # rank 3 (server 1, rail 1) now on the spare's port
