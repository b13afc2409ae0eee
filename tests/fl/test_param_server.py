"""The parameter servers as real processes on loopback: a root and leaves (``python -m lightrail.fl.param_server``).
One download per leaf serves every client; FedAvg over results split across leaves and batches equals numpy's mean;
a leaf killed with SIGKILL after acknowledging results loses none (its replacement forwards them); bad requests are
refused with a JSON error naming the field while the servers stay up. Needs the extra ``service``."""

from __future__ import annotations

import json
import threading
import time
from concurrent.futures import ThreadPoolExecutor

import numpy as np
import pytest

httpx = pytest.importorskip("httpx")
pytest.importorskip("fastapi")
pytest.importorskip("uvicorn")

from lightrail.fl.param_server import start_param_server, stop_param_server  # noqa: E402

CLIENTS = 50


@pytest.fixture(scope="module")
def servers(tmp_path_factory):
    """A root and two leaves (A forwards every 10 results, B only when flushed); no flush timers."""
    logs = tmp_path_factory.mktemp("param-server-logs")
    started = []

    def start(role, root=None, state=None, args=(), name=None):
        log = open(logs / f"{name or role}-{len(started)}.log", "w")
        proc, port = start_param_server(role, root, state, args=list(args), stderr=log)
        started.append((proc, log))
        return proc, f"http://127.0.0.1:{port}"

    _, root = start("root")
    with ThreadPoolExecutor(2) as pool:
        a = pool.submit(start, "leaf", root, None, ["--flush-every", "10", "--flush-interval-ms", "0"], "leafA")
        b = pool.submit(start, "leaf", root, None, ["--flush-interval-ms", "0"], "leafB")
        (_, leaf_a), (_, leaf_b) = a.result(), b.result()
    with httpx.Client(timeout=20, limits=httpx.Limits(max_connections=64)) as http:
        yield {"root": root, "a": leaf_a, "b": leaf_b, "http": http, "start": start}
    for proc, log in started:
        if proc.poll() is None:
            assert stop_param_server(proc) == 0  # SIGTERM: a clean exit
        else:
            proc.stdout.close()
        log.close()


def _put(http, root, job, model, **kw):
    r = http.post(f"{root}/jobs/{job}/model", json={"model": np.asarray(model).tolist(), **kw})
    assert r.status_code == 200, r.text
    return r.json()


def _stats(http, url):
    return http.get(f"{url}/stats").json()


def _model(http, url, job, **params):
    body = http.get(f"{url}/jobs/{job}/model", params=params).json()
    return body["round"], np.asarray(body["model"], np.float32)


def _post_results(http, targets, job, round_, updates, *, samples=None, ids=None):
    """Client ``ids[i]`` (default ``c{i}``) posts ``updates[i]`` to ``targets[i]`` (all at once, one thread
    each); the replies."""
    barrier = threading.Barrier(len(updates))

    def one(i):
        barrier.wait()
        body = {"client_id": ids[i] if ids else f"c{i}", "round": round_, "update": updates[i].tolist()}
        if samples is not None:
            body["samples"] = int(samples[i])
        r = http.post(f"{targets[i]}/jobs/{job}/result", json=body)
        assert r.status_code == 200, r.text
        return r.json()

    with ThreadPoolExecutor(len(updates)) as pool:
        return list(pool.map(one, range(len(updates))))


def _fedavg(model, updates, weights=None):
    """The documented rule, in numpy: float32(float64(model) + weighted mean of the updates in float64)."""
    u = np.asarray(updates, np.float64)
    if weights is None:
        mean = u.mean(axis=0)
    else:
        mean = (np.asarray(weights, np.float64)[:, None] * u).sum(axis=0) / np.sum(weights)
    return (np.asarray(model, np.float64) + mean).astype(np.float32)


def _assert_model(got, want):
    np.testing.assert_allclose(got, want, rtol=1e-6, atol=1e-7)
    # float64 accumulation in another order: at most one float32 ulp apart
    assert np.max(np.abs(got.view(np.int32).astype(np.int64) - want.view(np.int32).astype(np.int64))) <= 1


