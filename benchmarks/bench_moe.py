"""MoE dispatch benchmark: payload-efficient pipelined vs padded (GShard) vs un-pipelined dispatch on gloo/CPU.

Prints one JSON object (the ``lightrail moe bench --json`` object plus the machine); asserts nothing about speed.
Defaults are the issue's contract sizes (8 ranks, 8,192 tokens, 64 experts, top-2, hidden 1,024, expert width
1,024): about a minute on 2 cores. Smaller: ``--ranks 4 --tokens 1024 --experts 16 --hidden 256``.

Run: .venv/bin/python benchmarks/bench_moe.py [--ranks R --tokens T --experts E --topk K --hidden H --tiles N]
"""

from __future__ import annotations

import argparse
import json
import os
import platform
import sys

import torch

from lightrail.moe.bench import BenchConfig, run_bench


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    defaults = BenchConfig()
    for name in ("ranks", "tokens", "experts", "topk", "hidden", "ffn", "tiles", "iters", "warmup"):
        parser.add_argument(f"--{name}", type=int, default=getattr(defaults, name))
    parser.add_argument("--capacity-factor", type=float, default=defaults.capacity_factor)
    args = parser.parse_args()
    cfg = BenchConfig(ranks=args.ranks, tokens=args.tokens, experts=args.experts, topk=args.topk, hidden=args.hidden,
                      ffn=args.ffn, tiles=args.tiles, iters=args.iters, warmup=args.warmup,
                      capacity_factor=args.capacity_factor)
    result = run_bench(cfg)
    result.pop("variants")
    result["machine"] = {"platform": platform.platform(), "python": sys.version.split()[0], "torch": torch.__version__,
                         "cpus": os.cpu_count()}
    print(json.dumps(result, indent=2))


if __name__ == "__main__":
    main()
