"""The power and price of the parts a rail network is built from (transceivers, packet switches, OCS
ports): the facts behind every cost comparison, each with its source, defined here once."""

from __future__ import annotations

import math
from dataclasses import dataclass, fields

from lightrail.errors import ScenarioError

__all__ = ["CostFacts", "RAIL_SPEEDS"]

RAIL_SPEEDS = ("400G", "800G")


@dataclass(frozen=True, kw_only=True, slots=True)
class CostFacts:
    """Every hardware fact the cost model uses (DESIGN.md "Defaults"); override any of them.

    Sources are the ones DESIGN.md quotes and that the Opus public artifact's cost scripts cite in
    their comments (FS.com, NADDOD, NVIDIA listings); the prices are list prices at one point in
    time, so treat them as a scenario, not a truth.
    """

    transceiver_power_w_400g: float = 10.0
    """W per 400G transceiver (DESIGN.md; FS.com product 110530 as cited by the Opus artifact)."""
    transceiver_price_usd_400g: float = 879.0
    """US$ per 400G transceiver (DESIGN.md). The Opus artifact cites this $879 for FS.com product
    229253, the 800G module below, so for 400G it is probably high; it is kept as DESIGN gives it."""
    transceiver_power_w_800g: float = 16.0
    """W per 800G transceiver (DESIGN.md; FS.com product 229253 as cited by the Opus artifact)."""
    transceiver_price_usd_800g: float = 879.0
    """US$ per 800G transceiver: DESIGN.md gives none; $879 is the FS.com list price of product
    229253, the 800G module whose 16 W DESIGN quotes, as cited in the Opus artifact."""
    eps_radix_400g: int = 64
    """Ports of the 400G EPS (DESIGN.md: 64-port 400G switch, FS.com product 149853)."""
    eps_power_w_400g: float = 2524.0
    """W per 64-port 400G EPS (DESIGN.md; FS.com product 149853)."""
    eps_price_usd_400g: float = 37_299.0
    """US$ per 64-port 400G EPS (DESIGN.md; FS.com product 149853)."""
    eps_radix_800g: int = 144
    """Ports of the 800G EPS: NVIDIA Quantum-X800 Q3400, 144 x 800G (DESIGN.md)."""
    eps_power_w_800g: float = 7000.0
    """W per Q3400 (DESIGN.md; NVIDIA XDR switch specifications, the figure "with active cables")."""
    eps_price_usd_800g: float = 149_939.0
    """US$ per Q3400 (DESIGN.md; NADDOD listing cited by the Opus artifact)."""
    switch_power_includes_optics: bool = False
    """True when the EPS power figure already includes its ports' transceivers (the Q3400's 7000 W
    is quoted "with active cables"): switch-end transceivers then add price but no power. Off by
    default, as the task's model counts them (an upper bound on electrical power)."""
    ocs_port_power_w: float = 75 / 192
    """W per OCS port. DESIGN.md "75/192 W" for a Polatis 6000n: read as 75 W for a 192-port
    device, 0.39 W per port. The same 192 ports at $520 give ~$100k per device."""
    ocs_port_price_usd: float = 520.0
    """US$ per OCS port (DESIGN.md, Polatis 6000n)."""
    ocs_radix: int = 192
    """Ports per OCS device: the 192 of DESIGN.md's "75/192 W" (the Polatis 6000n the power and
    price describe). Not checked against a datasheet here; a 384 x 384 Polatis Series 7000 is
    ``ocs_radix=384`` (keep the per-port power and price only if they still hold)."""
    ocs_ports_per_link: int = 1
    """OCS ports one duplex NIC link occupies: 1 if a port is an N x N position (input + output),
    2 if the facts are per fibre (the Opus artifact charges two ports per NIC)."""
    ocs_max_tiers: int = 2
    """Most OCS levels a rail may use: 1 (one device per rail, else InfeasibleError) or 2 (folded
    Clos, three OCS passes per circuit)."""

    def __post_init__(self) -> None:
        for f in fields(self):
            value = getattr(self, f.name)
            where = f"costs.{f.name}"
            if f.name == "switch_power_includes_optics":
                if not isinstance(value, bool):
                    raise ScenarioError(f"{value!r} is not a boolean", field=where, fix="use true or false")
            elif f.type == "int":
                if isinstance(value, bool) or not isinstance(value, int):
                    raise ScenarioError(f"{value!r} is not an integer", field=where, fix="give a whole number")
            elif isinstance(value, bool) or not isinstance(value, (int, float)) or not math.isfinite(value) \
                    or value < 0:
                raise ScenarioError(f"{value!r} is not a finite, non-negative number", field=where,
                                    fix="give watts or US dollars as a number >= 0")
        for name in ("eps_radix_400g", "eps_radix_800g"):
            k = getattr(self, name)
            if k < 2 or k % 2:
                raise ScenarioError(f"{k} ports cannot build a fat-tree", field=f"costs.{name}",
                                    fix="give an even port count >= 2 (a leaf splits it half down, half up)")
        if self.ocs_ports_per_link < 1:
            raise ScenarioError(f"{self.ocs_ports_per_link} ports per link", field="costs.ocs_ports_per_link",
                                fix="use 1 (a port is an input/output pair) or 2 (a port is one fibre)")
        if self.ocs_radix < 2 * self.ocs_ports_per_link:
            raise ScenarioError(f"an OCS of {self.ocs_radix} ports holds fewer than 2 NIC links",
                                field="costs.ocs_radix", fix=f"use at least {2 * self.ocs_ports_per_link} ports")
        if self.ocs_max_tiers not in (1, 2):
            raise ScenarioError(f"{self.ocs_max_tiers} OCS tiers is not modelled", field="costs.ocs_max_tiers",
                                fix="use 1 (one OCS per rail) or 2 (folded Clos of OCS devices)")

    def port(self, speed: str) -> tuple[float, float, int, float, float]:
        """(transceiver W, transceiver $, EPS radix, EPS W, EPS $) at a rail speed from RAIL_SPEEDS."""
        s = speed.lower()
        return (getattr(self, f"transceiver_power_w_{s}"), getattr(self, f"transceiver_price_usd_{s}"),
                getattr(self, f"eps_radix_{s}"), getattr(self, f"eps_power_w_{s}"), getattr(self, f"eps_price_usd_{s}"))
