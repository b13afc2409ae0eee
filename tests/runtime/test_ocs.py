"""OCS drivers: the emulated switch lights exactly the partial permutations it is given, or refuses helpfully."""

from __future__ import annotations

import math

import pytest
from hypothesis import given
from hypothesis import strategies as st

from lightrail.errors import InfeasibleError, LightrailError, ScenarioError
from lightrail.runtime.ocs import DRIVERS, EmulatedOCS, OCSDriver, changed_ports, make_driver


def is_partial_permutation(config: dict[int, int], ports: int) -> bool:
    return (all(isinstance(i, int) and 0 <= i < ports for i in config)
            and all(isinstance(o, int) and 0 <= o < ports for o in config.values())
            and len(set(config.values())) == len(config))


def refused(ocs: EmulatedOCS, changes, error=LightrailError) -> LightrailError:
    """Apply ``changes``, expect ``error``, check nothing changed, and return the error."""
    before, counts = ocs.state(), (ocs.reconfigurations, ocs.circuit_changes)
    with pytest.raises(error) as info:
        ocs.apply(changes, now=5.0)
    assert ocs.state() == before
    assert (ocs.reconfigurations, ocs.circuit_changes) == counts
    with pytest.raises(error):
        ocs.validate(changes)
    return info.value


# --- lighting and timing ---------------------------------------------------------------------------


def test_apply_lights_exactly_the_partial_permutation():
    ocs = EmulatedOCS(ports=8, delay_s=0.02)
    config = {0: 3, 1: 0, 5: 6, 7: 2}
    assert ocs.validate(config) == config
    assert ocs.state() == {}  # validate does not apply
    done = ocs.apply(config, now=10.0)
    assert done == pytest.approx(10.02)
    assert ocs.state() == config
    assert (ocs.reconfigurations, ocs.circuit_changes) == (1, 4)


def test_state_is_a_copy():
    ocs = EmulatedOCS(ports=4)
    ocs.apply({0: 1}, now=0.0)
    ocs.state()[2] = 3
    assert ocs.state() == {0: 1}


def test_lit_is_the_state_without_the_copy_read_only_and_current():
    """``lit()`` (what the controller reads per round) is ``state()`` without the copy: it cannot be written
    through, and after a change it shows the new circuits (the cache is dropped on apply and restore)."""
    ocs = EmulatedOCS(ports=8)
    ocs.apply({0: 1}, now=0.0)
    view = ocs.lit()
    assert view == ocs.state() == {0: 1} and ocs.lit() is view
    with pytest.raises(TypeError):
        view[2] = 3  # type: ignore[index]
    ocs.apply({2: 3}, now=1.0)
    assert ocs.lit() == {0: 1, 2: 3}
    ocs.restore({4: 5})
    assert ocs.lit() == ocs.state() == {4: 5}


def test_reapplying_the_same_circuits_is_free():
    ocs = EmulatedOCS(ports=8, delay_s=0.015)
    ocs.apply({0: 1, 2: 3}, now=1.0)
    assert ocs.apply({0: 1, 2: 3}, now=2.0) == 2.0
    assert ocs.apply({}, now=3.0) == 3.0
    assert ocs.apply({4: None}, now=4.0) == 4.0  # darkening a dark input changes nothing
    assert (ocs.reconfigurations, ocs.circuit_changes) == (1, 2)
    assert ocs.state() == {0: 1, 2: 3}


def test_partial_reconfiguration_keeps_unchanged_circuits():
    ocs = EmulatedOCS(ports=8, delay_s=0.01)
    ocs.apply({0: 1, 2: 3, 4: 5}, now=0.0)
    assert ocs.changed_ports({2: 6}) == {2, 3, 6}  # input 2, its old output 3, its new output 6
    done = ocs.apply({2: 6}, now=1.0)
    assert done == pytest.approx(1.01)
    assert ocs.state() == {0: 1, 2: 6, 4: 5}
    assert ocs.last_changed == {2, 3, 6}
    assert (ocs.reconfigurations, ocs.circuit_changes) == (2, 4)


def test_none_darkens_an_input():
    ocs = EmulatedOCS(ports=4, delay_s=0.01)
    ocs.apply({0: 1, 2: 3}, now=0.0)
    assert ocs.apply({0: None}, now=1.0) == pytest.approx(1.01)
    assert ocs.state() == {2: 3}
    assert ocs.changed_ports({2: None}) == {2, 3}


def test_zero_delay_switch():
    ocs = EmulatedOCS(ports=2, delay_s=0)
    assert ocs.apply({0: 1}, now=7.5) == 7.5
    assert ocs.reconfigurations == 1


