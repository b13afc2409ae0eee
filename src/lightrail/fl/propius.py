"""Propius's public evaluation inputs as lightrail's trace files (``lightrail fl import-propius``).

Propius (github.com/EricDinging/Propius, MIT licence; read at commit 73807cc) evaluates its scheduler with:

- **Job profiles** ``evaluation/job/profile_<name>/job_<k>.yml``: ``demand``, ``total_round``, ``over_selection``
  (1.3), ``sched_timeout`` + ``exec_timeout`` (120 + 180 s), ``batch_size`` x ``local_steps`` (20 x 20 samples per
  round) and ``public_constraint`` minimums ``cpu_f``, ``ram``, ``fp16_mem``, ``android_os``. ``config.py`` picks
  ``profile_mobilenet_large`` (20 jobs, demand 25-400, 150 rounds, three constraint tiers).
- **Job trace** ``evaluation/job/trace/job_trace_20.txt``: per line ``<gap s> <profile k>``;
  ``evaluation/job/job_dispatcher.py`` sleeps the gap, then starts job ``k``, so arrivals are the running sum.
- **Device profiles** ``datasets/device_info/client_spec_speed`` (a pickled dict of 952 devices: ``cpu_f``, ``ram``,
  ``fp16_mem``, ``android_os``, ``speed``). ``evaluation/client/client_dispatcher.py`` gives each of its
  ``client_num`` (15,000, ``config.py``) clients the profile of a uniformly drawn index (modulo 952).
  A client trains ``local_steps`` steps of ``3 x batch_size x speed / 1000`` s each (``evaluation/client/
  client.py``, ``Client.execute``), so here its speed is ``1000 / (3 x speed)`` samples per second and a job's work
  ``batch_size x local_steps`` samples.

Not converted: the availability trace (``client_behave_trace``) and network capacities (``client_device_capacity``)
are FedScale's, fetched by ``datasets/download.sh`` and not in the repository snapshot; without them the study uses
its synthetic diurnal sessions, or ``always_online_s`` (Propius's ``ideal_client`` mode: online throughout) and no
model download / upload time. The private constraint ``dataset_size`` (>= 100 or 120 samples) is dropped: 99.4% and
96% of ``client_dataset_size``'s entries meet it.
"""

from __future__ import annotations

import io
import math
import pickle
import re

import numpy as np

from lightrail.errors import ScenarioError

__all__ = ["load_devices", "parse_profile", "parse_trace", "convert", "SPEC_FIELDS"]

SPEC_FIELDS = ("cpu_f", "ram", "fp16_mem", "android_os", "speed")


class _DataOnly(pickle.Unpickler):
    """Unpickles plain data only (dicts, numbers, strings): a pickle naming any class or function is refused."""

    def find_class(self, module, name):
        raise pickle.UnpicklingError(f"refusing {module}.{name}: only plain data is read")


def load_devices(data: bytes, *, field: str = "--devices") -> list[dict]:
    """Device profiles from Propius's ``client_spec_speed`` pickle, or from JSON (a list, or a dict id -> profile),
    in id order."""
    import json

    try:
        if data[:1] in (b"{", b"["):
            raw = json.loads(data)
        else:
            raw = _DataOnly(io.BytesIO(data)).load()
    except (pickle.UnpicklingError, EOFError, ValueError, TypeError) as e:
        raise ScenarioError(f"cannot read the device profiles: {e}", field=field,
                            fix="Propius's datasets/device_info/client_spec_speed, or a JSON of its entries") from None
    items = sorted(raw.items(), key=lambda kv: int(kv[0])) if isinstance(raw, dict) else list(enumerate(raw))
    out = []
    for key, d in items:
        if not isinstance(d, dict) or any(f not in d for f in SPEC_FIELDS):
            raise ScenarioError(f"device {key!r} lacks one of {', '.join(SPEC_FIELDS)}", field=field,
                                fix="device profiles as Propius's client_spec_speed holds them")
        if not float(d["speed"]) > 0:
            raise ScenarioError(f"device {key!r}: speed {d['speed']!r}", field=field, fix="a positive speed")
        out.append({f: float(d[f]) for f in SPEC_FIELDS} | {"device": str(d.get("device", ""))})
    if not out:
        raise ScenarioError("no device profile", field=field, fix="a non-empty client_spec_speed")
    return out


