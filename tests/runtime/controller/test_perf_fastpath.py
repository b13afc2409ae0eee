"""The controller's hot path (issue 17 item 5: 1,024 ranks at full rate) changes cost, never behaviour: the
hand-written parse of heartbeat/acquire/prepare/release takes exactly the lines the pydantic models take, with
the same values (anything else goes to the models, whose errors stay the same); the byte-template replies are
the bytes ``encode`` writes; the cheap histograms expose what prometheus_client's Histogram would; the
skip-if-present shortcut in ``_changes`` agrees with the full computation; the Protocol's line framing answers
the same whatever the chunking. No timing is asserted (speed: benchmarks/bench_controller.py --ranks 1024)."""

from __future__ import annotations

import asyncio
import json
import random

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from lightrail.errors import LightrailError
from lightrail.runtime.controller.protocol import (
    _CANONICAL,
    _FAST,
    Acquire,
    Group,
    Heartbeat,
    Release,
    encode,
    encode_ok,
    fast_request,
    parse_request,
)

pytest.importorskip("prometheus_client")

_FIELDS = ("id", "op", "job", "rank", "key", "lease", "rejoin", "op_no", "world", "x")
_VALUES = st.one_of(
    st.sampled_from(["heartbeat", "acquire", "prepare", "release", "hello", "ack", "bye", "j", "", "p0", "\u00e9"]),
    st.integers(min_value=-(2 ** 64), max_value=2 ** 64), st.sampled_from([2 ** 63 - 1, -(2 ** 63), 2 ** 63]),
    st.booleans(), st.none(), st.floats(allow_nan=True, allow_infinity=True), st.text(max_size=6),
    st.lists(st.integers(0, 3), max_size=2), st.dictionaries(st.sampled_from(["a", "b"]), st.integers(0, 3),
                                                             max_size=1))


def _line(data: dict, compact: bool) -> bytes:
    return json.dumps(data, separators=(",", ":") if compact else None).encode()


@st.composite
def _requests(draw) -> bytes:
    """Mostly near-valid hot requests (the right fields, some with a wrong value, a missing or an extra one)."""
    op = draw(st.sampled_from(["heartbeat", "acquire", "prepare", "release"]))
    data = {"id": draw(st.integers(0, 10 ** 6)), "op": op}
    if op != "heartbeat":
        data |= {"job": draw(st.sampled_from(["j", "", "x\"y", "\\u00e9"])), "rank": draw(st.integers(-3, 9)),
                 "key": draw(st.sampled_from(["p0", "k", "a{b", "c]"]))}
        if op != "release" and draw(st.booleans()):
            data["lease"] = draw(st.booleans())
        if op != "release" and draw(st.booleans()):
            data["rejoin"] = draw(st.booleans())
        if op != "release" and draw(st.booleans()):
            data["op_no"] = draw(st.integers(-2, 2 ** 63))
    for _ in range(draw(st.integers(0, 2))):
        what = draw(st.sampled_from(["set", "drop"]))
        name = draw(st.sampled_from(_FIELDS))
        if what == "set":
            data[name] = draw(_VALUES)
        else:
            data.pop(name, None)
    return _line(data, draw(st.booleans()))


def _model_values(m) -> tuple:
    """Values with their types (``1 == True``, but a model's lease is a bool)."""
    values = (m.id, m.op, getattr(m, "job", None), getattr(m, "rank", None), getattr(m, "key", None),
              getattr(m, "lease", False), getattr(m, "rejoin", False), getattr(m, "op_no", None))
    return tuple((type(v), v) for v in values)


@settings(max_examples=600, deadline=None)
@given(line=st.one_of(_requests(), st.binary(max_size=40), st.just(b'{"op":"heartbeat"} ')))
def test_the_fast_parse_takes_only_what_the_models_take_with_the_same_values(line):
    """A line the fast path takes parses (with the models) to the same values; a line the models refuse is
    never taken by the fast path (so its error reply comes from the models, unchanged)."""
    fast = fast_request(line)
    try:
        model = parse_request(line)
    except LightrailError:
        assert fast is None
        return
    if fast is not None:
        assert _model_values(fast) == _model_values(model)
        assert type(model) in (Heartbeat, Acquire, Release)


