"""``lightrail``: the command line. Verbs parse options, call the library and hand results to ``report/``.

One module per verb group; each registers its commands on :data:`lightrail.cli.app.app` when imported. Every
module of this package but :data:`NOT_VERBS` is a verb module (:data:`VERB_MODULES`), so a new verb group is one
new module; the app imports them all when its command tree is first read (``lightrail --help``, ``CliRunner``).

Lean start: :func:`main` imports only the modules of the verb a command line names (:data:`VERBS`; a verb not in
it, or no verb, loads them all), so Typer builds one verb's options, not some 60 commands'. A verb module's top
level imports only typer, ``lightrail.cli.options``/``output``/``app``, and light modules (``lightrail.defaults``,
``units``, ``errors``); numpy, scipy, matplotlib, torch, fastapi, the runtime and the library's planners are
imported inside the command that uses them (``tests/cli/test_lean_start.py`` pins it;
``benchmarks/bench_startup.py`` measures it).
"""

import os
import sys

from lightrail.cli.app import app, print_version

__all__ = ["app", "main"]

NOT_VERBS = {"app", "coerce", "options", "output", "plain", "__main__"}
"""Modules of this package that register no verb."""
VERB_MODULES = tuple(sorted(name.removesuffix(".py") for name in os.listdir(__path__[0])
                            if name.endswith(".py") and name.removesuffix(".py") not in NOT_VERBS | {"__init__"}))
"""Every verb module, in the order the app imports them (that order is ``lightrail --help``'s; pkgutil's listing,
without pkgutil's ~5 ms import)."""
VERBS = {
    "algorithms": ("collective",), "calibrate": ("calibrate", "calibrate_iterations"), "check": ("check",),
    "collective": ("collective",), "collective-sweep": ("collective",), "controller": ("controller",),
    "cost": ("rails",), "export": ("export",), "fl": ("fl",), "import": ("importer",), "moe": ("moe",),
    "pipswitch": ("pipswitch",), "report": ("report",), "simulate": ("rails",), "stragglar": ("stragglar",),
    "study": ("study",), "sweep": ("rails",), "te": ("te", "te_serve"), "train-demo": ("train_demo",),
}
"""Each verb (or verb group) and the modules that register it and its subcommands
(``tests/cli/test_lean_start.py`` checks it against what the modules register)."""


def main() -> None:
    args = sys.argv[1:]
    if args == ["--version"]:
        # Answered before Typer runs: Typer builds the whole command tree and imports pydantic to coerce
        # even the root's flag (~0.1 s), all for one line. The root callback prints the same line.
        print_version()
        return
    if args in (["algorithms"], ["algorithms", "--json"]):
        from lightrail.cli.collective import list_algorithms

        list_algorithms(as_json=args[-1] == "--json")  # the same output, without Typer's ~0.13 s
        return
    if args and args[0] in VERBS and "_LIGHTRAIL_COMPLETE" not in os.environ:  # completion reads every verb
        app.load(VERBS[args[0]])
    app()