# --- refusals ------------------------------------------------------------------------------------------


def test_two_inputs_on_one_output_refused_within_the_change_set():
    ocs = EmulatedOCS(ports=8)
    ocs.apply({6: 7}, now=0.0)
    err = refused(ocs, {0: 1, 2: 1}, InfeasibleError)
    assert err.field == "configuration.2"
    assert "output 1" in str(err) and "0" in str(err)


def test_two_inputs_on_one_output_refused_against_the_current_state():
    ocs = EmulatedOCS(ports=8)
    ocs.apply({0: 1}, now=0.0)
    err = refused(ocs, {2: 1}, InfeasibleError)
    assert err.field == "configuration.2"
    assert "inputs 0 and 2" in err.message and "output 1" in err.message
    assert "{0: None}" in err.fix  # the way out: darken the input already there
    # ... which works when done in the same change set
    ocs.apply({0: None, 2: 1}, now=1.0)
    assert ocs.state() == {2: 1}


def test_swapping_outputs_in_one_change_set_is_fine():
    ocs = EmulatedOCS(ports=4)
    ocs.apply({0: 1, 2: 3}, now=0.0)
    ocs.apply({0: 3, 2: 1}, now=1.0)
    assert ocs.state() == {0: 3, 2: 1}


@pytest.mark.parametrize("port", [-1, 8, 100, "3", 2.5, None, True])
def test_unknown_input_port_refused(port):
    ocs = EmulatedOCS(ports=8)
    err = refused(ocs, {port: 1}, ScenarioError)
    assert err.field == f"configuration.{port!r}"
    assert repr(port) in err.message
    assert "0..7" in err.fix


@pytest.mark.parametrize("port", [-1, 8, "3", 2.5, False])
def test_unknown_output_port_refused(port):
    ocs = EmulatedOCS(ports=8)
    err = refused(ocs, {4: port}, ScenarioError)
    assert err.field == "configuration.4"
    assert f"output {port!r}" in err.message
    assert "0..7" in err.fix


def test_changes_must_be_a_mapping():
    err = refused(EmulatedOCS(ports=4), [(0, 1)], ScenarioError)
    assert err.field == "configuration"


def test_loopback_refused_unless_allowed():
    err = refused(EmulatedOCS(ports=4), {2: 2}, InfeasibleError)
    assert err.field == "configuration.2" and "loopback" in err.message
    ocs = EmulatedOCS(ports=4, allow_loopback=True)
    ocs.apply({2: 2}, now=0.0)
    assert ocs.state() == {2: 2}
    duplex = EmulatedOCS(ports=4, duplex=True, allow_loopback=True)
    duplex.apply({2: 2, 0: 1, 1: 0}, now=0.0)  # a loopback is its own return circuit
    assert duplex.state() == {2: 2, 0: 1, 1: 0}
    refused(EmulatedOCS(ports=4, duplex=True), {2: 2}, InfeasibleError)


# --- duplex ------------------------------------------------------------------------------------------


def test_duplex_refuses_asymmetric_configuration():
    ocs = EmulatedOCS(ports=8, duplex=True)
    err = refused(ocs, {0: 1}, InfeasibleError)
    assert err.field == "configuration.0"
    assert "duplex" in err.message and "1 -> 0" in err.message
    assert "{1: 0}" in err.fix
    refused(ocs, {0: 1, 1: 2, 2: 0}, InfeasibleError)  # a 3-cycle is a permutation but not symmetric


def test_duplex_accepts_symmetric_configuration():
    ocs = EmulatedOCS(ports=8, duplex=True)
    ocs.apply({0: 1, 1: 0, 2: 5, 5: 2}, now=0.0)
    assert ocs.state() == {0: 1, 1: 0, 2: 5, 5: 2}
    assert ocs.changed_ports({0: 2, 2: 0, 1: 5, 5: 1}) == {0, 1, 2, 5}
    ocs.apply({0: 2, 2: 0, 1: 5, 5: 1}, now=1.0)
    assert ocs.state() == {0: 2, 2: 0, 1: 5, 5: 1}
    ocs.apply({0: None, 2: None}, now=2.0)
    assert ocs.state() == {1: 5, 5: 1}


def test_duplex_refuses_breaking_an_existing_circuit():
    ocs = EmulatedOCS(ports=8, duplex=True)
    ocs.apply({0: 1, 1: 0}, now=0.0)
    err = refused(ocs, {0: None}, InfeasibleError)  # darkening one direction only
    assert err.field == "configuration.0" and "1 -> 0" in err.message
    assert "{1: None}" in err.fix
    refused(ocs, {0: 2, 2: 0}, InfeasibleError)  # input 1 would still feed output 0
    refused(ocs, {1: 3, 3: 1}, InfeasibleError)  # input 0 would still feed output 1


