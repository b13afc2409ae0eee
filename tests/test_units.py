"""Units at the edge: sizes, rates and times parse to bytes, bytes/s and seconds, or fail helpfully."""

from __future__ import annotations

import pytest
from hypothesis import given
from hypothesis import strategies as st

from lightrail.errors import ScenarioError, UnitError
from lightrail.units import format_rate, format_size, format_time, parse_rate, parse_size, parse_time

# Where each parser's error message points the user (the ``fix`` text quotes accepted examples).
SIZE_HELP = ("size", "1GiB")
RATE_HELP = ("bandwidth", "400Gbps")
TIME_HELP = ("time", "10ms")

finite = st.floats(min_value=0, max_value=1e12, allow_nan=False, allow_infinity=False)


@pytest.mark.parametrize(
    ("text", "expected"),
    [
        ("1GiB", 2**30),
        ("64MiB", 64 * 2**20),
        ("4KiB", 4096),
        ("512KB", 512e3),
        ("512kB", 512e3),
        ("4096B", 4096),
        ("1.5GB", 1.5e9),
        ("8Gb", 1e9),  # lower-case b is bits
        ("16bits", 2),
        ("1 GiB", 2**30),
        ("  2TB ", 2e12),
        ("1e3MiB", 1000 * 2**20),
        ("0B", 0),
    ],
)
def test_parse_size(text, expected):
    assert parse_size(text) == expected


@pytest.mark.parametrize(
    ("text", "expected"),
    [
        ("400Gbps", 50e9),  # bits per second
        ("50GBps", 50e9),  # bytes per second
        ("50GB/s", 50e9),
        ("100Gb/s", 12.5e9),
        ("800Gbit/s", 100e9),
        ("1TBps", 1e12),
        ("10MiBps", 10 * 2**20),
        ("3.2 Tbps", 400e9),
    ],
)
def test_parse_rate(text, expected):
    assert parse_rate(text) == expected


@pytest.mark.parametrize(
    ("text", "expected"),
    [
        ("10ms", 10e-3),
        ("3us", 3e-6),
        ("3µs", 3e-6),
        ("250ns", 250e-9),
        ("1s", 1.0),
        ("2min", 120.0),
        ("10 ms", 10e-3),
        ("0", 0.0),
        ("0s", 0.0),
    ],
)
def test_parse_time(text, expected):
    assert parse_time(text) == pytest.approx(expected, rel=1e-12, abs=0)


@pytest.mark.parametrize("parse", [parse_size, parse_rate, parse_time])
def test_bare_numbers_are_taken_in_base_units(parse):
    assert parse(1024) == 1024.0
    assert parse(0.5) == 0.5


@pytest.mark.parametrize(
    ("parse", "text", "help_", "says"),
    [
        # no unit
        (parse_size, "1024", SIZE_HELP, "has no unit"),
        (parse_rate, "400", RATE_HELP, "has no unit"),
        (parse_time, "10", TIME_HELP, "has no unit"),
        # a unit of the wrong kind: the message names the kind it is
        (parse_size, "400Gbps", SIZE_HELP, "is a rate, expected a size"),
        (parse_size, "10ms", SIZE_HELP, "is a time, expected a size"),
        (parse_rate, "1GiB", RATE_HELP, "is a size, expected a rate"),
        (parse_rate, "3us", RATE_HELP, "is a time, expected a rate"),
        (parse_time, "1GiB", TIME_HELP, "is a size, expected a time"),
        (parse_time, "400Gbps", TIME_HELP, "is a rate, expected a time"),
        # garbage
        (parse_size, "lots", SIZE_HELP, "cannot read"),
        (parse_size, "", SIZE_HELP, "cannot read"),
        (parse_size, "1GiBB", SIZE_HELP, "cannot read"),
        (parse_rate, "fast", RATE_HELP, "cannot read"),
        (parse_time, "5xs", TIME_HELP, "cannot read"),
        (parse_time, "soon", TIME_HELP, "cannot read"),
        # negative
        (parse_size, "-1GiB", SIZE_HELP, "-1GiB"),
        (parse_rate, "-400Gbps", RATE_HELP, "-400Gbps"),
        (parse_time, "-3us", TIME_HELP, "-3us"),
        (parse_size, -5, SIZE_HELP, "non-negative"),
        (parse_rate, -1.0, RATE_HELP, "non-negative"),
        (parse_time, -1e-3, TIME_HELP, "non-negative"),
        # not finite, zero rate, booleans
        (parse_size, float("inf"), SIZE_HELP, "finite"),
        (parse_size, "1e400B", SIZE_HELP, "finite"),
        (parse_rate, "0Gbps", RATE_HELP, "must be positive"),
        (parse_size, True, SIZE_HELP, "cannot read"),
    ],
)
def test_bad_input_names_the_field_and_what_is_accepted(parse, text, help_, says):
    field, example = help_
    with pytest.raises(UnitError) as info:
        parse(text)
    error = info.value
    assert error.field == field
    message = str(error)
    assert message.startswith(f"{field}: ")
    assert says in message
    assert example in message  # the fix quotes an accepted value