_A = b'"op":"acquire","job":"j","rank":0,"key":"k"'
_NEAR_CANONICAL = [  # lines next to ControllerClient's own form (see test_lines_near_the_clients_form_...)
    b'{"id":01,"op":"acquire","job":"j","rank":0,"key":"k"}', b'{"id":1,"op":"acquire","job":"j","rank":-1,"key":"k"}',
    b'{"id":1,"op":"release","job":"j","rank":0,"key":"k","op_no":1}',
    b'{"id":1,"op":"release","job":"j","rank":0,"key":"k","lease":true}',
    b'{"id":1000000000000000000,"op":"acquire","job":"j","rank":0,"key":"k"}',
    b'{"id":1,"op":"acquire","job":"\\u00e9","rank":0,"key":"k"}', b'{"id":1,"op":"acquire","job":"\xc3\xa9","rank":0}',
]


@pytest.mark.parametrize("line", [
    b'{"id":9223372036854775808,' + _A + b"}", b'{"id":-9223372036854775809,' + _A + b"}",
    b'{"id":1,"op":"acquire","job":"j","rank":9223372036854775808,"key":"k"}', b"{" + _A + b"} x",
    b"{" + _A + b"}{}", b"{" + _A + b',"lease":1}', b"{" + _A + b',"lease":"true"}', b'{"id":"1",' + _A + b"}",
    b'{"id":1.0,' + _A + b"}", b'{"id":true,' + _A + b"}", b'{"op":"acquire","job":"j","rank":0,"key":"\\ud800"}',
    b'{"op":"acquire","job":1,"rank":0,"key":"k"}', b'{"op":"release","job":"j","rank":0,"key":"k","lease":false}',
    b'{"op":"heartbeat","id":NaN}', b"\xef\xbb\xbf{" + _A + b"}", b"{" + _A + b',"x":[1]}', *_NEAR_CANONICAL,
])
def test_edge_lines_get_the_models_answer(line):
    """Lines the models refuse or coerce (int64 bounds, trailing bytes, bool/str/float coercions, a lone
    surrogate, a BOM, extra fields): the fast path leaves every one to them."""
    fast = fast_request(line)
    try:
        model = parse_request(line)
    except LightrailError:
        assert fast is None
        return
    assert fast is None or _model_values(fast) == _model_values(model)


@pytest.mark.parametrize("data", [
    {"op": "heartbeat"}, {"id": 7, "op": "heartbeat"},
    {"id": 1, "op": "acquire", "job": "bench-many", "rank": 5, "key": "p4"},
    {"id": 2, "op": "prepare", "job": "j", "rank": 0, "key": "k", "lease": True},
    {"id": 3, "op": "acquire", "job": "j", "rank": 1, "key": "pp:2->4", "lease": True, "op_no": 17},
    {"id": 4, "op": "acquire", "job": "j", "rank": 1, "key": "k", "rejoin": True, "op_no": 2 ** 63 - 1},
    {"id": 2 ** 63 - 1, "op": "release", "job": "j", "rank": -(2 ** 63), "key": "k"},
])
def test_the_clients_requests_take_the_fast_path(data):
    """What ControllerClient and the benchmark send (compact JSON, and json.dumps's default spacing) is taken."""
    for compact in (True, False):
        fast = fast_request(_line(data, compact))
        assert fast is not None and _model_values(fast) == _model_values(parse_request(_line(data, compact)))


_PRINTABLE = st.text(alphabet=st.characters(min_codepoint=0x20, max_codepoint=0x7E), max_size=8)


@settings(max_examples=400, deadline=None)
@given(op=st.sampled_from(["acquire", "prepare", "release"]), rid=st.integers(0, 10 ** 18 - 1), job=_PRINTABLE,
       rank=st.integers(0, 10 ** 18 - 1), key=_PRINTABLE, lease=st.booleans(),
       op_no=st.one_of(st.none(), st.integers(0, 10 ** 18 - 1)))