def _wait_round(http, root, job, round_, timeout=10.0):
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        v = http.get(f"{root}/jobs/{job}/version").json()
        if v["round"] >= round_:
            return v
        time.sleep(0.05)
    raise AssertionError(f"{job} did not reach round {round_}: {v}")


def test_one_root_download_per_leaf_serves_every_client(servers):
    http, root, a, b = servers["http"], servers["root"], servers["a"], servers["b"]
    model = np.random.default_rng(1).standard_normal(1000).astype(np.float32)
    _put(http, root, "t1", model, expected=CLIENTS)
    leaf_before = {k: _stats(http, servers[k])["root_downloads"] for k in "ab"}
    targets = [b if i % 3 == 0 else a for i in range(CLIENTS)]  # 17 on B, 33 on A
    barrier = threading.Barrier(CLIENTS)

    def download(i):
        barrier.wait()
        r = http.get(f"{targets[i]}/jobs/t1/model")
        assert r.status_code == 200, r.text
        return r.content, r.headers["etag"]

    with ThreadPoolExecutor(CLIENTS) as pool:
        got = list(pool.map(download, range(CLIENTS)))
    assert _stats(http, root)["jobs"]["t1"]["model_downloads"] == 2  # one per leaf, for 50 clients
    assert {k: _stats(http, servers[k])["root_downloads"] - leaf_before[k] for k in "ab"} == {"a": 1, "b": 1}
    assert len({body for body, _ in got}) == 1 and len({etag for _, etag in got}) == 1
    direct = http.get(f"{root}/jobs/t1/model")
    assert got[0][0] == direct.content and got[0][1] == direct.headers["etag"]
    body = json.loads(got[0][0])
    assert body["round"] == 0 and np.array_equal(np.asarray(body["model"], np.float32), model)
    # later clients after the revalidation window: a conditional GET (304), still no second download
    time.sleep(0.25)
    assert http.get(f"{a}/jobs/t1/model").content == got[0][0]
    assert http.get(f"{a}/jobs/t1/model", headers={"If-None-Match": got[0][1]}).status_code == 304
    assert _stats(http, root)["jobs"]["t1"]["model_downloads"] == 3  # + the direct GET above, nothing else


def test_fedavg_over_uneven_leaves_and_batches_with_retries(servers):
    http, root, a, b = servers["http"], servers["root"], servers["a"], servers["b"]
    rng = np.random.default_rng(2)
    model = rng.standard_normal(257).astype(np.float32)
    updates = (rng.standard_normal((CLIENTS, 257)) * 0.01).astype(np.float32)
    _put(http, root, "t2", model, expected=CLIENTS)
    targets = [a if i < 37 else b for i in range(CLIENTS)]  # 37 on A (flushes every 10), 13 on B
    forwards_before = _stats(http, a)["forwards"]
    replies = _post_results(http, targets, "t2", 0, updates)
    assert not any(r["duplicate"] for r in replies)
    retries = _post_results(http, targets[:3] + targets[-3:], "t2", 0, np.concatenate([updates[:3], updates[-3:]]),
                            ids=["c0", "c1", "c2", "c47", "c48", "c49"])  # retried: counted once
    assert all(r["duplicate"] for r in retries)
    deadline = time.monotonic() + 10
    while http.get(f"{root}/jobs/t2/version").json()["pending"] < 10:  # A forwarded on its own (--flush-every)
        assert time.monotonic() < deadline, "leaf A did not forward after 10 results"
        time.sleep(0.02)
    assert _stats(http, root)["jobs"]["t2"]["round"] == 0  # B has not forwarded: the round stays open
    out_a = http.post(f"{a}/jobs/t2/flush").json()
    assert out_a["errors"] == [] and out_a["unforwarded"] == 0
    # a retry of a result A already forwarded is still recognised
    r = http.post(f"{a}/jobs/t2/result", json={"client_id": "c0", "round": 0, "update": updates[0].tolist()})
    assert r.status_code == 200 and r.json()["duplicate"] is True
    out_b = http.post(f"{b}/jobs/t2/flush").json()
    assert out_b["errors"] == [] and out_b["forwarded"] == 1
    v = _wait_round(http, root, "t2", 1)
    assert v["pending"] == 0
    st = _stats(http, root)["jobs"]["t2"]
    assert st["results_applied"] == CLIENTS and st["rounds_applied"] == 1
    assert st["aggregates_received"] == _stats(http, a)["forwards"] - forwards_before + 1  # A's batches + B's one
    round_, got = _model(http, root, "t2")
    assert round_ == 1
    _assert_model(got, _fedavg(model, updates))
    assert http.post(f"{a}/jobs/t2/flush").json()["forwarded"] == 0  # nothing left
    # round 1 through the leaves: B closed the round (its cache is stale at once); A may serve round 0 for up
    # to --revalidate-ms, unless the client names the round it expects
    downloads = {k: _stats(http, servers[k])["root_downloads"] for k in "ab"}
    for leaf, params in ((b, {}), (a, {"round": 1})):
        r2, m2 = _model(http, leaf, "t2", **params)
        assert r2 == 1 and np.array_equal(m2, got)
    assert {k: _stats(http, servers[k])["root_downloads"] - downloads[k] for k in "ab"} == {"a": 1, "b": 1}


