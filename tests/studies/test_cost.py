"""Rail fabric cost (studies/cost.py) against counts worked out by hand, plus invariants.

Defaults (DESIGN.md): 400G transceiver 10 W / $879, 800G 16 W / $879, 64-port 400G EPS 2524 W /
$37,299, 144-port 800G EPS 7000 W / $149,939, OCS port 75/192 W / $520 on 192-port devices.
With ``h = k/2``, a 2-tier rail of S NICs has ``L = ceil(S/h)`` leaves, ``u = ceil(S/L)`` uplinks
per leaf and ``ceil(u / floor(k/L))`` spines; the photonic 2-level rail is the same with ``k = 192``.
"""

from __future__ import annotations

import dataclasses
import math
import re

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from lightrail.errors import InfeasibleError, ScenarioError
from lightrail.fabric.costs import CostFacts
from lightrail.studies.cost import compare, cost_sweep, rail_fabric_cost

GPUS = [256, 512, 1024, 2048, 4096, 8192, 16384]
OCS_W = 75 / 192
COUNTS = ("rails", "servers", "tiers", "switches", "switch_ports", "ocs_ports", "links", "transceivers")


def el(n: int, **kw):
    return rail_fabric_cost(n, kind="electrical", **kw)


def ph(n: int, **kw):
    return rail_fabric_cost(n, kind="photonic", **kw)


def approx(x):
    return pytest.approx(x, rel=1e-12)


# ---------------------------------------------------------------- electrical, hand-computed


def test_256_gpus_each_rail_is_one_64_port_switch():
    c = el(256)  # 32 servers <= 64 ports
    assert (c.rails, c.servers, c.tiers, c.switches, c.switch_ports) == (8, 32, 1, 8, 512)
    assert (c.links, c.transceivers) == (256, 512)  # NIC cables only, a transceiver at each end
    assert c.power_w == approx(8 * 2524 + 512 * 10)
    assert c.capex_usd == approx(8 * 37_299 + 512 * 879)


def test_1024_gpus_two_tiers_with_exact_switch_count():
    c = el(1024)  # S = 128 > 64: L = 4 leaves of 32 NICs, u = 32, 16 planes per spine -> 2 spines
    assert (c.servers, c.tiers, c.switches, c.switch_ports) == (128, 2, 8 * 6, 8 * 6 * 64)
    assert c.links == 8 * (128 + 4 * 32)
    assert c.transceivers == 4 * 1024
    assert c.power_w == approx(48 * 2524 + 4096 * 10)
    assert c.capex_usd == approx(48 * 37_299 + 4096 * 879)


def test_16384_gpus_is_the_largest_two_tier_rail():
    c = el(16384)  # S = 2048 = 64^2 / 2: the textbook k leaves + k/2 spines
    assert (c.servers, c.tiers, c.switches) == (2048, 2, 8 * (64 + 32))
    assert (c.links, c.transceivers) == (8 * 2 * 2048, 8 * 4 * 2048)


def test_one_more_server_needs_three_tiers():
    c = el(2049 * 8)
    # P = 3 pods, 683 NICs in the fullest, E = 22 edges and u = 32 aggregations per pod,
    # core planes 32 * 22 = 704 of 3 ports, 21 per switch -> 34 cores; 66 + 96 + 34 = 196 per rail
    assert (c.tiers, c.switches) == (3, 8 * 196)
    assert c.links == 8 * (2049 + 2 * 3 * 22 * 32)