def test_the_clients_own_lines_skip_the_json_scan_with_the_models_values(op, rid, job, rank, key, lease, op_no):
    """ControllerClient's acquire/prepare/release lines (compact, its field order) are matched whole by
    _CANONICAL unless a string needs an escape; either way the values are the models'."""
    data = {"id": rid, "op": op, "job": job, "rank": rank, "key": key}
    if op != "release":
        data |= ({"lease": True} if lease else {}) | ({} if op_no is None else {"op_no": op_no})
    line = json.dumps(data, separators=(",", ":")).encode()
    canonical = _CANONICAL.fullmatch(line) is not None
    assert canonical == ('"' not in job + key and "\\" not in job + key)
    fast = fast_request(line)
    assert fast is not None or not canonical  # a '[' or '{' in a string sends an escaped line to the models
    assert fast is None or _model_values(fast) == _model_values(parse_request(line))


@pytest.mark.parametrize("line", _NEAR_CANONICAL)
def test_lines_near_the_clients_form_are_left_to_the_json_path(line):
    """A leading zero, a negative rank, a release with acquire-only fields, 19 digits, an escape: _CANONICAL takes
    none of them (a release with lease or op_no matches and is still left to the models; the values of all of
    them are checked in test_edge_lines_get_the_models_answer)."""
    m = _CANONICAL.fullmatch(line)
    assert m is None or (m.group(2) == b"release" and fast_request(line) is None)


def test_the_fast_fields_are_the_models_fields():
    """_FAST's fields are the models' (a field added to a model and not to _FAST sends every line using it to
    the slow path: correct, but slow), and it requires what they require."""
    for op, model in (("heartbeat", Heartbeat), ("acquire", Acquire), ("prepare", Acquire), ("release", Release)):
        required, allowed = _FAST[op]
        assert allowed <= set(model.model_fields)  # a field only the model knows: its lines take the slow path
        assert required == {n for n, f in model.model_fields.items() if f.is_required()}


@given(rid=st.integers(-(2 ** 63), 2 ** 63 - 1),
       reply=st.one_of(st.just({}), st.just(None), st.just({"granted": True}), st.just({"granted": False}),
                       st.builds(lambda t: {"t": t}, st.floats(allow_nan=False, allow_infinity=False)),
                       st.builds(lambda n: {"granted": True, "lease": n}, st.integers(1, 10 ** 9)),
                       st.builds(lambda n: {"remaining": n}, st.integers(0, 9))))
def test_template_replies_are_the_bytes_encode_writes(rid, reply):
    assert encode_ok(rid, reply) == encode({"id": rid, "ok": True, **(reply or {})})


def test_cheap_histograms_expose_what_prometheus_histograms_would(make):
    """Same observations (including ones exactly on a bucket bound, and above the last) into a real
    prometheus_client Histogram and into the server's counters: identical exposition lines."""
    from prometheus_client import CollectorRegistry, Histogram, generate_latest

    from lightrail.runtime.controller.metrics import _LATENCY_BUCKETS, metrics_text
    from lightrail.runtime.controller.ranks import RankServer

    c, _ = make()
    server = RankServer(c, c.config)
    registry = CollectorRegistry()
    ref_req = Histogram("lightrail_request_duration_seconds", "x", ["op"], buckets=_LATENCY_BUCKETS,
                        registry=registry)
    ref_grant = Histogram("lightrail_acquire_to_grant_seconds", "x", buckets=_LATENCY_BUCKETS, registry=registry)
    rng = random.Random(17)
    values = [*_LATENCY_BUCKETS, 0.0, 100.0, *(rng.expovariate(300.0) for _ in range(500))]
    for i, v in enumerate(values):
        op = ("acquire", "release", "heartbeat")[i % 3]
        server.metrics.request(op, v)
        ref_req.labels(op=op).observe(v)
        server.metrics.granted(v)
        ref_grant.observe(v)

    def samples(text: str) -> dict[str, float]:
        out = {}
        for line in text.splitlines():
            if line.startswith(("lightrail_request_duration_seconds", "lightrail_acquire_to_grant_seconds")):
                name, value = line.rsplit(" ", 1)
                out[name] = float(value)
        return out

    ours, theirs = samples(metrics_text(c)), samples(generate_latest(registry).decode())
    assert len(theirs) == 4 * (len(_LATENCY_BUCKETS) + 3) and ours.keys() == theirs.keys()
    for name, value in theirs.items():
        assert ours[name] == pytest.approx(value, rel=1e-12), name


