"""``lightrail``: the command line. Verbs parse options, call the library and hand results to ``report/``.

One module per verb group; each registers its commands on :data:`lightrail.cli.app.app` when imported.
"""

from lightrail.cli import collective, rails, runtime, stragglar, study  # noqa: F401  (register the verbs)
from lightrail.cli.app import app

__all__ = ["app", "main"]


def main() -> None:
    app()