def test_fedavg_weighted_by_samples(servers):
    http, root, a, b = servers["http"], servers["root"], servers["a"], servers["b"]
    rng = np.random.default_rng(3)
    model = rng.standard_normal(33).astype(np.float32)
    updates = rng.standard_normal((7, 33)).astype(np.float32)
    samples = rng.integers(1, 100, 7)
    _put(http, root, "t2w", model, expected=7, weighting="samples")
    _post_results(http, [a, b, a, b, b, b, a], "t2w", 0, updates, samples=samples)
    r = http.post(f"{a}/jobs/t2w/result", json={"client_id": "nos", "round": 0, "update": updates[0].tolist()})
    assert r.status_code == 422 and r.json()["field"] == "samples"
    for leaf in (a, b):
        assert http.post(f"{leaf}/jobs/t2w/flush").json()["errors"] == []
    _wait_round(http, root, "t2w", 1)
    _assert_model(_model(http, root, "t2w")[1], _fedavg(model, updates, samples))


def test_killed_leaf_loses_no_acknowledged_result(servers, tmp_path):
    http, root, b, start = servers["http"], servers["root"], servers["b"], servers["start"]
    rng = np.random.default_rng(4)
    model = rng.standard_normal(64).astype(np.float32)
    updates = rng.standard_normal((20, 64)).astype(np.float32)
    _put(http, root, "t3", model, expected=20)
    state = tmp_path / "leafC"
    proc, c = start("leaf", root, state, ["--flush-interval-ms", "0"], "leafC")
    leaf_id = _stats(http, c)["leaf"]
    targets = [c] * 12 + [b] * 8
    ids = [f"k{i}" for i in range(20)]
    _post_results(http, targets[:5], "t3", 0, updates[:5], ids=ids[:5])
    assert http.post(f"{c}/jobs/t3/flush").json()["forwarded"] == 1  # batch 0 reached the root
    replies = _post_results(http, targets[5:12], "t3", 0, updates[5:12], ids=ids[5:12])
    assert [r["duplicate"] for r in replies] == [False] * 7  # acknowledged, durable, not forwarded
    proc.kill()  # SIGKILL: acknowledged, never forwarded
    proc.wait()
    _post_results(http, targets[12:], "t3", 0, updates[12:], ids=ids[12:])
    assert http.post(f"{b}/jobs/t3/flush").json()["forwarded"] == 1
    assert _stats(http, root)["jobs"]["t3"]["round"] == 0
    _, c2 = start("leaf", root, state, ["--flush-interval-ms", "0"], "leafC2")  # the replacement
    _wait_round(http, root, "t3", 1)
    st = _stats(http, c2)
    assert st["leaf"] == leaf_id and st["forwards"] == 1
    assert st["recovered_results"] == 7
    job = _stats(http, root)["jobs"]["t3"]
    assert job["results_applied"] == 20 and job["rounds_applied"] == 1 and job["aggregates_received"] == 3
    _assert_model(_model(http, root, "t3")[1], _fedavg(model, updates))
    # a late retry to the replacement: the round has closed (409, field round), nothing counted twice
    r = http.post(f"{c2}/jobs/t3/result", json={"client_id": "k7", "round": 0, "update": updates[7].tolist()})
    assert r.status_code == 409 and r.json()["field"] == "round"
    # the root counts a batch forwarded twice (a leaf killed between forward and its record) once
    agg = {"round": 1, "leaf": "L", "batch": 0, "sum": [0.5] * 64, "weight": 1.0, "count": 1, "client_ids": ["x"]}
    first, again = (http.post(f"{root}/jobs/t3/aggregate", json=agg).json() for _ in range(2))
    assert first["duplicate"] is False and again["duplicate"] is True
    assert http.get(f"{root}/jobs/t3/version").json()["pending"] == 1