def test_simplex_accepts_asymmetric_configuration():
    ocs = EmulatedOCS(ports=3)
    ocs.apply({0: 1, 1: 2, 2: 0}, now=0.0)
    assert ocs.state() == {0: 1, 1: 2, 2: 0}


# --- restore -----------------------------------------------------------------------------------------


def test_restore_sets_state_without_counting():
    ocs = EmulatedOCS(ports=8, duplex=True)
    ocs.apply({3: 4, 4: 3}, now=0.0)
    ocs.restore({0: 1, 1: 0, 6: 7, 7: 6})
    assert ocs.state() == {0: 1, 1: 0, 6: 7, 7: 6}  # replaces, does not merge
    assert ocs.reconfigurations == 1
    assert ocs.apply({0: 1, 1: 0}, now=9.0) == 9.0


@pytest.mark.parametrize(
    ("state", "field"),
    [({0: 1}, "configuration.0"), ({0: 2, 1: 2}, "configuration.1"), ({0: 9}, "configuration.0"),
     ({3: 3}, "configuration.3")],
)
def test_restore_validates(state, field):
    ocs = EmulatedOCS(ports=4, duplex=True)
    ocs.restore({2: 3, 3: 2})
    with pytest.raises(LightrailError) as info:
        ocs.restore(state)
    assert info.value.field == field
    assert ocs.state() == {2: 3, 3: 2}


# --- construction and the registry -----------------------------------------------------------------


@pytest.mark.parametrize(
    ("options", "field"),
    [({"ports": 0}, "ports"), ({"ports": 2.0}, "ports"), ({"ports": True}, "ports"),
     ({"delay_s": -0.001}, "delay_s"), ({"delay_s": math.inf}, "delay_s"), ({"delay_s": math.nan}, "delay_s"),
     ({"delay_s": "10ms"}, "delay_s"), ({"duplex": "false"}, "duplex"), ({"allow_loopback": 1}, "allow_loopback"),
     ({"name": ""}, "name")],
)
def test_bad_constructor_arguments_name_the_option(options, field):
    with pytest.raises(ScenarioError) as info:
        EmulatedOCS(**options)
    assert info.value.field == field
    with pytest.raises(ScenarioError) as info:
        make_driver("emulated", **options)
    assert info.value.field == field


def test_bad_now_refused():
    with pytest.raises(ScenarioError) as info:
        EmulatedOCS(ports=2).apply({0: 1}, now=math.nan)
    assert info.value.field == "now"


def test_registry_and_protocol():
    assert "emulated" in DRIVERS
    ocs = make_driver("emulated", name="ocs1", ports=16, delay_s=0.025, duplex=True)
    assert isinstance(ocs, EmulatedOCS)
    assert isinstance(ocs, OCSDriver)
    assert (ocs.name, ocs.ports, ocs.delay_s, ocs.duplex) == ("ocs1", 16, 0.025, True)
    assert not isinstance(object(), OCSDriver)


def test_make_driver_unknown_name():
    with pytest.raises(ScenarioError) as info:
        make_driver("polatis-typo")
    assert info.value.field == "driver"
    assert "polatis-typo" in info.value.message
    assert "emulated" in info.value.fix


def test_make_driver_unknown_option():
    with pytest.raises(ScenarioError) as info:
        make_driver("emulated", port=8)
    assert info.value.field == "port"
    assert "ports" in info.value.fix and "delay_s" in info.value.fix


# --- properties --------------------------------------------------------------------------------------


@st.composite
def partial_permutations(draw, ports: int):
    outputs = draw(st.permutations(range(ports)))
    lit = draw(st.lists(st.booleans(), min_size=ports, max_size=ports))
    return {i: o for i, (o, on) in enumerate(zip(outputs, lit, strict=True)) if on}


@st.composite
def symmetric_partial_permutations(draw, ports: int, loopbacks: bool = False):
    order = draw(st.permutations(range(ports)))
    config: dict[int, int] = {}
    for a, b in zip(order[::2], order[1::2], strict=False):
        if draw(st.booleans()):
            config[a], config[b] = b, a
    if loopbacks:
        for p in range(ports):
            if p not in config and draw(st.booleans()):
                config[p] = p
    return config


