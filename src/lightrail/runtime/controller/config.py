"""Controller configuration: where it listens and which OCS devices it owns, with which driver.

A YAML or JSON file (``lightrail controller serve --config FILE``)::

    host: 127.0.0.1
    port: 7600          # rank protocol (JSON lines over TCP); 0 picks a free port
    admin_port: 7601    # HTTP admin API; 0 picks a free port
    heartbeat_timeout: 2s   # a hello'd rank silent this long is failed (spare failover, or disconnect)
    hello_timeout: 5s       # a connection that never says hello is closed after this
    rejoin_timeout: 4s      # a rank whose connection closed without bye is failed unless it says hello again
                            # this soon (default: heartbeat_timeout + 2 s)
    max_connections: 4096   # rank connections at once; one more gets an error line and is closed
    devices:
      - {name: rail0, driver: emulated, ports: 64, delay: 10ms}
      - {name: rail1, driver: emulated, ports: 64, delay: 10ms, duplex: false}

The driver is chosen per device by name, so a real switch's driver is one more entry in
``lightrail.runtime.ocs.DRIVERS`` and no change here.
"""

from __future__ import annotations

from pathlib import Path
from typing import Literal

from pydantic import BaseModel, ConfigDict, Field, ValidationError, field_validator

from lightrail.errors import ScenarioError
from lightrail.fabric.builders import GPUS_PER_SERVER
from lightrail.fabric.params import RECONFIG_DELAY
from lightrail.units import parse_time
from lightrail.validation import first_error, read_mapping

__all__ = ["DeviceConfig", "ControllerConfig", "load_config", "default_config", "MAX_DEVICES", "MAX_PORTS",
           "MAX_TOTAL_PORTS"]

MAX_DEVICES = 1024
"""OCS devices one controller owns (rails: 8 per H100 server; 1,024 leaves room)."""
MAX_PORTS = 65536
"""Ports per device (the largest OCS sold has 1,152; issue 31: --ports 1e9 died of MemoryError)."""
MAX_TOTAL_PORTS = 1 << 20
"""Ports over all devices: the emulated drivers hold arrays per port (issue 31: --rails 1e6 never became ready)."""


class _Strict(BaseModel):
    model_config = ConfigDict(extra="forbid")


class DeviceConfig(_Strict):
    name: str = Field(min_length=1)
    driver: str = "emulated"
    ports: int = Field(64, ge=1, le=MAX_PORTS)
    delay: float = RECONFIG_DELAY  # seconds; the one default, in fabric/params.py (with its source)
    duplex: bool = False

    @field_validator("delay", mode="before")
    @classmethod
    def _delay(cls, v):
        return parse_time(v, field="delay")


class ControllerConfig(_Strict):
    host: str = "127.0.0.1"
    port: int = Field(7600, ge=0, le=65535)
    admin_port: int = Field(7601, ge=0, le=65535)
    devices: list[DeviceConfig] = Field(min_length=1, max_length=MAX_DEVICES)
    # Tenancy: the admin API's bearer token (None: `serve` takes --operator-token-file, the environment's
    # LIGHTRAIL_OPERATOR_TOKEN, or generates one and prints it in its ready line), and the Host header names
    # the admin API answers to (with or without a port), besides ``host``: the DNS-rebinding guard.
    operator_token: str | None = Field(None, min_length=16)
    allowed_hosts: list[str] = ["127.0.0.1", "localhost", "::1"]
    # Liveness and limits (seconds; "2s" and "500ms" are accepted).
    heartbeat_timeout: float = Field(2.0, gt=0)
    hello_timeout: float = Field(5.0, gt=0)
    idle_timeout: float | None = Field(None, gt=0)  # a hello'd connection silent this long is closed (None: off)
    # a rank whose connection closed without bye and that says no hello on a new one this long is failed
    # (None: heartbeat_timeout + 2 s, the client's backoff cap and a hello); a close alone is no failure: the rank
    # may be reconnecting (issue 31)
    rejoin_timeout: float | None = Field(None, gt=0)
    max_connections: int = Field(4096, ge=1)
    # who owns the rank connections: the event loop ("loop"), or concentrator.c ("native": the kernel's
    # per-connection work on another core, issue 17's 1,024 ranks; needs a C compiler at start-up)
    frontend: Literal["loop", "native"] = "loop"
    max_line: int = Field(1 << 20, ge=1024)  # bytes per request line
    max_depth: int = Field(64, ge=2)  # JSON nesting levels per request, checked before parsing
    max_groups_per_job: int = Field(65536, ge=1)
    max_ranks_per_job: int = Field(65536, ge=1)

    @field_validator("heartbeat_timeout", "hello_timeout", "idle_timeout", "rejoin_timeout", mode="before")
    @classmethod
    def _seconds(cls, v, info):
        return None if v is None else parse_time(v, field=info.field_name)

    @field_validator("devices")
    @classmethod
    def _unique(cls, v):
        names = [d.name for d in v]
        dup = sorted({n for n in names if names.count(n) > 1})
        if dup:
            raise ValueError(f"device name {dup[0]!r} appears twice")
        total = sum(d.ports for d in v)
        if total > MAX_TOTAL_PORTS:
            raise ValueError(f"{total} ports over all devices is more than {MAX_TOTAL_PORTS}")
        return v


def default_config(*, rails: int = GPUS_PER_SERVER, ports: int = 64, delay: float = RECONFIG_DELAY, port: int = 7600,
                   admin_port: int = 7601) -> ControllerConfig:
    """One emulated OCS per rail (``rail0``..), the shape of a rail-optimized cluster."""
    return ControllerConfig(port=port, admin_port=admin_port,
                            devices=[DeviceConfig(name=f"rail{i}", ports=ports, delay=delay) for i in range(rails)])


def load_config(path: str | Path | None = None, data: dict | None = None) -> ControllerConfig:
    """Read and validate a controller config (file or mapping); errors name the field."""
    if path is not None:
        data = read_mapping(path, field="--config")
    if not isinstance(data, dict):
        raise ScenarioError("the controller config must be a mapping", field="--config",
                            fix="see docs/controller.md for an example")
    try:
        return ControllerConfig.model_validate(data)
    except ValidationError as e:
        raise first_error(e, source="config", hint="see docs/controller.md") from None
