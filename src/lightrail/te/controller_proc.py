"""One slice controller as a process: ``python -m lightrail.te.controller_proc --connect HOST:PORT --slice S ...``.

Started by ``lightrail te serve`` (``te.service``), one per slice. It loads the topology and its
paths, compiles its TE problem once (and solves it once to warm up), connects to the network and
says hello; then, for every demand the network publishes, solves the whole network's TE on its own
view of that demand (``service.view``) and answers with the path flows of the demands whose source
is in its slice. It stops on ``stop``, when the connection closes (so it never outlives the
network) or on SIGTERM; it ignores SIGINT (the network stops it in order on Ctrl-C).
"""

from __future__ import annotations

import argparse
import json
import os
import signal
import socket
import sys
import time

__all__ = ["main"]


def _parser() -> argparse.ArgumentParser:
    p = argparse.ArgumentParser(prog="python -m lightrail.te.controller_proc",
                                description="One Symphony slice controller (started by `lightrail te serve`).")
    p.add_argument("--connect", required=True, help="the network's HOST:PORT")
    p.add_argument("--slice", type=int, required=True)
    p.add_argument("--nodes", required=True, help="node indices of the slice, comma-separated")
    p.add_argument("--topology", required=True)
    p.add_argument("--paths", type=int, required=True)
    p.add_argument("--lambda", dest="lam", type=float, required=True)
    p.add_argument("--objective", required=True)
    p.add_argument("--perturbation", type=float, required=True)
    p.add_argument("--seed", type=int, required=True)
    return p


def run(args: argparse.Namespace) -> None:
    import numpy as np

    from lightrail.te.formulations import TeProblem
    from lightrail.te.inputs import load_topology
    from lightrail.te.paths import k_shortest_paths
    from lightrail.te.service import encode, owned_paths, view

    wan = load_topology(args.topology)
    paths = k_shortest_paths(wan, args.paths)
    slice_of = np.full(wan.n, -1)
    slice_of[[int(v) for v in args.nodes.split(",") if v.strip()]] = args.slice
    owned = owned_paths(paths, slice_of, args.slice)
    problem = TeProblem(paths.incidence, paths.path_demand, wan.capacity, args.objective, args.lam)
    problem.solve(np.ones(paths.demands))  # warm up: the first solve sets the solver up
    host, port = args.connect.rsplit(":", 1)
    with socket.create_connection((host, int(port)), timeout=30) as sock:
        sock.settimeout(None)
        sock.setsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY, 1)
        stream = sock.makefile("rwb")
        stream.write(encode({"type": "hello", "slice": args.slice, "pid": os.getpid(), "demands": paths.demands,
                             "paths": paths.paths, "owned": len(owned)}))
        stream.flush()
        for line in stream:
            message = json.loads(line)
            if message.get("type") == "stop":
                break
            if message.get("type") != "demand":
                continue
            epoch = int(message["epoch"])
            start = time.perf_counter()
            try:
                x = problem.solve(view(np.asarray(message["demand"], dtype=float), args.perturbation, args.seed,
                                       args.slice, epoch))
            except Exception as e:  # noqa: BLE001 - a failed solve leaves this epoch unprogrammed, not the process
                stream.write(encode({"type": "error", "slice": args.slice, "epoch": epoch, "message": str(e)}))
            else:
                stream.write(encode({"type": "allocation", "slice": args.slice, "epoch": epoch,
                                     "flows": x[owned].tolist(), "solve_s": time.perf_counter() - start}))
            stream.flush()


def main(argv: list[str] | None = None) -> int:
    signal.signal(signal.SIGINT, signal.SIG_IGN)
    args = _parser().parse_args(argv)
    from lightrail.errors import LightrailError

    try:
        run(args)
    except LightrailError as e:
        print(f"controller of slice {args.slice}: error: {e}", file=sys.stderr)
        return 2
    except (ConnectionError, OSError):
        return 0  # the network went away: nothing left to program
    return 0


if __name__ == "__main__":
    sys.exit(main())