def _changes_reference(c, g) -> dict:
    """``Controller._changes`` as it was before the skip-if-present shortcut (the full computation)."""
    out = {}
    for device, circuits in g.circuits.items():
        driver = c.devices[device]
        state = driver.state()
        by_output = {o: i for i, o in state.items()}
        changes = {}
        for i, o in circuits.items():
            other = by_output.get(o)
            if other is not None and other != i and other not in circuits:
                changes[other] = None
            if state.get(i) != o:
                changes[i] = o
        if driver.duplex:
            for i in [i for i, o in changes.items() if o is None]:
                peer = state.get(i)
                if peer is not None and peer not in circuits:
                    changes[peer] = None
        if changes:
            out[device] = changes
    return out


@pytest.mark.parametrize("duplex", [False, True])
def test_skip_if_present_agrees_with_the_full_change_computation(make, duplex):
    """Random lit states and random groups: the shortcut in ``_changes`` gives what the full scan gives."""
    from lightrail.runtime.controller.config import ControllerConfig, DeviceConfig
    from lightrail.runtime.controller.core import GroupState

    rng = random.Random(5 + duplex)
    c, _ = make(ControllerConfig(devices=[DeviceConfig(name="rail0", ports=8, delay=0.0, duplex=duplex)]))
    driver = c.devices["rail0"]
    lit_groups = 0
    for _ in range(300):
        ports = list(range(8))
        rng.shuffle(ports)
        if duplex:
            pairs = [ports[k:k + 2] for k in range(0, rng.randrange(0, 9, 2), 2)]
            target = {a: b for a, b in pairs} | {b: a for a, b in pairs}
            want_pairs = [ports[k:k + 2] for k in range(0, rng.randrange(2, 9, 2), 2)]
            wanted = {a: b for a, b in want_pairs} | {b: a for a, b in want_pairs}
        else:
            outs = ports[:]
            rng.shuffle(outs)
            target = {i: o for i, o in zip(ports, outs, strict=True) if i != o and rng.random() < 0.7}
            k = rng.randrange(1, 4)
            wanted = {i: o for i, o in zip(ports[:k], outs[:k], strict=True) if i != o} or {0: 1}
            if rng.random() < 0.5:  # a group already lit: the shortcut's case
                wanted = dict(list(target.items())[:k]) or wanted
        driver.apply({i: target.get(i) for i in range(8) if driver.state().get(i) != target.get(i)}, 0.0)
        g = GroupState("j", "k", "dp", frozenset({0, 1}), {"rail0": wanted})
        got = c._changes(g)
        assert got == _changes_reference(c, g)
        lit_groups += not got
    assert lit_groups > 20  # the shortcut was exercised