def brute_force_changed(before: dict[int, int], after: dict[int, int], ports: int) -> tuple[set[int], set[int]]:
    inputs = {i for i in range(ports) if before.get(i) != after.get(i)}
    outputs = set()
    for o in range(ports):
        feeding_before = [i for i in range(ports) if before.get(i) == o]
        feeding_after = [i for i in range(ports) if after.get(i) == o]
        if feeding_before != feeding_after:
            outputs.add(o)
    return inputs, outputs


PORTS = 8


@given(partial_permutations(PORTS), partial_permutations(PORTS))
def test_changed_ports_matches_brute_force(before, after):
    assert changed_ports(before, after) == brute_force_changed(before, after, PORTS)


@given(partial_permutations(PORTS), partial_permutations(PORTS), st.floats(0, 1e6))
def test_moving_to_any_target_costs_one_delay_and_darkens_the_changed_ports(before, target, now):
    ocs = EmulatedOCS(ports=PORTS, delay_s=0.01, allow_loopback=True)
    ocs.restore(before)
    changes = {i: target.get(i) for i in range(PORTS) if before.get(i) != target.get(i)}
    inputs, outputs = brute_force_changed(before, target, PORTS)
    assert ocs.changed_ports(changes) == inputs | outputs
    done = ocs.apply(changes, now=now)
    assert ocs.state() == target
    assert done == (now + 0.01 if inputs else now)
    assert ocs.reconfigurations == (1 if inputs else 0)
    assert ocs.circuit_changes == len(inputs)


@given(symmetric_partial_permutations(PORTS), symmetric_partial_permutations(PORTS))
def test_duplex_moves_between_symmetric_configurations(before, target):
    ocs = EmulatedOCS(ports=PORTS, duplex=True)
    ocs.restore(before)
    changes = {i: target.get(i) for i in range(PORTS) if before.get(i) != target.get(i)}
    ocs.apply(changes, now=0.0)
    assert ocs.state() == target


def merge(state: dict[int, int], changes: dict) -> dict[int, int]:
    merged = dict(state)
    for i, o in changes.items():
        if o is None:
            merged.pop(i, None)
        else:
            merged[i] = o
    return merged


@given(st.booleans(), st.data())
def test_random_change_sets_keep_a_valid_state(duplex, data):
    """Change sets are a random part of the way to a random target, plus random noise: often valid, often not."""
    ocs = EmulatedOCS(ports=PORTS, duplex=duplex)
    targets = symmetric_partial_permutations(PORTS) if duplex else partial_permutations(PORTS)
    noise = st.dictionaries(st.integers(0, PORTS - 1), st.none() | st.integers(0, PORTS - 1), max_size=2)
    for _ in range(data.draw(st.integers(1, 10), label="steps")):
        before = ocs.state()
        target = data.draw(targets, label="target")
        diff = sorted(i for i in range(PORTS) if before.get(i) != target.get(i))
        keep = data.draw(st.lists(st.booleans(), min_size=len(diff), max_size=len(diff)), label="keep")
        changes = {i: target.get(i) for i, k in zip(diff, keep, strict=True) if k}
        changes.update(data.draw(st.just({}) | noise, label="noise"))
        merged = merge(before, changes)
        valid = (is_partial_permutation(merged, PORTS)
                 and all(i != o for i, o in merged.items())
                 and (not duplex or all(merged.get(o) == i for i, o in merged.items())))
        if valid:
            inputs, outputs = brute_force_changed(before, merged, PORTS)
            assert ocs.changed_ports(changes) == inputs | outputs
            assert ocs.apply(changes, now=1.0) == (1.0 + ocs.delay_s if inputs else 1.0)
            assert ocs.state() == merged
        else:
            with pytest.raises(LightrailError):
                ocs.validate(changes)
            with pytest.raises(LightrailError):
                ocs.apply(changes, now=1.0)
            assert ocs.state() == before
        assert is_partial_permutation(ocs.state(), PORTS)


def test_state_is_a_copy_that_follows_every_change():
    """state() is cached between changes (the controller asks for it on every decision): the cache must
    never outlive an apply or a restore, and the caller's copy must not write through."""
    ocs = EmulatedOCS(ports=4, delay_s=0.01)
    mine = ocs.state()
    mine[0] = 1
    assert ocs.state() == {}
    ocs.apply({0: 1, 1: 0}, now=0.0)
    assert ocs.state() == {0: 1, 1: 0}
    ocs.apply({0: None}, now=1.0)
    assert ocs.state() == {1: 0}
    ocs.restore({2: 3})
    assert ocs.state() == {2: 3} and ocs.circuits.tx_target[0].tolist() == [-1, -1, 3, -1]
