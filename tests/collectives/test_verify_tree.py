"""The verifier's fast paths: the tree proof (``verify_tree``, a linear-memory proof of reduce-up, copy-down
AllReduce) is sound against the bitset verifier (the reference semantics) on tree schedules and broken ones, and
the interval verifier's scalar run (tiny steps) gives the array run's verdict, fault and all."""

from __future__ import annotations

import importlib

import pytest
from hypothesis import event, given, settings
from hypothesis import strategies as st
from tests.collectives.test_verify import mutated_schedules, outcome, random_schedules, rebuild, transfers

from lightrail.collectives import Combine, generate, verify
from lightrail.collectives.verify import _NotAnInterval, _NotATree, verify_bitset, verify_interval, verify_tree
from lightrail.errors import VerificationError

verify_module = importlib.import_module("lightrail.collectives.verify")


@pytest.mark.parametrize("pipeline", [1, 2, 3])
def test_double_binary_tree_is_proven_as_trees_for_every_n(pipeline):
    for n in range(2, 257):
        schedule = generate("allreduce", "double-binary-tree", n, pipeline=pipeline)
        assert verify_tree(schedule).method == "tree", n
    for n in (2, 3, 17, 64):  # and the reference agrees
        assert verify_bitset(generate("allreduce", "double-binary-tree", n, pipeline=pipeline)).method == "bitset"


@pytest.mark.parametrize("name", ["ring", "halving-doubling"])
def test_chains_stars_and_binomial_trees_are_trees_too(name):
    """Per chunk, ring AllReduce reduces along a chain and copies back along it, and
    halving-doubling along a binomial tree: the same proof applies, and the reference agrees."""
    for n in (2, 3, 8, 12, 16):
        schedule = generate("allreduce", name, n)
        assert verify_tree(schedule).method == "tree" and verify_bitset(schedule).method == "bitset"


@pytest.mark.parametrize(("kind", "name"), [("allreduce", "recursive-doubling"), ("broadcast", "binomial-tree"),
                                            ("reduce", "binomial-tree"), ("allgather", "ring")])
def test_other_shapes_are_declined(kind, name):
    with pytest.raises(_NotATree):
        verify_tree(generate(kind, name, 8))


def test_verify_uses_the_tree_proof_only_where_bitsets_grow_large(monkeypatch):
    small = generate("allreduce", "double-binary-tree", 64)
    assert verify(small).method == "bitset"  # unchanged below TREE_ABOVE
    monkeypatch.setattr(verify_module, "TREE_ABOVE", 0)
    assert verify(small).method == "tree"
    broken = rebuild(small, transfers(small)[:-1])  # the last broadcast step lost: the tree proof declines
    with pytest.raises(VerificationError):
        verify(broken)
    assert verify(generate("allreduce", "double-binary-tree", 8192 * 2)).method == "tree"


def _edit(draw, steps, n, nchunks):
    mutation = draw(st.sampled_from(["drop", "duplicate", "flip op", "retarget", "rechunk", "resource", "move",
                                     "swap steps", "merge steps"]))
    event(mutation)
    s = draw(st.integers(0, len(steps) - 1))
    i = draw(st.integers(0, len(steps[s]) - 1))
    src, dst, chunk, op = steps[s][i]
    if mutation == "drop":
        steps[s].pop(i)
    elif mutation == "duplicate":
        steps[draw(st.integers(0, len(steps) - 1))].append(steps[s][i])
    elif mutation == "flip op":
        steps[s][i] = (src, dst, chunk, Combine(1 - op))
    elif mutation == "retarget":
        steps[s][i] = (src, (src + draw(st.integers(1, n - 1))) % n, chunk, op)
    elif mutation == "rechunk":
        steps[s][i] = (src, dst, draw(st.integers(0, nchunks - 1)), op)
    elif mutation == "resource":
        steps[s][i] = ((dst + draw(st.integers(1, n - 1))) % n, dst, chunk, op)
    elif mutation == "move":
        steps[draw(st.integers(0, len(steps) - 1))].append(steps[s].pop(i))
    elif mutation == "swap steps":
        t = draw(st.integers(0, len(steps) - 1))
        steps[s], steps[t] = steps[t], steps[s]
    elif mutation == "merge steps" and s + 1 < len(steps):
        steps[s] += steps.pop(s + 1)


@st.composite
def edited_trees(draw):
    """A double binary tree schedule with one to three random edits."""
    n = draw(st.integers(2, 12))
    schedule = generate("allreduce", "double-binary-tree", n, pipeline=draw(st.integers(1, 3)))
    steps = transfers(schedule)
    for _ in range(draw(st.integers(1, 3))):
        if any(steps):
            steps = [s for s in steps if s] or [[]]
            _edit(draw, steps, n, schedule.nchunks)
    while steps and not steps[-1]:
        steps.pop()
    return rebuild(schedule, steps)


@settings(max_examples=600, deadline=None)
@given(edited_trees())
def test_the_tree_proof_is_sound(schedule):
    """Whatever the tree proof accepts, the bitset verifier proves too (it may decline what is correct)."""
    try:
        verify_tree(schedule)
    except _NotATree:
        event("declined")
        return
    event("proven as trees")
    assert verify_bitset(schedule).method == "bitset"


def _interval_outcome(schedule, monkeypatch, per_step):
    monkeypatch.setattr(verify_module, "_SCALAR_PER_STEP", per_step)
    try:
        return outcome(verify_interval, schedule)
    except _NotAnInterval:
        return ("not an interval",)


@settings(max_examples=300, deadline=None)
@given(st.one_of(random_schedules(), mutated_schedules(), edited_trees()))
def test_the_scalar_interval_run_equals_the_array_run(schedule):
    with pytest.MonkeyPatch.context() as m:
        scalar = _interval_outcome(schedule, m, 10**9)
        arrays = _interval_outcome(schedule, m, -1)
    event(scalar[0])
    assert scalar == arrays


def test_a_ring_block_zero_takes_the_scalar_run(monkeypatch):
    calls = []
    monkeypatch.setattr(verify_module, "_interval_scalar",
                        lambda *a, _f=verify_module._interval_scalar: calls.append(1) or _f(*a))
    assert verify(generate("allreduce", "ring", 64)).method == "interval+rotation" and calls
