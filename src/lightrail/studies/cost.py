"""Power and capital cost of the scale-out rails of a rail-optimized cluster: electrical vs photonic.

A cluster of ``N`` GPUs has ``S = N / g`` servers of ``g`` GPUs, one NIC per GPU at the rail speed,
and ``g`` rails; rail ``i`` joins NIC ``i`` of every server. Only the rails are costed (no NVLink,
no front-end network, no cables or fibre, no NICs themselves), and every rail is identical, so
whole-cluster counts are ``g`` times one rail's.

The point is to let the facts (DESIGN.md "Defaults", all in :class:`CostFacts`) decide the ratio.
Nothing here is tuned toward the Opus paper's ">23x lower power, 4x lower cost" (PAPERS.md); where
the model disagrees, the model's number is the one to report.

Electrical rails: each rail is a non-blocking fat-tree of EPS of radix ``k`` (64 at 400G,
144 at 800G), the fewest tiers that fit: 1 if ``S <= k``, 2 if ``S <= k^2/2``, 3 if ``S <= k^3/4``.
Partial sizes use uniform cabling ("planes"): leaves are filled evenly and every leaf has one
uplink per spine plane, so the fabric stays rearrangeably non-blocking (Clos, Slepian-Duguid) and
never relies on uneven parallel links. With ``h = k // 2``::

    2 tiers: L = ceil(S / h) leaves, u = ceil(S / L) uplinks per leaf (>= its NICs),
             u spine planes of L ports each, floor(k / L) planes per spine switch:
             spines = ceil(u / floor(k / L)); leaf-spine links = L * u.
    3 tiers: P = ceil(S / (k^2/4)) pods, hp = ceil(S / P) NICs in the fullest pod,
             E = ceil(hp / h) edges and u = ceil(hp / E) aggregations per pod (u uplinks per edge),
             edges = P*E, aggregations = P*u, core planes = u*E of P ports each,
             cores = ceil(u*E / floor(k / P)); edge-agg links = agg-core links = P*E*u.

For full sizes these are the textbook counts (2 tiers: k leaves + k/2 spines for k^2/2 hosts;
3 tiers: 5k^2/4 switches for k^3/4 hosts). Every cable carries one transceiver at each end: the NIC
end, the switch end of the NIC link, and both ends of every switch-to-switch link, so
``transceivers = 2 * links`` (the NIC ends are dropped from *both* fabrics when
``include_nic_transceivers=False``). A switch is bought whole: its listed power and price count
even when some of its ports are idle.

Photonic rails (Opus): each rail is one OCS, transparent to the signal, so the only transceivers
are the NICs'. One DESIGN.md "port" is read as one position of the OCS's N x N matrix (an input and
its paired output), which is what one duplex NIC link occupies: TX fibre to input ``i``, RX fibre
from output ``i``. ``ocs_ports_per_link`` (default 1) makes that explicit; set 2 to charge each
fibre separately, the conservative reading (it doubles OCS power and price; see CostFacts).
OCS ports are charged per port in use: the facts are per-port, and OCS matrices are sold in
many port counts. When a rail has more NICs than one device (``S > c``, with ``c = ocs_radix //
ocs_ports_per_link`` links per device), it is built as a folded 3-stage Clos of OCS devices, the same
plane construction as the 2-tier EPS fabric above with ``k = c``: ``L = ceil(S / (c//2))`` edge
devices, ``u = ceil(S / L)`` uplinks each, ``middles = ceil(u / floor(c / L))``, OCS ports
``S + 2*L*u`` (times ``ocs_ports_per_link``) and no transceivers between stages. It can realise
any permutation of the rail's NICs (rearrangeably non-blocking: the controller recomputes the
middle-stage routing for every configuration), but a circuit crosses three OCS devices, so it
pays three insertion losses; check that against the transceiver's link budget (not modelled here)
or set ``ocs_max_tiers=1`` to refuse such rails. Beyond ``S > (c//2) * c`` there is no 2-tier
OCS rail and :class:`InfeasibleError` says so.
"""

from __future__ import annotations

import math
import re
from collections.abc import Iterable
from dataclasses import dataclass, field
from typing import Literal

from lightrail.errors import InfeasibleError, ScenarioError
from lightrail.fabric.builders import GPUS_PER_SERVER
from lightrail.fabric.costs import RAIL_SPEEDS, CostFacts
from lightrail.units import parse_rate