def parse_profile(text: str, *, name: str = "profile", field: str = "--profiles") -> dict:
    """The fields of one job profile (``job_<k>.yml``) that the study uses."""
    import yaml

    try:
        d = yaml.safe_load(text)
    except yaml.YAMLError as e:
        raise ScenarioError(f"{name}: not YAML ({e})", field=field, fix="a Propius job profile") from None
    need = ("demand", "total_round", "batch_size", "local_steps", "public_constraint")
    if not isinstance(d, dict) or any(k not in d for k in need):
        raise ScenarioError(f"{name}: lacks one of {', '.join(need)}", field=field, fix="a Propius job profile")
    pc = d["public_constraint"] or {}
    return {"demand": int(d["demand"]), "rounds": int(d["total_round"]),
            "work": float(d["batch_size"]) * float(d["local_steps"]),
            "over_selection": float(d.get("over_selection", 1.0)),
            "round_timeout_s": float(d.get("sched_timeout", 0)) + float(d.get("exec_timeout", 0)),
            "cpu_f": float(pc.get("cpu_f", 0)), "ram": float(pc.get("ram", 0)),
            "fp16_mem": float(pc.get("fp16_mem", 0)), "android_os": float(pc.get("android_os", 0))}


def parse_trace(text: str, *, field: str = "--trace") -> list[tuple[float, int]]:
    """``(arrival_s, profile k)`` per line of a ``job_trace_*.txt`` (``<gap s> <k>``; arrivals are running sums)."""
    out, t = [], 0.0
    for n, line in enumerate(text.splitlines(), start=1):
        if not line.strip():
            continue
        m = re.fullmatch(r"\s*(\d+(?:\.\d+)?)\s+(\d+)\s*", line)
        if m is None:
            raise ScenarioError(f"line {n}: {line.strip()!r}", field=field, fix="lines '<gap seconds> <profile>'")
        t += float(m.group(1))
        out.append((t, int(m.group(2))))
    if not out:
        raise ScenarioError("empty job trace", field=field, fix="lines '<gap seconds> <profile>'")
    return out


def convert(devices: list[dict], profiles: dict[int, dict], trace: list[tuple[float, int]], *, clients: int = 15_000,
            seed: int = 0, always_online_s: float | None = None) -> dict:
    """The three CSV texts (``clients``, ``jobs``, ``availability`` or None) and the run settings the profiles
    give (``over_selection``, ``round_timeout_s``: the profiles' common values; a mix is refused)."""
    from lightrail.fl.population import (
        AVAILABILITY_HEADER,
        CLIENTS_HEADER,
        CLIENTS_OPTIONAL,
        JOBS_HEADER,
        JOBS_OPTIONAL,
    )

    if clients < 1:
        raise ScenarioError(f"clients={clients}", field="--clients", fix="1 or more")
    missing = sorted({k for _, k in trace} - set(profiles))
    if missing:
        raise ScenarioError(f"the trace names profiles {missing} that are not given", field="--profiles",
                            fix="the profile folder the trace was written for (job_<k>.yml for each k)")
    rng = np.random.default_rng(seed)
    pick = rng.integers(0, len(devices), clients)  # client_dispatcher.py: a uniform profile per client
    lines = [",".join(CLIENTS_HEADER + CLIENTS_OPTIONAL)]
    for i, k in enumerate(pick.tolist()):
        d = devices[k]
        lines.append(f"c{i},{d['cpu_f']:g},{d['ram']:g},android{d['android_os']:g},{1000 / (3 * d['speed'])!r},"
                     f"{d['fp16_mem']:g}")
    clients_text = "\n".join(lines) + "\n"
    lines = [",".join(JOBS_HEADER + JOBS_OPTIONAL)]
    used = [profiles[k] for _, k in trace]
    for (t, _), p in zip(trace, used, strict=True):
        lines.append(f"{t:g},{p['cpu_f']:g},{p['ram']:g},android>={p['android_os']:g},{p['rounds']},{p['demand']},"
                     f"{p['work']:g},{p['fp16_mem']:g}")
    jobs_text = "\n".join(lines) + "\n"
    avail = None
    if always_online_s is not None:
        if not (always_online_s > 0 and math.isfinite(always_online_s)):
            raise ScenarioError(f"{always_online_s}", field="--always-online", fix="a positive time, e.g. 30d")
        avail = ",".join(AVAILABILITY_HEADER) + "\n" + "".join(f"c{i},0,{always_online_s:g}\n"
                                                                 for i in range(clients))
    settings = {}
    for key in ("over_selection", "round_timeout_s"):
        values = sorted({p[key] for p in used})
        if len(values) > 1:
            raise ScenarioError(f"the profiles mix {key} values {values}", field="--profiles",
                                fix="profiles with one over-selection and one timeout (the study applies one)")
        settings[key] = values[0]
    return {"clients": clients_text, "jobs": jobs_text, "availability": avail, **settings,
            "devices": len(devices), "jobs_count": len(trace), "clients_count": clients}