def test_protocol_framing_answers_the_same_whatever_the_chunking(make, hello):
    """The same byte stream (hot requests, a slow-path one, an error, a blank line, an over-long line) fed
    whole, line by line and byte by byte: the same replies, the connection open after the over-long line."""
    from lightrail.runtime.controller.ranks import RankServer

    class Transport:
        def __init__(self):
            self.out, self.closed = bytearray(), False

        def write(self, data: bytes) -> None:
            self.out += data

        def is_closing(self) -> bool:
            return self.closed

        def close(self) -> None:
            self.closed = True

        def get_extra_info(self, name: str, default=None):
            return ("127.0.0.1", 5) if name == "peername" else default

    stream = b"".join([
        b'{"id":1,"op":"heartbeat"}\n', b'{"id":2,"op":"release","job":"j","rank":0,"key":"nope"}\n', b"\n",
        b'{"id":3, "op": "release", "job": "j", "rank": 1, "key": "nope"}\n',  # another rank: refused
        b'{"id":4,"op":"acquire","job":"j","rank":0,"key":"g","lease":0}\n',  # lease 0: the models' path
        b'{"id":5,"op":"acquire","job":"j","rank":0,"key":"g"}\n', b"x" * 1100 + b"\n",
        b'{"id":6,"op":"hold"}\n', b'{"id":7,"op":"release","job":"j","rank":0,"key":"g"}\n'])

    def run(chunks: list[bytes]) -> list[dict]:
        async def go():
            c, vt = make()
            c.clock = lambda: 1.5  # the heartbeat's reply is the same in every run
            c.config = c.config.model_copy(update={"max_line": 1024})
            hello(c, "j", 0, 2, rail0=0)
            hello(c, "j", 1, 2, rail0=1)
            c.declare(Group(op="group", job="j", key="g", members=[0], circuits={"rail0": {}}))
            server = RankServer(c, c.config, clock=lambda: 0.0)
            proto = server.protocol()
            t = Transport()
            proto.connection_made(t)
            proto.conn.bound = ("j", 0)
            for chunk in chunks:
                proto.data_received(chunk)
                await asyncio.sleep(0)
            await asyncio.sleep(0)
            assert not t.closed and proto.conn in server.open
            proto.connection_lost(None)
            assert proto.conn is None and not server.open
            return [json.loads(x) for x in bytes(t.out).splitlines()]

        return asyncio.run(go())

    whole = run([stream])
    assert [r.get("id") for r in whole] == [1, 2, 3, 4, 5, 0, 6, 7]
    assert [r["ok"] for r in whole] == [True, False, False, True, True, False, False, True]
    assert whole[2]["error"]["field"] == "rank" and "over 1024 bytes" in whole[5]["error"]["message"]
    assert whole[3] == {"id": 4, "ok": True, "granted": True} and whole[0]["t"] == 1.5
    assert run(stream.splitlines(keepends=True)) == whole
    assert run([stream[i:i + 1] for i in range(len(stream))]) == whole
    assert run([stream[i:i + 37] for i in range(0, len(stream), 37)]) == whole


def _pair_server(make, hello):
    """A controller with ranks 0 and 1 of job "j" in group "g" (no circuits), its RankServer, and a bound Conn
    per rank whose writes are decoded into ``replies[rank]``."""
    import lightrail.runtime.controller.ranks as ranks_mod

    c, _ = make()
    hello(c, "j", 0, 2, rail0=0)
    hello(c, "j", 1, 2, rail0=1)
    c.declare(Group(op="group", job="j", key="g", members=[0, 1], circuits={"rail0": {}}))
    server = ranks_mod.RankServer(c, c.config)
    replies: dict[int, list[dict]] = {0: [], 1: []}
    conns = [ranks_mod.Conn(type("W", (), {"write": lambda self, d, r=r: replies[r].append(json.loads(d)),
                                            "is_closing": lambda self: False})(), f"p{r}", 0.0, 0.0, bound=("j", r))
             for r in (0, 1)]
    return c, server, conns, replies


def test_the_hot_ops_never_build_a_model(make, hello, monkeypatch):
    """Heartbeat, acquire and release from a bound connection are answered without the pydantic parse."""
    import lightrail.runtime.controller.ranks as ranks_mod

    calls = []
    real = ranks_mod.parse_request
    monkeypatch.setattr(ranks_mod, "parse_request", lambda *a, **k: calls.append(a) or real(*a, **k))

    async def go():
        c, server, conns, replies = _pair_server(make, hello)
        for r, conn in enumerate(conns):
            server.request(conn, b'{"id":1,"op":"heartbeat"}')
            server.request(conn, b'{"id":2,"op":"acquire","job":"j","rank":%d,"key":"g"}' % r)
        await asyncio.sleep(0)
        return c, replies

    c, replies = asyncio.run(go())
    assert calls == []
    assert [r["id"] for r in replies[0]] == [1, 2] and replies[1][-1] == {"id": 2, "ok": True, "granted": True}
    assert replies[0][-1] == {"id": 2, "ok": True, "granted": True} and c.counters["grants"] == 1


