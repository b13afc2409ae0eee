"""``lightrail``: the command line. Verbs parse options, call the library and hand results to ``report/``.

One module per verb group; each registers its commands on :data:`lightrail.cli.app.app` when imported,
and every module of this package is imported here, so a new verb group is one new module.
"""

import importlib
import pkgutil

from lightrail.cli.app import app

__all__ = ["app", "main"]

_NOT_VERBS = {"app", "options", "__main__"}

for _info in pkgutil.iter_modules(__path__):
    if _info.name not in _NOT_VERBS:
        importlib.import_module(f"{__name__}.{_info.name}")


def main() -> None:
    app()