def test_bad_requests_are_refused_with_the_field_and_servers_stay_up(servers):
    http, root, a = servers["http"], servers["root"], servers["a"]
    _put(http, root, "t4", np.zeros(8, np.float32), expected=100)

    def refused(method, url, status, field, **kw):
        r = http.request(method, url, **kw)
        assert r.status_code == status, (url, r.status_code, r.text)
        err = r.json()
        assert err["field"] == field and err["message"], err
        return err

    good = {"client_id": "x", "round": 0, "update": [0.0] * 8}
    refused("POST", f"{a}/jobs/t4/result", 422, "update", json={**good, "update": [1.0] * 9})
    refused("POST", f"{a}/jobs/t4/result", 422, "update", json={**good, "update": "abc"})
    refused("POST", f"{a}/jobs/t4/result", 422, "update",
            content=b'{"client_id": "x", "round": 0, "update": [NaN, 0, 0, 0, 0, 0, 0, 0]}',
            headers={"content-type": "application/json"})
    refused("POST", f"{a}/jobs/t4/result", 422, "client_id", json={k: v for k, v in good.items() if k != "client_id"})
    refused("POST", f"{a}/jobs/t4/result", 422, "extra", json={**good, "extra": 1})
    refused("POST", f"{a}/jobs/t4/result", 422, "body", content=b'{"client_id": "x", "round": 0, "upd',
            headers={"content-type": "application/json"})
    refused("POST", f"{a}/jobs/t4/result", 409, "round", json={**good, "round": 3})
    refused("POST", f"{a}/jobs/nope/result", 404, "job", json=good)
    refused("GET", f"{a}/jobs/nope/model", 404, "job")
    refused("GET", f"{root}/jobs/nope/model", 404, "job")
    refused("GET", f"{root}/jobs/bad$name/model", 422, "job")
    refused("POST", f"{root}/jobs/t5/model", 422, "model", json={"model": []})
    refused("POST", f"{root}/jobs/t5/model", 422, "model", json={"model": [1.0, "x"]})
    refused("POST", f"{root}/jobs/t5/model", 422, "weighting", json={"model": [1.0], "weighting": "median"})
    refused("POST", f"{root}/jobs/t5/model", 422, "body", content=b"not json",
            headers={"content-type": "application/json"})
    agg = {"round": 0, "leaf": "L", "batch": 0, "sum": [0.0] * 7, "weight": 1.0, "count": 1}
    refused("POST", f"{root}/jobs/t4/aggregate", 422, "sum", json=agg)
    refused("POST", f"{root}/jobs/t4/aggregate", 422, "count", json={**agg, "sum": [0.0] * 8, "count": 0})
    refused("POST", f"{root}/jobs/t4/aggregate", 409, "round", json={**agg, "sum": [0.0] * 8, "round": 2})
    refused("POST", f"{root}/jobs/nope/aggregate", 404, "job", json=agg)
    refused("POST", f"{root}/jobs/t4/round", 422, "expected", json={"round": 0, "expected": 0})
    for url in (root, a, servers["b"]):
        assert http.get(f"{url}/healthz").json() == {"ok": True}
    assert http.post(f"{a}/jobs/t4/result", json=good).json()["duplicate"] is False  # still serving
    assert _stats(http, root)["jobs"]["t4"]["round"] == 0
