"""Quantities with units at the edge; bytes, seconds and bytes/s inside.

``parse_size("1GiB")``, ``parse_rate("400Gbps")``, ``parse_time("20ms")``. Decimal prefixes
(K, M, G, T) are powers of 1000 and binary ones (Ki, Mi, Gi, Ti) powers of 1024. In rates a
lower-case ``b`` means bits (``400Gbps`` = 50e9 B/s) and an upper-case ``B`` bytes (``50GBps``).
"""

from __future__ import annotations

import math
import re

from lightrail.errors import UnitError

__all__ = ["parse_size", "parse_rate", "parse_time", "format_size", "format_rate", "format_time"]

_NUMBER = r"(?P<num>[0-9]*\.?[0-9]+(?:[eE][-+]?[0-9]+)?)\s*"
_PREFIX = {"": 1.0, "k": 1e3, "K": 1e3, "M": 1e6, "G": 1e9, "T": 1e12, "P": 1e15,
           "Ki": 2.0**10, "Mi": 2.0**20, "Gi": 2.0**30, "Ti": 2.0**40, "Pi": 2.0**50}
_SIZE_RE = re.compile(_NUMBER + r"(?P<prefix>[kKMGTP]|[KMGTP]i)?(?P<unit>B|b|bit|bits|byte|bytes)$")
_RATE_RE = re.compile(_NUMBER + r"(?P<prefix>[kKMGTP]|[KMGTP]i)?(?P<unit>bps|Bps|b/s|B/s|bit/s|byte/s)$")
_TIME_UNITS = {"s": 1.0, "sec": 1.0, "ms": 1e-3, "us": 1e-6, "µs": 1e-6, "μs": 1e-6, "ns": 1e-9,
               "ps": 1e-12, "min": 60.0}
_TIME_RE = re.compile(_NUMBER + r"(?P<unit>[a-zµμ]+)$")

_SIZE_HELP = "give a size with a unit, e.g. 1GiB, 512KB, 64MiB, 4096B"
_RATE_HELP = "give a rate with a unit, e.g. 400Gbps (bits/s) or 50GBps (bytes/s)"
_TIME_HELP = "give a time with a unit, e.g. 10ms, 3us, 1s, 0 for none"


def _kind_of(text: str) -> str | None:
    for kind, regex in (("size", _SIZE_RE), ("rate", _RATE_RE), ("time", _TIME_RE)):
        m = regex.match(text)
        if m and (kind != "time" or m.group("unit") in _TIME_UNITS):
            return kind
    return None


def _fail(value: object, want: str, fix: str, field: str) -> UnitError:
    text = str(value).strip()
    if text.startswith("-") and _kind_of(text[1:].replace(" ", "")):
        return UnitError(f"{text!r} is negative, expected a non-negative {want}", field=field, fix=fix)
    kind = _kind_of(text.replace(" ", ""))
    if kind and kind != want:
        return UnitError(f"{text!r} is a {kind}, expected a {want}", field=field, fix=fix)
    if re.fullmatch(_NUMBER.strip(), text):
        return UnitError(f"{text!r} has no unit", field=field, fix=fix)
    return UnitError(f"cannot read {text!r} as a {want}", field=field, fix=fix)


def _check(value: float, text: str, want: str, fix: str, field: str) -> float:
    if not math.isfinite(value) or value < 0:
        raise UnitError(f"{text!r} must be a finite, non-negative {want}", field=field, fix=fix)
    return value


def parse_size(value: str | int | float, *, field: str = "size") -> float:
    """Bytes from ``"1GiB"``, ``"512KB"``, ``"8Gb"`` (bits) or a bare number of bytes (int).

    >>> parse_size("1GiB"), parse_size("512KB"), parse_size("8Gb")
    (1073741824.0, 512000.0, 1000000000.0)
    """
    if isinstance(value, (int, float)) and not isinstance(value, bool):
        return _check(float(value), str(value), "size", _SIZE_HELP, field)
    text = str(value).strip().replace(" ", "")
    m = _SIZE_RE.match(text)
    if not m:
        raise _fail(value, "size", _SIZE_HELP, field)
    scale = _PREFIX[m.group("prefix") or ""]
    if m.group("unit") in ("b", "bit", "bits"):
        scale /= 8
    return _check(float(m.group("num")) * scale, text, "size", _SIZE_HELP, field)


