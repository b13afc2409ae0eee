"""A job on the lightrail backend launched by ``torchrun``: the layout comes from the environment.

torchrun sets ``WORLD_SIZE``, ``RANK`` and ``LOCAL_WORLD_SIZE`` (processes per node: the GPUs of one server,
one rail each; ``LIGHTRAIL_GPUS_PER_SERVER`` overrides it, e.g. to emulate several servers on one machine).
The parallel degrees come from ``LIGHTRAIL_TP`` / ``LIGHTRAIL_PP`` (default TP = the GPUs of a server, PP 1,
DP the rest), the controller from ``LIGHTRAIL_CONTROLLER`` (``host:port``), the job and its token from
``LIGHTRAIL_JOB`` / ``LIGHTRAIL_TOKEN`` (the operator's ``POST /jobs``). This script is the edge: it reads the
environment once and hands the library a plain ``BackendConfig``. Recipe (README, "torchrun")::

    LIGHTRAIL_CONTROLLER=127.0.0.1:7600 LIGHTRAIL_JOB=j1 LIGHTRAIL_TOKEN=... LIGHTRAIL_TP=2 \
        torchrun --standalone --nnodes 1 --nproc-per-node 8 examples/torchrun_lightrail.py

Each data-parallel group all-reduces a tensor of its ranks' ids a few times (its circuits are lit by the
controller on the rails the DP ring crosses) and rank 0 prints one JSON line: the sums and the backend's stats.
On GPUs set ``LIGHTRAIL_INNER=nccl``.
"""

from __future__ import annotations

import json
import os

import torch
import torch.distributed as dist

from lightrail.runtime import torch_backend
from lightrail.workload.parallel import Layout


def config_from_env() -> tuple[torch_backend.BackendConfig, int]:
    world, rank = int(os.environ["WORLD_SIZE"]), int(os.environ["RANK"])
    per_server = int(os.environ.get("LIGHTRAIL_GPUS_PER_SERVER", os.environ.get("LOCAL_WORLD_SIZE", world)))
    tp = int(os.environ.get("LIGHTRAIL_TP", per_server))
    pp = int(os.environ.get("LIGHTRAIL_PP", 1))
    layout = Layout.from_degrees(world, tp=tp, pp=pp, gpus_per_server=per_server)
    config = torch_backend.BackendConfig(layout=layout, controller=os.environ.get("LIGHTRAIL_CONTROLLER"),
                                         job=os.environ.get("LIGHTRAIL_JOB", "job"),
                                         token=os.environ.get("LIGHTRAIL_TOKEN"),
                                         inner=os.environ.get("LIGHTRAIL_INNER", "gloo"))
    return config, rank


def main() -> None:
    config, rank = config_from_env()
    agent = torch_backend.setup(config)
    dist.init_process_group("lightrail")  # torchrun's env:// rendezvous: MASTER_ADDR, RANK, WORLD_SIZE
    layout, world = config.layout, dist.get_world_size()
    groups = [[int(r) for r in g] for g in layout.groups("dp")]  # every rank creates every group, in order
    mine = None
    for members in groups:
        group = dist.new_group(members)
        if rank in members:
            mine = (members, group)
    members, group = mine
    x = torch.full((1024,), float(rank))
    for _ in range(3):
        y = x.clone()
        dist.all_reduce(y, group=group)
    dist.barrier()
    if rank == 0:
        print(json.dumps({"world": world, "dp_group": members, "sum": float(y[0]), "expected": float(sum(members)),
                          "stats": agent.stats()}), flush=True)
    dist.destroy_process_group()
    agent.close()


if __name__ == "__main__":
    main()
