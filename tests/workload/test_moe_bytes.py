"""The MoE traffic formulas the fabric model owns (workload/moe_bytes.py) and the layer and the bench share."""

from __future__ import annotations

import pytest
from hypothesis import given
from hypothesis import strategies as st

from lightrail.errors import ScenarioError
from lightrail.workload import moe_bytes


def test_payload_keeps_the_local_share_home():
    # 1024 tokens, top-2, hidden 1024, fp32, 8 ranks: 7/8 of 2048 rows leave the rank
    assert moe_bytes.payload_bytes(1024, 2, 1024, 4, 8) == 2048 * 7 / 8 * 1024 * 4
    assert moe_bytes.payload_bytes(1024, 2, 1024, 4, 1) == 0
    assert moe_bytes.payload_bytes(1024, 2, 1024, 4, 8, imbalance=1.5) == \
        1.5 * moe_bytes.payload_bytes(1024, 2, 1024, 4, 8)


def test_padded_sends_every_remote_slot():
    # the contract's defaults: capacity = ceil(1.25 * 1024 * 2 / 64) = 40 slots; 56 remote experts per rank
    assert moe_bytes.capacity(1024, 2, 64, 1.25) == 40
    assert moe_bytes.padded_bytes(1024, 2, 1024, 4, 8, 64, 1.25) == 56 * 40 * 1024 * 4
    assert moe_bytes.capacity(64, 1, 8, 1.25) == 10  # 1.25 * 64 / 8 is exactly 10, not 11


@given(tokens=st.integers(1, 5000), topk=st.integers(1, 8), ep_pow=st.integers(1, 4), per=st.integers(1, 8),
       cf=st.floats(1.0, 4.0))
def test_padded_never_below_payload_at_capacity_factor_one_or_more(tokens, topk, ep_pow, per, cf):
    ep = 2**ep_pow
    experts = ep * per
    if topk > experts:
        return
    pad = moe_bytes.padded_bytes(tokens, topk, 16, 2, ep, experts, cf)
    assert pad >= moe_bytes.payload_bytes(tokens, topk, 16, 2, ep) - 1e-6
    assert moe_bytes.alltoall_buffer_bytes("padded", tokens, topk, 16, 2, ep, experts, capacity_factor=cf) \
        * (ep - 1) / ep == pytest.approx(pad)
    assert moe_bytes.alltoall_buffer_bytes("payload", tokens, topk, 16, 2, ep, experts) * (ep - 1) / ep \
        == pytest.approx(moe_bytes.payload_bytes(tokens, topk, 16, 2, ep))


@pytest.mark.parametrize(("call", "field"), [
    (lambda: moe_bytes.alltoall_buffer_bytes("dense", 1, 1, 1, 1, 2, 2), "moe_dispatch"),
    (lambda: moe_bytes.alltoall_buffer_bytes("payload", 1, 1, 1, 1, 2, 2, imbalance=0.5), "moe_imbalance"),
    (lambda: moe_bytes.capacity(10, 1, 4, 0), "capacity_factor"),
    (lambda: moe_bytes.padded_bytes(10, 1, 4, 2, 3, 8, 1.0), "ep"),
])
def test_bad_arguments_name_their_field(call, field):
    with pytest.raises(ScenarioError) as e:
        call()
    assert e.value.field == field
