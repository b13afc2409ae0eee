"""The house's layers, read from the source (an AST scan of every import, function-local ones included).

The core: units < fabric < collectives < workload < timing < control < sim (DESIGN.md), with the loose top-level
modules placed on a floor; lower floors never import higher ones, and the core packages import each other in no
circle. The wings (``runtime``, ``te``, ``fl``, ``moe``) stand on the core and on the public faces (``web``, the
runtime's launcher): no wing or core module imports ``studies``, ``report``, ``cli`` or ``api``, and the core
imports no wing. The faces on top go studies < report < cli < api. Files are renamed into place by one helper
(``lightrail.atomic.write_atomic``), which reports and the services' own state both call.
"""

from __future__ import annotations

import ast
from pathlib import Path

import pytest

SRC = Path(__file__).resolve().parents[1] / "src" / "lightrail"

CORE = {  # the room (first name under lightrail) -> its floor
    "errors": 0, "units": 0, "limits": 0, "defaults": 0, "validation": 0, "web": 0,
    "atomic": 0,  # the one atomic-file writer: reports and the services' own state
    "fabric": 1,
    "collectives": 2, "catalog": 2,  # catalog: the registry's listing, read from source (kept apart: no numpy)
    "workload": 3,
    "timing": 4, "sharing": 4, "nccl": 4, "nccl_cost": 4,
    "control": 5,
    "sim": 6,
    "scenario": 7,  # builds fabric, workload, plan and engine terms from a scenario file
}
WINGS = {"runtime", "te", "fl", "moe"}
FACES = {"studies": 0, "report": 1, "cli": 2, "api": 3}  # the NCCL fit is a study: studies/calibrate_nccl.py
PUBLIC = {("moe", "runtime.launch")}  # a wing may use another wing's public face: the runtime's launcher
KNOWN: dict[tuple[str, str], str] = {}  # edges that break a rule today, each with why it is still here


def _room(module: str) -> str:
    return module.split(".")[0] if module else ""


def _imports() -> list[tuple[str, str]]:
    """(importing module, imported module), both relative to ``lightrail`` ("" is the package itself)."""
    out = []
    for path in sorted(SRC.rglob("*.py")):
        parts = path.relative_to(SRC).with_suffix("").parts
        module = ".".join(parts[:-1] if parts[-1] == "__init__" else parts)
        for node in ast.walk(ast.parse(path.read_text(), str(path))):
            names = []
            if isinstance(node, ast.ImportFrom) and node.level == 0 and node.module:
                names = [node.module] + [f"{node.module}.{a.name}" for a in node.names]
                names = [n for n in names[:1] if n.split(".")[0] == "lightrail"]
            elif isinstance(node, ast.Import):
                names = [a.name for a in node.names if a.name.split(".")[0] == "lightrail"]
            out += [(module, name.removeprefix("lightrail").lstrip(".")) for name in names]
    return out


IMPORTS = _imports()


def _broken(rule) -> set[tuple[str, str]]:
    return {(a, b) for a, b in IMPORTS if _room(b) and _room(a) != _room(b) and rule(_room(a), _room(b), b)}


def _check(rule) -> None:
    bad = {edge: None for edge in sorted(_broken(rule))}
    unknown = [f"{a} imports {b}" for a, b in bad if (a, b) not in KNOWN]
    assert not unknown, unknown


def test_every_room_has_a_floor():
    rooms = {p.stem if p.is_file() else p.name for p in SRC.iterdir()
             if p.suffix == ".py" or (p / "__init__.py").exists()}
    assert rooms - {"__init__"} <= set(CORE) | WINGS | set(FACES), rooms - set(CORE) - WINGS - set(FACES)


def test_no_core_room_imports_a_higher_floor():
    _check(lambda a, b, _: a in CORE and b in CORE and CORE[b] > CORE[a])


def test_the_core_imports_no_wing_and_no_face():
    _check(lambda a, b, _: a in CORE and b not in CORE)


def test_wings_stand_on_the_core_and_public_faces():
    _check(lambda a, b, name: a in WINGS and b not in CORE and not any(
        a == w and (name == p or name.startswith(p + ".")) for w, p in PUBLIC))


def test_faces_keep_their_order():
    _check(lambda a, b, _: a in FACES and b in FACES and FACES[b] > FACES[a])


def test_no_import_circle_between_core_packages_or_modules():
    core = [(a, b) for a, b in IMPORTS if _room(a) in CORE and _room(b) in CORE]
    for level in ("package", "module"):
        graph: dict[str, set[str]] = {}
        for a, b in core:
            a, b = (_room(a), _room(b)) if level == "package" else (a, b)
            if a != b and not a.startswith(b + "."):  # a module reading its own package's listing is no circle
                graph.setdefault(a, set()).add(b)
        assert not _cycle(graph), f"{level} circle: {' -> '.join(_cycle(graph))}"


def _cycle(graph: dict[str, set[str]]) -> list[str]:
    state: dict[str, int] = {}
    stack: list[str] = []

    def visit(node: str) -> list[str]:
        state[node] = 1
        stack.append(node)
        for nxt in sorted(graph.get(node, ())):
            if state.get(nxt) == 1:
                return stack[stack.index(nxt):] + [nxt]
            if nxt not in state and (found := visit(nxt)):
                return found
        stack.pop()
        state[node] = 2
        return []

    for node in sorted(graph):
        if node not in state and (found := visit(node)):
            return found
    return []


def test_one_atomic_writer():
    """No module but ``lightrail/atomic.py`` renames a file into place or makes its own temporary file to rename:
    a service's state and a report are written whole by the same helper (durable for a service)."""
    calls = []
    for path in sorted(SRC.rglob("*.py")):
        for node in ast.walk(ast.parse(path.read_text(), str(path))):
            if isinstance(node, ast.Call) and isinstance(node.func, ast.Attribute) and (
                    (isinstance(node.func.value, ast.Name) and node.func.value.id == "os"
                     and node.func.attr in ("replace", "rename", "renames"))
                    or node.func.attr == "mkstemp"):
                calls.append(f"{path.relative_to(SRC)}:{node.lineno} {node.func.attr}")
    assert calls and all(c.startswith("atomic.py:") for c in calls), calls


@pytest.mark.parametrize("edge", sorted(KNOWN))
def test_every_known_exception_is_still_there(edge):
    """An exception that was fixed comes off the list (so it cannot come back unseen)."""
    assert edge in set(IMPORTS), f"{edge} no longer imported: remove it from KNOWN"


def test_no_source_file_is_over_600_lines():
    """A room with two jobs becomes two rooms (DESIGN.md; issue 32): no module of the package passes 600 lines."""
    long = {str(p.relative_to(SRC)): n for p in SRC.rglob("*.py") if (n := len(p.read_text().splitlines())) > 600}
    assert not long, long