def test_a_waiting_members_grant_is_written_by_the_request_that_completes_the_group(make, hello):
    """Rank 0 waits; rank 1's acquire grants both, and rank 0's reply is written inside that very request (no
    loop turn: at 1,024 ranks a turn is a thousand other requests). A failure still reaches the waiter as a
    done callback, one turn later: a ``hold``'s reply goes out before the error of the acquire it supersedes."""
    from lightrail.runtime.controller.core import Waiter

    async def go():
        c, server, conns, replies = _pair_server(make, hello)
        server.request(conns[0], b'{"id":7,"op":"acquire","job":"j","rank":0,"key":"g"}')
        assert replies[0] == [] and isinstance(c.groups[("j", "g")].waiters[0][0], Waiter)
        server.request(conns[1], b'{"id":8,"op":"acquire","job":"j","rank":1,"key":"g"}')
        granted_in_request = list(replies[0])  # before any loop turn
        server.request(conns[0], b'{"id":9,"op":"release","job":"j","rank":0,"key":"g"}')
        server.request(conns[1], b'{"id":10,"op":"release","job":"j","rank":1,"key":"g"}')
        # a failure: rank 0 waits again, then its own later acquire supersedes the wait
        server.request(conns[0], b'{"id":11,"op":"acquire","job":"j","rank":0,"key":"g"}')
        fut = c.groups[("j", "g")].waiters[0][0]
        fut.set_exception(LightrailError("gone", field="key"))
        failed_in_call = list(replies[0][3:])
        await asyncio.sleep(0)
        return granted_in_request, failed_in_call, replies

    granted_in_request, failed_in_call, replies = asyncio.run(go())
    assert granted_in_request == [{"id": 7, "ok": True, "granted": True}]
    assert replies[1][0] == {"id": 8, "ok": True, "granted": True}
    assert failed_in_call == []  # not written inside set_exception
    assert replies[0][-1]["id"] == 11 and replies[0][-1]["ok"] is False
    assert replies[0][-1]["error"]["message"] == "gone"


def _traced(h) -> list:
    """Every grant (when, which group, to whom, per op or lease) and every switch change of ``h``'s controller."""
    trace, c = [], h.c
    inner = c._grant

    def grant(g):
        trace.append(("grant", h.vt.clock(), g.job, g.key, tuple(sorted(g.acquirers)), tuple(sorted(g.lease_asks))))
        inner(g)
    c._grant = grant
    for name, driver in c.devices.items():
        def apply(changes, now, _inner=driver.apply, _name=name):
            trace.append(("switch", now, _name, tuple(sorted(changes.items(), key=str))))
            return _inner(changes, now)
        driver.apply = apply
    return trace


@pytest.mark.parametrize("kind", ["per-op", "per-op-prepare", "per-op-reuse", "lease"])
def test_granting_at_once_changes_no_grant_and_no_switch(kind, Harness, LeaseHarness, monkeypatch):
    """``_grant_at_once`` (an acquire that completes the only ready group, lit and settled, grants it without the
    scheduler's pass) is the scheduler's own decision: the randomized programs of the safety tests give the same
    grants, in the same order at the same times, and the same switch changes, with it and without it."""
    from lightrail.runtime.controller.core import Controller

    def run(seed):
        if kind == "lease":
            h = LeaseHarness(seed, bursty=seed % 2 == 0, prepare=0.3)
        else:
            h = Harness(seed, bursty=seed % 2 == 0, prepare=0.3 if kind == "per-op-prepare" else 0.0,
                        reuse_when_left=kind != "per-op-reuse")
        trace = _traced(h)
        asyncio.run(h.run())
        counters = {k: v for k, v in h.c.counters.items()}
        return trace, counters

    real, granted = Controller._grant_at_once, []
    for seed in range(30):
        monkeypatch.setattr(Controller, "_grant_at_once", lambda self, g: real(self, g) and not granted.append(g))
        fast_trace, fast_counters = run(seed)
        monkeypatch.setattr(Controller, "_grant_at_once", lambda self, g: False)
        slow_trace, slow_counters = run(seed)
        assert fast_trace == slow_trace, seed
        assert fast_counters == slow_counters, seed
    assert len(granted) > 100  # not vacuous: the shortcut granted, often
