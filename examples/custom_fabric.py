"""Use lightrail as a library: build a schedule, prove it, and time it on your own circuits.

Run: .venv/bin/python examples/custom_fabric.py
"""

from lightrail.collectives import generate, verify
from lightrail.fabric import circuits, ring_permutation, switch
from lightrail.sim import Engine
from lightrail.units import format_time, parse_rate, parse_size, parse_time

n = 16
size = parse_size("256MiB")
bandwidth = parse_rate("400Gbps")

# Recursive doubling exchanges with rank xor 2^k; give it those circuits: one optical port per
# step's matching (4 ports for 16 ranks), so every exchange is a direct circuit.
xor_matchings = [[r ^ (1 << k) for r in range(n)] for k in range(4)]
fabrics = {
    "bidirectional ring circuits": circuits(n, [ring_permutation(n), ring_permutation(n, -1)], bandwidth=bandwidth),
    "xor circuits (4 ports)": circuits(n, xor_matchings, bandwidth=bandwidth),
    "electrical switch": switch(n, bandwidth=bandwidth),
}

for algo in ("ring", "recursive-doubling", "halving-doubling"):
    schedule = generate("allreduce", algo, n)
    proof = verify(schedule)  # raises VerificationError with (step, rank, chunk) if it were wrong
    for name, fabric in fabrics.items():
        t = Engine(fabric, alpha=parse_time("3us")).time(schedule, size).time_s
        print(f"{algo:>20} [{proof.method}] on {name:<28} {format_time(t)}")
