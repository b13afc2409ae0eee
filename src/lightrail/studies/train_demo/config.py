"""The train demo's settings (``DemoConfig``), its deterministic parameters and data (drawn per seed, layer and
name; per seed, step and microbatch), and its process groups (one per dimension, never the default group).
"""

from __future__ import annotations

import hashlib
import math
from dataclasses import dataclass, fields

import torch
import torch.distributed as dist

from lightrail.errors import ScenarioError
from lightrail.workload.parallel import Dim, Layout

_GROUP_DIMS = (Dim.TP, Dim.DP, Dim.PP)
"""Order in which every rank creates the groups (all of one dimension before the next)."""


@dataclass(frozen=True)
class DemoConfig:
    """Model, batch and parallel layout of the demo; checked on construction.

    ``microbatches`` is per DP replica per step (a step's global batch is ``dp * microbatches *
    micro_batch`` sequences). ``ranks`` is optional and, when given, must equal ``tp * pp * dp``.
    """

    vocab: int = 256
    seq: int = 32
    d_model: int = 64
    heads: int = 4
    layers: int = 4
    micro_batch: int = 4
    microbatches: int = 4
    steps: int = 20
    lr: float = 1e-3
    seed: int = 0
    tp: int = 2
    pp: int = 2
    dp: int = 2
    ranks: int | None = None

    def __post_init__(self):
        for f in fields(self):
            value = getattr(self, f.name)
            if f.name in ("lr", "seed") or (f.name == "ranks" and value is None):
                continue
            if isinstance(value, bool) or not isinstance(value, int) or value < 1:
                raise ScenarioError(f"{f.name}={value!r} must be a positive integer", field=_flag(f.name))
        if not isinstance(self.seed, int) or isinstance(self.seed, bool) or self.seed < 0:
            raise ScenarioError(f"seed={self.seed!r} must be a non-negative integer", field="--seed")
        if not isinstance(self.lr, int | float) or not math.isfinite(self.lr) or self.lr <= 0:
            raise ScenarioError(f"lr={self.lr!r} must be a positive number", field="--lr", fix="e.g. 1e-3")
        product = self.tp * self.pp * self.dp
        if self.ranks is not None and self.ranks != product:
            raise ScenarioError(f"tp({self.tp}) * pp({self.pp}) * dp({self.dp}) = {product} != ranks({self.ranks})",
                                field="--ranks", fix=f"use --ranks {product} or change --tp/--pp/--dp")
        if self.vocab < 2:
            raise ScenarioError(f"vocab={self.vocab} needs at least 2 tokens", field="--vocab")
        if self.d_model % self.heads:
            raise ScenarioError(f"d_model={self.d_model} is not divisible by heads={self.heads}", field="--heads",
                                fix=f"use a divisor of {self.d_model}")
        if self.heads % self.tp:
            raise ScenarioError(f"heads={self.heads} are not divisible by tp={self.tp}", field="--tp",
                                fix=f"use a divisor of {self.heads}: each TP rank holds whole heads")
        if self.layers % self.pp:
            raise ScenarioError(f"layers={self.layers} are not divisible by pp={self.pp}", field="--pp",
                                fix=f"use a divisor of {self.layers}: every stage holds the same number of layers")

    @property
    def world(self) -> int:
        return self.tp * self.pp * self.dp

    def layout(self) -> Layout:
        """Rank layout; servers are as large as the job (group membership does not depend on them)."""
        return Layout.from_degrees(self.world, tp=self.tp, pp=self.pp, dp=self.dp, gpus_per_server=self.world)


def _flag(name: str) -> str:
    return "--" + name.replace("_", "-")


def _seed(*parts) -> int:
    """A stable 63-bit seed from parts (Python's ``hash`` of str varies between processes)."""
    return int.from_bytes(hashlib.blake2b(repr(parts).encode(), digest_size=8).digest(), "little") >> 1


def _normal(config: DemoConfig, layer: int | str, name: str, shape: tuple[int, ...], std: float) -> torch.Tensor:
    g = torch.Generator().manual_seed(_seed(config.seed, layer, name))
    return torch.randn(shape, generator=g) * std


def _batch(config: DemoConfig, step: int, index: int) -> tuple[torch.Tensor, torch.Tensor]:
    """Global microbatch ``index`` of ``step``: (inputs, targets), each (micro_batch, seq) int64.

    Each sequence counts from a random start by a random stride of 1-3 (mod vocab): learnable from
    the previous two tokens, and the bigram alone already brings the loss from ln(vocab) to ~ln 3.
    """
    g = torch.Generator().manual_seed(_seed(config.seed, "data", step, index))
    start = torch.randint(config.vocab, (config.micro_batch, 1), generator=g)
    stride = torch.randint(1, 4, (config.micro_batch, 1), generator=g)
    tokens = (start + stride * torch.arange(config.seq + 1)) % config.vocab
    return tokens[:, :-1], tokens[:, 1:]


def _make_groups(layout: Layout, rank: int, backend: str | None = None) -> dict[Dim, dist.ProcessGroup | None]:
    """Create every TP, DP and PP group (dimensions of degree 1 get none) in the same order on all ranks,
    on ``backend`` (default: the default group's).

    Returns the groups this rank belongs to; None for a dimension of degree 1.
    """
    mine: dict[Dim, dist.ProcessGroup | None] = {}
    for dim in _GROUP_DIMS:
        mine[dim] = None
        if layout.degree(dim) == 1:
            continue
        for i, ranks in enumerate(layout.groups(dim).tolist()):
            group = dist.new_group(ranks, group_desc=f"{dim.value}{i}{'-' + backend if backend else ''}",
                                   backend=backend)
            if rank in ranks:
                mine[dim] = group
    return mine


def _bits(value: float) -> int:
    """The float32 bit pattern of ``value`` as an int."""
    return int(torch.tensor([value], dtype=torch.float32).view(torch.int32).item())