@pytest.mark.parametrize("k", [4, 8, 64])
def test_full_fat_trees_have_textbook_counts(k):
    facts = CostFacts(eps_radix_400g=k)
    for servers, tiers, switches in ((k, 1, 1), (k * k // 2, 2, 3 * k // 2), (k**3 // 4, 3, 5 * k * k // 4)):
        c = rail_fabric_cost(servers, gpus_per_server=1, facts=facts)
        assert (c.tiers, c.switches, c.links) == (tiers, switches, tiers * servers)


def test_small_radix_partial_sizes():
    facts = CostFacts(eps_radix_400g=4)
    # S = 5: L = 3 leaves, u = 2, 1 plane per spine -> 2 spines; links 5 + 3*2
    c = rail_fabric_cost(5, gpus_per_server=1, facts=facts)
    assert (c.tiers, c.switches, c.links) == (2, 5, 11)
    # S = 9: 3 pods of <= 3 NICs, E = 2 edges, u = 2 aggs per pod, 4 core planes of 3 ports -> 4 cores
    c = rail_fabric_cost(9, gpus_per_server=1, facts=facts)
    assert (c.tiers, c.switches, c.links) == (3, 3 * 4 + 4, 9 + 2 * 3 * 2 * 2)


def test_800g_uses_144_port_switches():
    c = el(1024, rail_speed="800G")  # S = 128 <= 144
    assert (c.tiers, c.switches, c.switch_ports) == (1, 8, 8 * 144)
    assert c.power_w == approx(8 * 7000 + 2048 * 16)
    c = el(16384, rail_speed="800G")  # S = 2048: L = 29, u = 71, 4 planes per spine -> 18 spines
    assert (c.tiers, c.switches) == (2, 8 * 47)
    assert c.links == 8 * (2048 + 29 * 71)


def test_switch_power_including_optics_drops_switch_end_transceivers_only():
    base = el(4096, rail_speed="800G")
    incl = el(4096, rail_speed="800G", facts=CostFacts(switch_power_includes_optics=True))
    switch_end = base.transceivers - 4096
    assert base.power_w - incl.power_w == approx(switch_end * 16)
    assert incl.capex_usd == approx(base.capex_usd)
    assert incl.breakdown["power_w"]["switch_transceivers"] == 0


# ---------------------------------------------------------------- photonic, hand-computed


def test_256_gpus_photonic_one_ocs_per_rail():
    c = ph(256)
    assert (c.tiers, c.switches, c.switch_ports, c.ocs_ports, c.links, c.transceivers) == (1, 8, 0, 256, 256, 256)
    assert c.power_w == approx(256 * OCS_W + 256 * 10)  # 100 W of OCS, 2560 W of NIC transceivers
    assert c.capex_usd == approx(256 * 520 + 256 * 879)


def test_photonic_rail_fills_one_device_then_becomes_a_folded_clos():
    c = ph(192 * 8)
    assert (c.tiers, c.switches, c.ocs_ports) == (1, 8, 192 * 8)
    c = ph(193 * 8)  # L = 3 edges, u = 65, 64 planes per middle -> 2 middles; ports 193 + 2*3*65
    assert (c.tiers, c.switches, c.ocs_ports, c.transceivers) == (2, 8 * 5, 8 * 583, 193 * 8)
    c = ph(16384)  # L = 22, u = 94, 8 planes per middle -> 12; ports 2048 + 2*22*94
    assert (c.tiers, c.switches, c.ocs_ports, c.links) == (2, 8 * 34, 8 * 6184, 8 * (2048 + 22 * 94))


def test_two_ports_per_link_halves_the_device_and_doubles_the_ports():
    facts = CostFacts(ocs_ports_per_link=2)
    c = ph(256, facts=facts)  # 96 links per device, 32 servers: still one device per rail
    assert (c.tiers, c.ocs_ports) == (1, 512)
    assert c.power_w == approx(512 * OCS_W + 2560)
    assert ph(97 * 8, facts=facts).tiers == 2


def test_photonic_rail_too_big_is_infeasible():
    with pytest.raises(InfeasibleError, match=r"costs\.ocs_max_tiers") as err:
        ph(193 * 8, facts=CostFacts(ocs_max_tiers=1))
    assert "one OCS device" in str(err.value)
    facts = CostFacts(ocs_radix=4)  # 2 NICs per edge device, at most 4 edges: 8 servers
    c = ph(8, gpus_per_server=1, facts=facts)  # L = 4, u = 2, 1 plane per middle -> 2 middles
    assert (c.tiers, c.switches, c.ocs_ports) == (2, 6, 8 + 2 * 4 * 2)
    with pytest.raises(InfeasibleError, match=r"cluster\.gpus.*folded Clos"):
        ph(9, gpus_per_server=1, facts=facts)


def test_ocs_part_does_not_depend_on_rail_speed():
    a, b = ph(4096), ph(4096, rail_speed="800G")
    assert (a.switches, a.ocs_ports) == (b.switches, b.ocs_ports)
    assert a.breakdown["capex_usd"]["ocs"] == b.breakdown["capex_usd"]["ocs"]
    assert b.power_w - a.power_w == approx(4096 * (16 - 10))


# ---------------------------------------------------------------- accounting rules


@pytest.mark.parametrize("speed", ["400G", "800G"])
@pytest.mark.parametrize("n", [16, 256, 1024, 4096, 16392])
def test_transceivers_and_breakdown(n, speed):
    e, p = el(n, rail_speed=speed), ph(n, rail_speed=speed)
    assert e.transceivers == 2 * e.links  # one at each end of every cable
    assert p.transceivers == n  # OCS is transparent: only the NICs'
    for c in (e, p):
        assert set(c.breakdown) == {"power_w", "capex_usd"}
        assert set(c.breakdown["power_w"]) == set(c.breakdown["capex_usd"]) == {
            "eps", "ocs", "nic_transceivers", "switch_transceivers"}
        assert sum(c.breakdown["power_w"].values()) == approx(c.power_w)
        assert sum(c.breakdown["capex_usd"].values()) == approx(c.capex_usd)
    t_w, t_usd = (10, 879) if speed == "400G" else (16, 879)
    without = compare(n, rail_speed=speed, include_nic_transceivers=False)
    assert without.electrical.transceivers == e.transceivers - n and without.photonic.transceivers == 0
    assert e.power_w - without.electrical.power_w == approx(n * t_w)
    assert p.capex_usd - without.photonic.capex_usd == approx(n * t_usd)


def test_results_are_frozen_and_facts_keyword_only():
    c = el(256)
    with pytest.raises(dataclasses.FrozenInstanceError):
        c.power_w = 0.0
    with pytest.raises(TypeError):
        CostFacts(10.0)


def test_cost_sweep_rows_are_the_comparisons_in_order():
    sweep = cost_sweep([1024, 256], gpus_per_server=8, rail_speed="800Gbps")
    assert [r["gpus"] for r in sweep.rows()] == [1024, 256]
    for row, n in zip(sweep.rows(), (1024, 256), strict=True):
        c = compare(n, rail_speed="800G")
        assert row == {"gpus": n, "electrical_power_w": c.electrical.power_w, "photonic_power_w": c.photonic.power_w,
                       "electrical_capex_usd": c.electrical.capex_usd, "photonic_capex_usd": c.photonic.capex_usd,
                       "electrical_tiers": c.electrical.tiers, "electrical_switches": c.electrical.switches,
                       "ocs_ports": c.photonic.ocs_ports, "power_ratio": c.power_ratio, "cost_ratio": c.cost_ratio}
    assert sweep.to_dict() == {"rail_speed": "800Gbps", "rows": sweep.rows()}  # the speed as the caller wrote it
    with pytest.raises(dataclasses.FrozenInstanceError):
        sweep.rail_speed = "400G"


def _ratio_id(n: int, speed: str) -> str:
    try:
        r = compare(n, rail_speed=speed)
        return f"{speed}-N={n}-power{r.power_ratio:.2f}x-cost{r.cost_ratio:.2f}x"
    except Exception as exc:  # noqa: BLE001 - an id must not break collection; the test reports it
        return f"{speed}-N={n}-{type(exc).__name__}"


@pytest.mark.parametrize("n,speed", [pytest.param(n, s, id=_ratio_id(n, s)) for s in ("400G", "800G") for n in GPUS])
def test_ratio_table(n, speed):
    """The ratios the report quotes (shown in the test ids with ``-v``)."""
    r = compare(n, rail_speed=speed)
    assert r.power_ratio == r.electrical.power_w / r.photonic.power_w
    assert r.cost_ratio == r.electrical.capex_usd / r.photonic.capex_usd
    assert r.power_ratio > 1 and r.cost_ratio > 1


def test_ratios_at_hand_computed_points():
    # 1024 GPUs, 400G: per rail 6 EPS + 512 transceivers against 128 OCS ports + 128 transceivers
    r = compare(1024)
    assert r.power_ratio == approx((6 * 2524 + 512 * 10) / (128 * OCS_W + 128 * 10))
    assert r.cost_ratio == approx((6 * 37_299 + 512 * 879) / (128 * 520 + 128 * 879))
    # 16384 GPUs, 400G: 96 EPS + 8192 transceivers against 6184 OCS ports + 2048 transceivers per rail
    r = compare(16384)
    assert r.power_ratio == approx((96 * 2524 + 8192 * 10) / (6184 * OCS_W + 2048 * 10))
    assert r.cost_ratio == approx((96 * 37_299 + 8192 * 879) / (6184 * 520 + 2048 * 879))


# ---------------------------------------------------------------- invariants


def _counts(c):
    return tuple(getattr(c, f) for f in COUNTS)


@settings(max_examples=150, deadline=None)
@given(servers=st.integers(2, 18_432), g=st.integers(1, 16), speed=st.sampled_from(["400G", "800G"]),
       kind=st.sampled_from(["electrical", "photonic"]))
def test_rails_scale_linearly(servers, g, speed, kind):
    one = rail_fabric_cost(servers, gpus_per_server=1, rail_speed=speed, kind=kind)
    many = rail_fabric_cost(servers * g, gpus_per_server=g, rail_speed=speed, kind=kind)
    assert (many.rails, many.servers, many.tiers) == (g, servers, one.tiers)
    assert _counts(many)[3:] == tuple(g * x for x in _counts(one)[3:])
    assert many.power_w == pytest.approx(g * one.power_w) and many.capex_usd == pytest.approx(g * one.capex_usd)


@settings(max_examples=300, deadline=None)
@given(a=st.integers(2, 18_432), b=st.integers(2, 18_432), speed=st.sampled_from(["400G", "800G"]),
       kind=st.sampled_from(["electrical", "photonic"]))
def test_more_gpus_never_cost_less(a, b, speed, kind):
    lo, hi = sorted((a, b))
    x = rail_fabric_cost(lo * 8, rail_speed=speed, kind=kind)
    y = rail_fabric_cost(hi * 8, rail_speed=speed, kind=kind)
    assert all(u <= v for u, v in zip(_counts(x), _counts(y), strict=True))
    assert x.power_w <= y.power_w and x.capex_usd <= y.capex_usd


@pytest.mark.parametrize("speed,k", [("400G", 64), ("800G", 144)])
def test_every_size_fits_its_ports_and_grows_monotonically(speed, k):
    prev = None
    for s in range(2, k * k // 2 + 200):
        c = rail_fabric_cost(s, gpus_per_server=1, rail_speed=speed)
        assert 2 * c.links - s <= c.switch_ports  # used switch ports (all cable ends but the NICs')
        assert c.links >= c.tiers * s  # non-blocking: every level carries at least one link per NIC
        assert c.tiers == 1 + (s > k) + (s > k * k // 2)
        if prev is not None:
            assert all(u <= v for u, v in zip(_counts(prev), _counts(c), strict=True))
        prev = c


@settings(max_examples=200, deadline=None)
@given(servers=st.integers(2, 18_432), speed=st.sampled_from(["400G", "800G"]))
def test_photonic_is_cheaper_for_these_facts(servers, speed):
    r = compare(servers * 8, rail_speed=speed)
    assert r.photonic.power_w < r.electrical.power_w
    assert r.photonic.capex_usd < r.electrical.capex_usd
    assert r.photonic.ocs_ports >= 8 * servers * (2 * r.photonic.tiers - 1)


# ---------------------------------------------------------------- errors name the field


@pytest.mark.parametrize("kwargs,field,text", [
    ({"num_gpus": 1}, "cluster.gpus", "too few"),
    ({"num_gpus": -8}, "cluster.gpus", "too few"),
    ({"num_gpus": 256.0}, "cluster.gpus", "whole number"),
    ({"num_gpus": True}, "cluster.gpus", "whole number"),
    ({"num_gpus": 100}, "cluster.gpus", "96 or 104"),
    ({"num_gpus": 4}, "cluster.gpus", "multiple"),
    ({"num_gpus": 8}, "cluster.gpus", "one server"),
    ({"num_gpus": 256, "gpus_per_server": 0}, "cluster.gpus_per_server", "too few"),
    ({"num_gpus": 256, "rail_speed": "200G"}, "cluster.rail_speed", "no cost facts for 200G"),
    ({"num_gpus": 256, "rail_speed": "fast"}, "cluster.rail_speed", "cannot read"),
    ({"num_gpus": 256, "rail_speed": "400"}, "cluster.rail_speed", "cannot read"),
    ({"num_gpus": 256, "kind": "hybrid"}, "fabric.kind", "electrical, photonic"),
    ({"num_gpus": 256, "facts": {"eps_radix_400g": 32}}, "costs", "CostFacts"),
])
def test_bad_input_names_the_field(kwargs, field, text):
    with pytest.raises(ScenarioError, match=re.escape(text)) as err:
        rail_fabric_cost(**kwargs)
    assert err.value.field == field and err.value.fix


def test_rail_speed_spellings():
    assert rail_fabric_cost(256, rail_speed="800Gbps").rail_speed == "800G"
    assert rail_fabric_cost(256, rail_speed="400g").rail_speed == "400G"
    assert rail_fabric_cost(256, rail_speed="50GBps").rail_speed == "400G"  # bytes per second


def test_beyond_three_tiers_is_infeasible():
    with pytest.raises(InfeasibleError, match=r"3-tier fat-tree of 4-port switches \(16\)") as err:
        rail_fabric_cost(17, gpus_per_server=1, facts=CostFacts(eps_radix_400g=4))
    assert err.value.field == "cluster.gpus" and "costs.eps_radix_400g" in err.value.fix
    most = 64**3 // 4
    assert el(most * 8).tiers == 3
    with pytest.raises(InfeasibleError, match=r"cluster\.gpus"):
        el((most + 1) * 8)


def test_compare_refuses_a_kind():
    with pytest.raises(ScenarioError, match=r"fabric\.kind"):
        compare(256, kind="photonic")


@pytest.mark.parametrize("override,field", [
    ({"eps_radix_400g": 63}, "costs.eps_radix_400g"),
    ({"eps_radix_800g": 0}, "costs.eps_radix_800g"),
    ({"eps_radix_400g": 64.0}, "costs.eps_radix_400g"),
    ({"transceiver_price_usd_800g": -1.0}, "costs.transceiver_price_usd_800g"),
    ({"ocs_port_power_w": math.nan}, "costs.ocs_port_power_w"),
    ({"eps_power_w_400g": "2524"}, "costs.eps_power_w_400g"),
    ({"ocs_port_price_usd": True}, "costs.ocs_port_price_usd"),
    ({"ocs_ports_per_link": 0}, "costs.ocs_ports_per_link"),
    ({"ocs_radix": 3, "ocs_ports_per_link": 2}, "costs.ocs_radix"),
    ({"ocs_max_tiers": 3}, "costs.ocs_max_tiers"),
    ({"switch_power_includes_optics": 1}, "costs.switch_power_includes_optics"),
])
def test_bad_facts_name_the_field(override, field):
    with pytest.raises(ScenarioError) as err:
        CostFacts(**override)
    assert err.value.field == field and err.value.fix