__all__ = ["FabricCost", "CostComparison", "CostSweep", "rail_fabric_cost", "compare", "cost_sweep",
           "KINDS"]

KINDS = ("electrical", "photonic")


@dataclass(frozen=True, kw_only=True, slots=True)
class FabricCost:
    """Counts, power and capital cost of all the rails of one cluster, for one kind of fabric.

    ``switches`` are the fabric's devices: EPS for electrical rails, OCS devices for photonic ones.
    ``switch_ports`` are the EPS ports bought (switches x radix); ``ocs_ports`` the OCS ports in use.
    ``links`` are cables (NIC-to-device and device-to-device); ``tiers`` are device levels per rail.
    ``breakdown`` maps ``"power_w"`` and ``"capex_usd"`` to the same four components
    (eps, ocs, nic_transceivers, switch_transceivers), zero where absent, so the kinds line up.
    """

    kind: Literal["electrical", "photonic"]
    num_gpus: int
    gpus_per_server: int
    rail_speed: str
    rails: int
    servers: int
    tiers: int
    switches: int
    switch_ports: int
    ocs_ports: int
    links: int
    transceivers: int
    power_w: float
    capex_usd: float
    breakdown: dict[str, dict[str, float]] = field(hash=False)


@dataclass(frozen=True, kw_only=True, slots=True)
class CostComparison:
    """Electrical against photonic rails for the same cluster; ratios are electrical / photonic."""

    electrical: FabricCost
    photonic: FabricCost
    power_ratio: float
    cost_ratio: float


@dataclass(frozen=True, slots=True)
class _Rail:
    """One rail's device levels, devices and cables (NIC links included)."""

    tiers: int
    devices: int
    links: int


