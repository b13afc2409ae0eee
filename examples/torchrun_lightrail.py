"""A job on the lightrail backend launched by ``torchrun``: the layout comes from the environment.

torchrun sets ``WORLD_SIZE``, ``RANK`` and ``LOCAL_WORLD_SIZE``. On several machines each machine is a server
(one GPU per rail); when every process runs on one machine, ranks are placed in emulated servers of 2 GPUs, so
the data-parallel groups cross servers and their circuits go through the controller (one server of every rank
would keep all traffic on NVLink: no circuit, no request). ``LIGHTRAIL_GPUS_PER_SERVER`` overrides the server
size (``runtime.launch.torchrun_layout`` says the rule). The parallel degrees come from ``LIGHTRAIL_TP`` /
``LIGHTRAIL_PP`` (default TP = the GPUs of a server, PP 1, DP the rest), the controller from
``LIGHTRAIL_CONTROLLER`` (``host:port``), the job and its token from ``LIGHTRAIL_JOB`` / ``LIGHTRAIL_TOKEN`` (the
operator's ``POST /jobs``). This script is the edge: it reads the environment once and hands the library a plain
``BackendConfig``. Recipe (README, "torchrun")::

    LIGHTRAIL_CONTROLLER=127.0.0.1:7600 LIGHTRAIL_JOB=j1 LIGHTRAIL_TOKEN=... \\
        torchrun --standalone --nnodes 1 --nproc-per-node 8 examples/torchrun_lightrail.py

Each rank trains a small linear model on its own data for a few steps; each data-parallel group all-reduces the
gradients (its circuits lit by the controller on the rails the DP ring crosses). Rank 0 prints one JSON line:
the layout, its DP group, the loss of every step and the backend's stats (``requests``: its controller requests).
``--compare-gloo`` trains again on plain gloo groups of the same ranks and adds their losses
(``gloo_losses``, ``identical``: the backend wraps gloo, so they are bit-identical).
On GPUs set ``LIGHTRAIL_INNER=nccl``.
"""

from __future__ import annotations

import argparse
import json
import os

import torch
import torch.distributed as dist

from lightrail.runtime import torch_backend
from lightrail.runtime.launch import torchrun_layout

STEPS = 5
FEATURES = 16


def config_from_env() -> tuple[torch_backend.BackendConfig, int]:
    world, rank = int(os.environ["WORLD_SIZE"]), int(os.environ["RANK"])
    env = {k: int(os.environ[k]) for k in ("LOCAL_WORLD_SIZE", "LIGHTRAIL_GPUS_PER_SERVER", "LIGHTRAIL_TP",
                                           "LIGHTRAIL_PP") if os.environ.get(k)}
    layout = torchrun_layout(world, local_world=env.get("LOCAL_WORLD_SIZE"),
                             gpus_per_server=env.get("LIGHTRAIL_GPUS_PER_SERVER"), tp=env.get("LIGHTRAIL_TP"),
                             pp=env.get("LIGHTRAIL_PP", 1))
    config = torch_backend.BackendConfig(layout=layout, controller=os.environ.get("LIGHTRAIL_CONTROLLER"),
                                         job=os.environ.get("LIGHTRAIL_JOB", "job"),
                                         token=os.environ.get("LIGHTRAIL_TOKEN"),
                                         inner=os.environ.get("LIGHTRAIL_INNER", "gloo"))
    return config, rank


def train(rank: int, members: list[int], group) -> list[float]:
    """A few SGD steps of a linear model, gradients averaged over the DP group; the DP-mean loss per step."""
    torch.manual_seed(0)  # the same initial weights on every rank
    model = torch.nn.Linear(FEATURES, 1)
    data = torch.Generator().manual_seed(1000 + rank)  # each rank its own shard
    x, target = torch.randn(64, FEATURES, generator=data), torch.randn(64, 1, generator=data)
    opt = torch.optim.SGD(model.parameters(), lr=0.1)
    losses = []
    for _ in range(STEPS):
        opt.zero_grad()
        loss = torch.nn.functional.mse_loss(model(x), target)
        loss.backward()
        for p in model.parameters():
            dist.all_reduce(p.grad, group=group)
            p.grad /= len(members)
        opt.step()
        mean = loss.detach().reshape(1).clone()
        dist.all_reduce(mean, group=group)
        losses.append(float(mean) / len(members))
    return losses


def dp_group(layout, rank: int, backend: str | None = None):
    """This rank's DP group (members, group); every rank creates every group, in the same order."""
    mine = None
    for members in ([int(r) for r in g] for g in layout.groups("dp")):
        group = dist.new_group(members, backend=backend)
        if rank in members:
            mine = (members, group)
    return mine


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--compare-gloo", action="store_true",
                        help="train again on plain gloo groups of the same ranks and print both losses")
    compare = parser.parse_args().compare_gloo
    config, rank = config_from_env()
    agent = torch_backend.setup(config)
    dist.init_process_group("lightrail")  # torchrun's env:// rendezvous: MASTER_ADDR, RANK, WORLD_SIZE
    layout, world = config.layout, dist.get_world_size()
    members, group = dp_group(layout, rank)  # lightrail groups, as the default group
    losses = train(rank, members, group)
    stats = agent.stats()  # before the gloo run, which never asks the controller
    line = {"world": world, "layout": str(layout), "servers": layout.servers, "dp_group": members,
            "losses": losses, "requests": stats["requests"], "stats": stats}
    if compare:
        gloo_losses = train(rank, *dp_group(layout, rank, backend="gloo"))
        line |= {"gloo_losses": gloo_losses, "identical": gloo_losses == losses}
    dist.barrier()
    if rank == 0:
        print(json.dumps(line), flush=True)
    dist.destroy_process_group()
    agent.close()


if __name__ == "__main__":
    main()