def parse_rate(value: str | int | float, *, field: str = "bandwidth") -> float:
    """Bytes per second from ``"400Gbps"`` (bits) or ``"50GBps"`` / ``"50GB/s"`` (bytes).

    >>> parse_rate("400Gbps") == parse_rate("50GB/s") == 50e9
    True
    """
    text = str(value).strip().replace(" ", "")
    if isinstance(value, (int, float)) and not isinstance(value, bool):
        rate = _check(float(value), text, "rate", _RATE_HELP, field)
    else:
        m = _RATE_RE.match(text)
        if not m:
            raise _fail(value, "rate", _RATE_HELP, field)
        scale = _PREFIX[m.group("prefix") or ""]
        if m.group("unit") in ("bps", "b/s", "bit/s"):
            scale /= 8
        rate = _check(float(m.group("num")) * scale, text, "rate", _RATE_HELP, field)
    if rate == 0:
        raise UnitError(f"{text!r} must be positive", field=field, fix=_RATE_HELP)
    return rate


def parse_time(value: str | int | float, *, field: str = "time") -> float:
    """Seconds from ``"20ms"``, ``"3us"``, ``"1s"``; a bare ``0`` is accepted as no time.

    >>> parse_time("20ms"), parse_time("0")
    (0.02, 0.0)
    >>> parse_time("10")
    Traceback (most recent call last):
    ...
    lightrail.errors.UnitError: time: '10' has no unit; give a time with a unit, e.g. 10ms, 3us, 1s, 0 for none
    """
    if isinstance(value, (int, float)) and not isinstance(value, bool):
        return _check(float(value), str(value), "time", _TIME_HELP, field)
    text = str(value).strip().replace(" ", "")
    if text in ("0", "0.0"):
        return 0.0
    m = _TIME_RE.match(text)
    if not m or m.group("unit") not in _TIME_UNITS:
        raise _fail(value, "time", _TIME_HELP, field)
    return _check(float(m.group("num")) * _TIME_UNITS[m.group("unit")], text, "time", _TIME_HELP, field)


def _format(value: float, steps: list[tuple[float, str]], digits: int) -> str:
    for scale, unit in steps:
        if abs(value) >= scale:
            return f"{value / scale:.{digits}g}{unit}"
    scale, unit = steps[-1]
    return f"{value / scale:.{digits}g}{unit}"


def format_size(nbytes: float) -> str:
    """``1073741824 -> '1GiB'`` (binary prefixes, as sizes are usually powers of two)."""
    return _format(nbytes, [(2.0**40, "TiB"), (2.0**30, "GiB"), (2.0**20, "MiB"), (2.0**10, "KiB"),
                            (1.0, "B")], 4)


def format_rate(bytes_per_s: float) -> str:
    """``50e9 -> '50GB/s'`` (decimal prefixes, as link rates are quoted)."""
    return _format(bytes_per_s, [(1e12, "TB/s"), (1e9, "GB/s"), (1e6, "MB/s"), (1e3, "KB/s"),
                                 (1.0, "B/s")], 4)


def format_time(seconds: float) -> str:
    """Seconds with a unit, four significant digits (what the parsers read back); never in scientific
    notation: below a picosecond is float rounding (``0ns``), and long times are whole seconds.

    >>> format_time(0.0123), format_time(3e-6), format_time(1.522e-16), format_time(123456.7)
    ('12.3ms', '3us', '0ns', '123457s')
    """
    if math.isfinite(seconds) and abs(seconds) < 1e-12:
        return "0ns"
    if math.isfinite(seconds) and abs(seconds) >= 1e4:
        return f"{seconds:.0f}s"
    return _format(seconds, [(1.0, "s"), (1e-3, "ms"), (1e-6, "us"), (1e-9, "ns")], 4)
