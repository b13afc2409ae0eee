"""Optical circuit switch drivers: the interface the controller uses, and the drivers by name.

>>> ocs = make_driver("emulated", ports=8, delay_s=0.012)
>>> ocs.apply({0: 1, 1: 0}, now=100.0)
100.012
>>> ocs.state()
{0: 1, 1: 0}

A new driver (a real switch) implements :class:`OCSDriver` and is added to :data:`DRIVERS`.
"""

from __future__ import annotations

import inspect

from lightrail.errors import ScenarioError
from lightrail.runtime.ocs.driver import Changes, OCSDriver, changed_ports, moving_ports, validate_changes
from lightrail.runtime.ocs.emulated import EmulatedOCS

__all__ = ["DRIVERS", "Changes", "EmulatedOCS", "OCSDriver", "changed_ports", "make_driver", "moving_ports",
           "validate_changes"]

DRIVERS: dict[str, type] = {"emulated": EmulatedOCS}
"""Driver classes by the name a controller configuration gives (``driver = "emulated"``)."""


def make_driver(name: str, /, **options: object) -> OCSDriver:
    """Build the driver registered as ``name`` with keyword ``options`` (its constructor's parameters).

    ``name`` is positional-only, so the device's own ``name=`` can be passed as an option.

    Raises :class:`~lightrail.errors.ScenarioError` with ``field="driver"`` for an unknown driver, and with the
    option's name as field for an option the driver does not take or a bad value.
    """
    known = ", ".join(sorted(DRIVERS))
    if name not in DRIVERS:
        raise ScenarioError(f"unknown OCS driver {name!r}", field="driver", fix=f"use one of: {known}")
    cls = DRIVERS[name]
    accepted = [p for p in inspect.signature(cls).parameters if p != "self"]
    for option in options:
        if option not in accepted:
            raise ScenarioError(
                f"driver {name!r} has no option {option!r}",
                field=option,
                fix=f"options of {name!r}: {', '.join(accepted)}",
            )
    return cls(**options)
