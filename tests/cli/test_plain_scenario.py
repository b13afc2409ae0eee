"""The CLI's plain scenario reading (``lightrail.cli.plain``) agrees with the pydantic models: the same fields,
defaults and choices; on every example and on many variations of them either the same values (types included)
and the same built objects, or no plain reading at all (pydantic then reads it, or refuses it)."""

from __future__ import annotations

import copy
import pickle
import subprocess
import sys
import typing
from dataclasses import fields
from pathlib import Path

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

import lightrail.scenario as scenario
from lightrail.cli.plain import _REQUIRED, _SECTIONS, PlainScenario, load_scenario
from lightrail.errors import LightrailError
from lightrail.validation import read_mapping

EXAMPLES = sorted((Path(__file__).resolve().parents[2] / "examples").glob("*.yaml"))
MODELS = {"model": "ModelSection", "cluster": "ClusterSection", "parallel": "ParallelSection", "job": "JobSection",
          "ocs": "OcsSection", "engine": "EngineSection"}


def typed(value):
    """``value`` with the type of every part spelled out (``1 == 1.0 == True`` would hide a difference)."""
    if isinstance(value, dict):
        return {k: typed(v) for k, v in value.items()}
    if isinstance(value, list | tuple):
        return [type(value).__name__, [typed(v) for v in value]]
    return [type(value).__name__, value]


def dump(s) -> dict:
    """A scenario's values, section by section (the plain one's and the pydantic one's alike)."""
    out = {"name": s.name, "costs": s.costs, "workload": s.workload}
    out["model"] = s.model if isinstance(s.model, str) or s.model is None else s.model.model_dump()
    for name in ("cluster", "parallel", "job", "ocs", "engine"):
        section = getattr(s, name)
        out[name] = None if section is None else section.model_dump()
    return typed(out)


def built_fields(b) -> dict:
    return {f.name: getattr(b, f.name) for f in fields(b) if f.name != "scenario"}


def agree(data) -> bool:
    """Plain and pydantic read ``data`` alike (or the plain reading declines); True if it was read plainly."""
    plain = PlainScenario.read(copy.deepcopy(data))
    try:
        full = scenario.parse_scenario(copy.deepcopy(data))
    except LightrailError:
        assert plain is None
        return False
    if plain is None:
        return False
    assert dump(plain) == dump(full)
    try:
        want = built_fields(full.build())
    except LightrailError as e:
        with pytest.raises(type(e)) as got:
            plain.build()
        assert (got.value.message, got.value.field, got.value.fix) == (e.message, e.field, e.fix)
        return True
    assert built_fields(plain.build()) == want
    return True


def test_the_sections_declare_the_models_fields():
    """Names in order, defaults, required fields, and the choices of every Literal field."""
    for section, model_name in MODELS.items():
        model = getattr(scenario, model_name)
        declared = _SECTIONS[section]
        assert [name for name, _, _ in declared] == list(model.model_fields), section
        for name, read, default in declared:
            info = model.model_fields[name]
            if default is _REQUIRED:
                assert info.is_required(), (section, name)
                continue
            want = info.get_default(call_default_factory=True)
            assert typed(default() if default is dict else default) == typed(want), (section, name)
            choices = [a for a in typing.get_args(info.annotation) if isinstance(a, str)] or \
                list(typing.get_args(info.annotation)) if typing.get_origin(info.annotation) is typing.Literal \
                else []
            for choice in choices:
                assert read(choice) == choice, (section, name, choice)
    assert list(scenario.Scenario.model_fields) == list(PlainScenario._FIELDS)


@pytest.mark.parametrize("path", EXAMPLES, ids=lambda p: p.name)
def test_every_example_reads_alike(path):
    data = read_mapping(path, field="SCENARIO")
    assert agree(data) == ("workload" not in data)


def test_the_default_scenario_reads_plainly():
    assert agree(scenario.DEFAULT_SCENARIO)
    plain, base = load_scenario(None)
    assert isinstance(plain, PlainScenario) and base is None


ODD = st.one_of(st.none(), st.booleans(), st.integers(-3, 5000), st.floats(-2, 2e4, allow_nan=False),
                st.sampled_from(["", "4", "1.5", "1ms", "10us", "0", "rails", "torus", "ecmp", "pxn", "even",
                                 "balanced", "padded", "gpipe", "on-demand", "on_demand", "h100", "debug", "x"]),
                st.lists(st.integers(0, 8), max_size=3), st.just({}), st.just({"layers": 2}))


@settings(max_examples=300, deadline=None)
@given(st.sampled_from(EXAMPLES[:4] + EXAMPLES[5:]), st.data())
def test_variations_read_alike_or_go_to_pydantic(path, data):
    """A field set to an odd value (of another type, out of bounds, an unknown key), or dropped: the plain
    reading gives pydantic's values or declines."""
    scen = read_mapping(path, field="SCENARIO")
    for _ in range(data.draw(st.integers(1, 3))):
        section = data.draw(st.sampled_from([*MODELS, "name", "costs", "extra"]))
        if section in ("name", "costs", "extra"):
            scen[section] = data.draw(ODD | st.just({"ocs_port_price_usd": 10}))
            continue
        if not isinstance(scen.get(section), dict):
            scen[section] = {} if data.draw(st.booleans()) else scen.get(section)
            continue
        names = [name for name, _, _ in _SECTIONS[section]] + ["unknown"]
        name = data.draw(st.sampled_from(names))
        if data.draw(st.integers(0, 4)) == 0:
            scen[section].pop(name, None)
        else:
            scen[section][name] = data.draw(ODD)
    agree(scen)


def test_the_plain_scenario_is_the_pydantic_one_for_everything_else(tmp_path):
    """Anything beyond the fields and build is the pydantic Scenario's; copies and pickles stay plain."""
    plain, _ = load_scenario(EXAMPLES[0])
    full = scenario.parse_scenario(read_mapping(EXAMPLES[0], field="SCENARIO"))
    assert plain.model_dump(mode="json") == full.model_dump(mode="json")
    assert plain.topology_kind == full.topology_kind
    assert type(copy.deepcopy(plain)) is PlainScenario and dump(copy.deepcopy(plain)) == dump(plain)
    assert dump(pickle.loads(pickle.dumps(plain))) == dump(plain)


def test_simulate_reads_a_plain_file_without_pydantic():
    """The point (issue 33): a plain scenario's simulation never builds a pydantic model (pydantic itself may be
    imported, by ``lightrail.validation``)."""
    tiny = Path(__file__).resolve().parents[2] / "examples" / "debug-tiny.yaml"
    code = ("import contextlib, io, sys; import lightrail.cli\n"
            f"sys.argv = ['lightrail', 'simulate', {str(tiny)!r}, '--json', '--no-ablation']\n"
            "with contextlib.redirect_stdout(io.StringIO()), contextlib.suppress(SystemExit):\n"
            "    lightrail.cli.main()\n"
            "print('pydantic.main' in sys.modules, 'lightrail.scenario' in sys.modules)")
    done = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True, timeout=120)
    assert done.stdout.split() == ["False", "True"]
