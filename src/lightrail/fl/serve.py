"""``python -m lightrail.fl.serve``: the federated-learning control plane's supervisor (``lightrail fl serve``).

The supervisor lives in :mod:`lightrail.fl.supervisor`, the demo in :mod:`lightrail.fl.demo` and its data plane in
:mod:`lightrail.fl.data_plane`; this module keeps the names they had here.
"""

from __future__ import annotations

from lightrail.fl.data_plane import DataPlane
from lightrail.fl.demo import demo, demo_population, emulate, start_subprocess
from lightrail.fl.supervisor import PARAM_SERVER, Child, Supervisor, main

__all__ = ["Supervisor", "Child", "PARAM_SERVER", "main", "demo", "demo_population", "emulate", "start_subprocess",
           "DataPlane"]

if __name__ == "__main__":
    main()
