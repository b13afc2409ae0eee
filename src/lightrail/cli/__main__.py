"""``python -m lightrail.cli``: the same as the ``lightrail`` command."""

from lightrail.cli import main

main()