@pytest.mark.parametrize("parse", [parse_size, parse_rate, parse_time])
def test_error_names_the_callers_field(parse):
    with pytest.raises(UnitError) as info:
        parse("1024 parsecs", field="job.buffer")
    assert info.value.field == "job.buffer"
    assert str(info.value).startswith("job.buffer: ")


def test_unit_error_is_a_scenario_error():
    with pytest.raises(ScenarioError):
        parse_size("1024")


@pytest.mark.parametrize(("parse", "text"), [(parse_size, "1kiB"), (parse_rate, "1kiBps")])
def test_lower_case_kibi_is_read_or_refused_cleanly(parse, text):
    try:
        value = parse(text)
    except UnitError:
        return
    assert value == 1024


@pytest.mark.parametrize("value", [0, 0.0, -0.0])
def test_zero_rate_is_refused_as_a_number_too(value):
    with pytest.raises(UnitError, match="must be positive"):
        parse_rate(value)


@pytest.mark.parametrize(
    ("fmt", "value", "text"),
    [
        (format_size, 2**30, "1GiB"),
        (format_size, 1536, "1.5KiB"),
        (format_size, 100, "100B"),
        (format_rate, 50e9, "50GB/s"),
        (format_rate, 12.5e9, "12.5GB/s"),
        (format_time, 0.0123, "12.3ms"),
        (format_time, 3e-6, "3us"),
        (format_time, 2.5, "2.5s"),
    ],
)
def test_format(fmt, value, text):
    assert fmt(value) == text


# Round trips and exact scaling (hypothesis).


@given(st.integers(min_value=0, max_value=2**40))
def test_parse_size_mib_of_integers_is_exact(x):
    assert parse_size(f"{x}MiB") == x * 2**20


@given(finite)
def test_parse_size_scales_any_number(x):
    assert parse_size(f"{x}MiB") == x * 2**20
    assert parse_size(f"{x}GB") == x * 1e9
    assert parse_size(f"{x}Gb") == x * 1e9 / 8


@given(finite.filter(lambda x: x > 0))
def test_parse_rate_scales_any_number(x):
    assert parse_rate(f"{x}Gbps") == x * 125e6
    assert parse_rate(f"{x}GBps") == x * 1e9


@given(finite)
def test_parse_time_scales_any_number(x):
    assert parse_time(f"{x}ms") == x * 1e-3
    assert parse_time(f"{x}us") == x * 1e-6


@given(st.floats(min_value=1e-3, max_value=2.0**60))
def test_format_size_round_trips(x):
    assert parse_size(format_size(x)) == pytest.approx(x, rel=5e-4)  # 4 significant digits


@given(st.floats(min_value=1e-3, max_value=1e16))
def test_format_rate_round_trips(x):
    assert parse_rate(format_rate(x)) == pytest.approx(x, rel=5e-4)


@given(st.floats(min_value=1e-12, max_value=1e5))
def test_format_time_round_trips(x):
    assert parse_time(format_time(x)) == pytest.approx(x, rel=5e-4)
