"""``lightrail``: the command line. Verbs parse options, call the library and hand results to ``report/``.

One module per verb group; each registers its commands on :data:`lightrail.cli.app.app` when imported,
and every module of this package is imported here, so a new verb group is one new module.

Lean start: a verb module's top level imports only typer, ``lightrail.cli.options``/``output``/``app``, and light
modules (``lightrail.defaults``, ``units``, ``errors``); numpy, scipy, matplotlib, torch, fastapi, the
runtime and the library's planners are imported inside the command that uses them
(``tests/cli/test_lean_start.py`` pins it; ``benchmarks/bench_startup.py`` measures it).
"""

import importlib
import pkgutil
import sys

from lightrail.cli.app import app, print_version

__all__ = ["app", "main"]

_NOT_VERBS = {"app", "options", "__main__"}

for _info in pkgutil.iter_modules(__path__):
    if _info.name not in _NOT_VERBS:
        importlib.import_module(f"{__name__}.{_info.name}")


def main() -> None:
    if sys.argv[1:] == ["--version"]:
        # Answered before Typer runs: Typer builds the whole command tree and imports pydantic to coerce
        # even the root's flag (~0.1 s), all for one line. The root callback prints the same line.
        print_version()
        return
    if sys.argv[1:] in (["algorithms"], ["algorithms", "--json"]):
        from lightrail.cli.collective import list_algorithms

        list_algorithms(as_json=sys.argv[-1] == "--json")  # the same output, without Typer's ~0.13 s
        return
    app()