def _planes(s: int, down: int, k: int) -> tuple[int, int, int]:
    """Two-level folded Clos of ``s`` NICs on radix-``k`` devices with ``down`` NIC ports per leaf.

    Returns (leaves, uplinks per leaf, spines): leaves filled evenly, one uplink per spine plane,
    ``floor(k / leaves)`` planes packed into each spine device (merging planes only adds paths).
    """
    leaves = -(-s // down)
    up = -(-s // leaves)
    return leaves, up, -(-up // (k // leaves))


def _fat_tree(s: int, k: int) -> _Rail:
    """Non-blocking EPS fat-tree for one rail of ``s`` NICs (module docstring has the formulas)."""
    h = k // 2
    if s <= k:
        return _Rail(1, 1, s)
    if s <= k * h:
        leaves, up, spines = _planes(s, h, k)
        return _Rail(2, leaves + spines, s + leaves * up)
    pods = -(-s // (h * h))
    edges, up, _ = _planes(-(-s // pods), h, k)  # per pod: edges, aggregations (= uplinks per edge)
    cores = -(-(up * edges) // (k // pods))
    return _Rail(3, pods * (edges + up) + cores, s + 2 * pods * edges * up)


def _ocs_rail(s: int, c: int) -> _Rail:
    """Photonic rail of ``s`` NIC links on OCS devices holding ``c`` links each (1 or 2 levels)."""
    if s <= c:
        return _Rail(1, 1, s)
    leaves, up, middles = _planes(s, c // 2, c)
    return _Rail(2, leaves + middles, s + leaves * up)


def _speed(rail_speed: object) -> str:
    text = str(rail_speed).strip()
    fix = f"use one of {', '.join(RAIL_SPEEDS)} (also accepted: '400Gbps', '800Gbps')"
    if re.fullmatch(r"\d+[gG]", text):
        text = text[:-1] + "Gbps"
    try:
        gbps = parse_rate(text, field="cluster.rail_speed") * 8 / 1e9
    except ScenarioError:
        raise ScenarioError(f"cannot read {rail_speed!r} as a rail speed", field="cluster.rail_speed",
                            fix=fix) from None
    name = f"{gbps:g}G"
    if name not in RAIL_SPEEDS:
        raise ScenarioError(f"no cost facts for {name} rails", field="cluster.rail_speed", fix=fix)
    return name


def _check_cluster(num_gpus: object, gpus_per_server: object) -> int:
    for name, value, least in (("cluster.gpus", num_gpus, 2), ("cluster.gpus_per_server", gpus_per_server, 1)):
        if isinstance(value, bool) or not isinstance(value, int):
            raise ScenarioError(f"{value!r} is not a whole number", field=name, fix=f"give an integer >= {least}")
        if value < least:
            raise ScenarioError(f"{value} is too few", field=name, fix=f"use {least} or more")
    g = gpus_per_server
    if num_gpus % g:
        lo, hi = num_gpus // g * g, (num_gpus // g + 1) * g
        near = f"{lo} or {hi}" if lo else f"{hi}"
        raise ScenarioError(f"{num_gpus} GPUs do not fill servers of {g}", field="cluster.gpus",
                            fix=f"use a multiple of cluster.gpus_per_server ({g}), e.g. {near}")
    servers = num_gpus // g
    if servers < 2:
        raise ScenarioError(f"{num_gpus} GPUs are one server, so the rails connect nothing", field="cluster.gpus",
                            fix=f"use at least 2 servers ({2 * g} GPUs)")
    return servers


def rail_fabric_cost(num_gpus: int, *, gpus_per_server: int = GPUS_PER_SERVER, rail_speed: str = "400G",
                     kind: Literal["electrical", "photonic"] = "electrical", facts: CostFacts | None = None,
                     include_nic_transceivers: bool = True) -> FabricCost:
    """Port, transceiver and switch counts, power and capex of the ``gpus_per_server`` rails of a cluster.

    Parameters
    ----------
    num_gpus : GPUs in the cluster, a multiple of ``gpus_per_server`` covering at least 2 servers.
    gpus_per_server : GPUs (and NICs, and rails) per server.
    rail_speed : ``"400G"`` or ``"800G"`` (NIC, transceiver and EPS generation).
    kind : ``"electrical"`` (EPS fat-tree per rail) or ``"photonic"`` (OCS per rail, Opus).
    facts : hardware facts; :class:`CostFacts` defaults (DESIGN.md) when omitted.
    include_nic_transceivers : count the NIC-end transceiver of every NIC link; it is the same on both
        fabrics, so dropping it (False) compares the fabrics alone.

    Raises
    ------
    ScenarioError : malformed cluster (``cluster.gpus``, ``cluster.gpus_per_server``,
        ``cluster.rail_speed``) or ``fabric.kind``.
    InfeasibleError : a rail larger than a 3-tier fat-tree of the EPS radix, or than the OCS levels
        allowed by ``facts.ocs_max_tiers``.

    Examples
    --------
    >>> c = rail_fabric_cost(256)  # 32 servers: each of the 8 rails is one 64-port EPS
    >>> (c.tiers, c.switches, c.transceivers)
    (1, 8, 512)
    """
    facts = CostFacts() if facts is None else facts
    if not isinstance(facts, CostFacts):
        raise ScenarioError(f"{type(facts).__name__} is not CostFacts", field="costs", fix="pass CostFacts(...)")
    servers = _check_cluster(num_gpus, gpus_per_server)
    speed = _speed(rail_speed)
    if kind not in KINDS:
        raise ScenarioError(f"unknown fabric kind {kind!r}", field="fabric.kind", fix=f"use one of {', '.join(KINDS)}")
    rails = gpus_per_server
    t_w, t_usd, k, eps_w, eps_usd = facts.port(speed)
    nic_tx = rails * servers if include_nic_transceivers else 0

    if kind == "electrical":
        most = k**3 // 4
        if servers > most:
            raise InfeasibleError(
                f"{servers} servers per rail exceed a 3-tier fat-tree of {k}-port switches ({most})",
                field="cluster.gpus",
                fix=f"use at most {most * gpus_per_server} GPUs, more GPUs per server, or a larger costs.eps_radix_"
                    f"{speed.lower()}")
        rail = _fat_tree(servers, k)
        switch_tx = rails * (2 * rail.links - servers)  # both ends of every cable but the NIC end
        switch_tx_w = 0.0 if facts.switch_power_includes_optics else switch_tx * t_w
        power = {"eps": rails * rail.devices * eps_w, "ocs": 0.0,
                 "nic_transceivers": nic_tx * t_w, "switch_transceivers": switch_tx_w}
        capex = {"eps": rails * rail.devices * eps_usd, "ocs": 0.0,
                 "nic_transceivers": nic_tx * t_usd, "switch_transceivers": switch_tx * t_usd}
        switch_ports, ocs_ports = rails * rail.devices * k, 0
    else:
        per = facts.ocs_ports_per_link
        c = facts.ocs_radix // per
        most = c if facts.ocs_max_tiers == 1 else (c // 2) * c
        if servers > most:
            over = "one OCS device" if facts.ocs_max_tiers == 1 else "a 2-level folded Clos of OCS devices"
            fix = (f"use at most {most * gpus_per_server} GPUs, a larger costs.ocs_radix"
                   + (", or allow costs.ocs_max_tiers=2" if facts.ocs_max_tiers == 1 else ""))
            raise InfeasibleError(f"{servers} servers per rail exceed {over} ({most} NIC links of "
                                  f"{facts.ocs_radix}-port devices)",
                                  field="costs.ocs_max_tiers" if facts.ocs_max_tiers == 1 else "cluster.gpus", fix=fix)
        rail = _ocs_rail(servers, c)
        switch_tx = 0
        ocs_ports = rails * per * (2 * rail.links - servers)  # NIC ports, plus both ends of inter-OCS links
        power = {"eps": 0.0, "ocs": ocs_ports * facts.ocs_port_power_w,
                 "nic_transceivers": nic_tx * t_w, "switch_transceivers": 0.0}
        capex = {"eps": 0.0, "ocs": ocs_ports * facts.ocs_port_price_usd,
                 "nic_transceivers": nic_tx * t_usd, "switch_transceivers": 0.0}
        switch_ports = 0

    return FabricCost(kind=kind, num_gpus=num_gpus, gpus_per_server=gpus_per_server, rail_speed=speed, rails=rails,
                      servers=servers, tiers=rail.tiers, switches=rails * rail.devices, switch_ports=switch_ports,
                      ocs_ports=ocs_ports, links=rails * rail.links, transceivers=nic_tx + switch_tx,
                      power_w=sum(power.values()), capex_usd=sum(capex.values()),
                      breakdown={"power_w": power, "capex_usd": capex})


def compare(num_gpus: int, **same) -> CostComparison:
    """Electrical and photonic rails of the same cluster (``same``: the other rail_fabric_cost arguments).

    Examples
    --------
    >>> r = compare(256)
    >>> round(r.power_ratio, 2), round(r.cost_ratio, 2)
    (9.52, 2.09)
    """
    if "kind" in same:
        raise ScenarioError("compare() costs both kinds", field="fabric.kind", fix="leave kind out")
    electrical = rail_fabric_cost(num_gpus, kind="electrical", **same)
    photonic = rail_fabric_cost(num_gpus, kind="photonic", **same)
    return CostComparison(electrical=electrical, photonic=photonic,
                          power_ratio=_ratio(electrical.power_w, photonic.power_w),
                          cost_ratio=_ratio(electrical.capex_usd, photonic.capex_usd))


@dataclass(frozen=True, kw_only=True, slots=True)
class CostSweep:
    """Electrical against photonic rails across cluster sizes (one :class:`CostComparison` per size)."""

    rail_speed: str
    """As the caller wrote it (``400G``, ``400Gbps``); each comparison holds the normalised speed."""
    gpus_per_server: int
    comparisons: tuple[CostComparison, ...]

    def rows(self) -> list[dict]:
        return [{"gpus": c.electrical.num_gpus, "electrical_power_w": c.electrical.power_w,
                 "photonic_power_w": c.photonic.power_w, "electrical_capex_usd": c.electrical.capex_usd,
                 "photonic_capex_usd": c.photonic.capex_usd, "electrical_tiers": c.electrical.tiers,
                 "electrical_switches": c.electrical.switches, "ocs_ports": c.photonic.ocs_ports,
                 "power_ratio": c.power_ratio, "cost_ratio": c.cost_ratio} for c in self.comparisons]

    def to_dict(self) -> dict:
        return {"rail_speed": self.rail_speed, "rows": self.rows()}


def cost_sweep(gpu_counts: Iterable[int], *, gpus_per_server: int = GPUS_PER_SERVER, rail_speed: str = "400G",
               facts: CostFacts | None = None) -> CostSweep:
    """:func:`compare` at every cluster size in ``gpu_counts``."""
    return CostSweep(rail_speed=rail_speed, gpus_per_server=gpus_per_server,
                     comparisons=tuple(compare(n, gpus_per_server=gpus_per_server, rail_speed=rail_speed, facts=facts)
                                       for n in gpu_counts))


def _ratio(a: float, b: float) -> float:
    return a / b if b else math.inf
