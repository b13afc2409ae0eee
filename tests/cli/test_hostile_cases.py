"""The issue's hostile CLI inputs, one by one (issue 17, item 7): each that once ended in a traceback, ran without
bound or blamed the wrong field now prints one line naming the right field, exits 2 and writes nothing; JSON
output is strict. The helpers behind them (bounded reads, nesting limits, writability, strict JSON) are checked
directly too."""

from __future__ import annotations

import json
import math
import os
import warnings
from pathlib import Path

import pytest
from hypothesis import given
from hypothesis import strategies as st
from typer.testing import CliRunner

from lightrail.cli import app
from lightrail.errors import ScenarioError
from lightrail.report.files import check_writable, dumps_json, finite
from lightrail.validation import MAX_DEPTH, read_bounded, read_mapping

runner = CliRunner()

HF = {"hidden_size": 64, "num_attention_heads": 4, "num_hidden_layers": 2, "vocab_size": 128,
      "intermediate_size": 128, "max_position_embeddings": 256, "model_type": "llama"}


def scenario(gpus: int = 32, micro_batches: int = 6, model: str = "{preset: debug}") -> str:
    return f"model: {model}\ncluster: {{gpus: {gpus}, gpus_per_server: 4}}\njob: {{micro_batches: {micro_batches}}}\n"


@pytest.fixture
def scratch(tmp_path: Path, monkeypatch) -> Path:
    """A working folder with the files the cases name; the command runs inside it."""
    (tmp_path / "afile").write_text("a file, not a folder\n")
    (tmp_path / "gpus.yaml").write_text(scenario(gpus=10_000_000))
    (tmp_path / "mb.yaml").write_text(scenario(micro_batches=100_000))
    (tmp_path / "zero.yaml").write_text(scenario(model="{hf_config: /dev/zero, seq_len: 128}"))
    (tmp_path / "fifo.yaml").write_text(scenario(model="{hf_config: config.fifo, seq_len: 128}"))
    os.mkfifo(tmp_path / "config.fifo")  # opening it would block: it must be refused unopened
    (tmp_path / "deep.yaml").write_text("a: " + "[" * 100_000 + "]" * 100_000 + "\n")
    (tmp_path / "deep.json").write_text('{"a": ' + "[" * 100_000 + "]" * 100_000 + "}")
    (tmp_path / "deep-block.yaml").write_text("".join(" " * i + f"k{i}:\n" for i in range(200)))
    (tmp_path / "bomb.yaml").write_text('a: &a ["x","x","x","x","x","x","x","x","x"]\n' + "".join(
        f"{c}: &{c} [{','.join(['*' + p] * 9)}]\n" for p, c in zip("abcdefg", "bcdefgh", strict=True)))
    base = "scenario: {model: {preset: debug}, cluster: {gpus: 32, gpus_per_server: 4}, job: {micro_batches: 6}}\n"
    (tmp_path / "range.yaml").write_text(base + "grid: {job.micro_batches: 1..100000000}\n")
    (tmp_path / "product.yaml").write_text(base + "grid: {job.micro_batches: 1..3000, job.dp_buckets: 1..2000}\n")
    (tmp_path / "listed.yaml").write_text(base + "grid: {job.micro_batches: 1..1000}\nlist: ["
                                          + ", ".join(["{ocs.mode: provisioned}"] * 101) + "]\n")
    (tmp_path / "layers.yaml").write_text(scenario(model="{preset: debug, overrides: {layers: 1000000000}}"))
    (tmp_path / "digits.yaml").write_text(scenario(model="{preset: debug, overrides: {layers: 1%s}}" % ("0" * 4000)))
    (tmp_path / "hidden.yaml").write_text(scenario(model="{preset: debug, overrides: {hidden: 4294967296}}"))
    (tmp_path / "ring500.json").write_text(json.dumps({"name": "ring500", "nodes": [f"n{i}" for i in range(500)],
                                                       "links": [{"a": f"n{i}", "b": f"n{(i + 1) % 500}"}
                                                                 for i in range(500)]}))
    monkeypatch.chdir(tmp_path)
    monkeypatch.setenv("LIGHTRAIL_MEMORY_BUDGET", str(8 << 30))  # what is refused must not depend on the machine
    return tmp_path


DELAYS_10K = ",".join(f"{k}us" for k in range(10_000))
DELAYS_1001 = ",".join(f"{k}us" for k in range(1_001))  # one above the bound of 1,000 (once accepted)
SIZES_1001 = ",".join(f"{k + 1}KiB" for k in range(1_001))

CASES = [
    # --- once a traceback: the output folder was found unwritable after the work ------------------------------
    ("collective-sweep --ranks 8 --out afile", "--out"),
    ("collective-sweep --ranks 8 --out afile/sub", "--out"),
    ("collective-sweep --ranks 8 --out /proc/lightrail-hostile", "--out"),
    ("stragglar sweep --out afile", "--out"),
    ("study collectives --out afile", "--out"),
    ("study scaleup --out afile", "--out"),
    ("study fl --out afile", "--out"),
    ("study te --out afile", "--out"),
    ("simulate --out afile", "--out"),
    ("sweep --out afile", "--out"),
    ("te run --out afile", "--out"),
    ("moe bench --out afile", "--out"),
    # --- once a traceback: sizes this machine cannot hold -----------------------------------------------------
    ("collective --ranks 100000", "--ranks"),
    ("collective --ranks 100000000000000000000", "--ranks"),
    ("collective-sweep --ranks 100000 --json", "--ranks"),
    ("collective --op alltoall --algo bruck --ranks 65536", "--ranks"),
    ("collective --ranks 65536 --topology fat-tree", "--ranks"),
    ("collective --ranks 65536 --reconfigurable", "--ranks"),
    ("collective --pipeline 1000000000 --algo double-binary-tree", "--pipeline"),
    ("stragglar rounds --ranks 100000000", "--ranks"),
    ("stragglar compare --ranks 100000000", "--ranks"),
    ("stragglar run --ranks 100000", "--ranks"),
    ("stragglar run --repeats 100000000", "--repeats"),
    ("study collectives --ranks 100000 --json", "--ranks"),
    ("study scaleup --racks 100000000 --json", "--racks"),
    ("study scaleup --requests 1000000000 --json", "--requests"),
    ("study fl --clients 1000000000 --json", "--clients"),
    ("study te --matrices 100000000 --json", "--matrices"),
    ("simulate gpus.yaml --json", "cluster.gpus"),
    ("check gpus.yaml", "cluster.gpus"),
    ("moe bench --ranks 100000", "--ranks"),
    ("moe bench --hidden 1000000", "--hidden"),
    ("fl demo --clients 1000000000", "--clients"),
    ("te serve --epochs 1000000000", "--epochs"),
    # --- once a traceback: numbers that are not finite, or that overflow what reads them ----------------------
    ("collective --oversubscription nan --topology fat-tree", "--oversubscription"),
    ("collective --oversubscription inf --topology fat-tree", "--oversubscription"),
    ("stragglar sweep --straggler-delays 1e300s --json", "--straggler-delays"),
    ("stragglar compare --straggler-delay 1e300s", "--straggler-delay"),
    ("te run --lambda 1e308", "--lambda"),
    ("te run --load 1e-320", "--load"),
    ("study te --seed -1 --json", "--seed"),
    ("study scaleup --load 1e-320 --json", "--load"),
    ("study scaleup --mtbf-hours 1e-320 --json", "--mtbf-hours"),
    ("te run --slicers , --json", "--slicers"),
    ("te serve --interval nan", "--interval"),
    # --- once a traceback: files that are not what they claim -------------------------------------------------
    ("check zero.yaml", "model.hf_config"),
    ("check fifo.yaml", "model.hf_config"),
    ("check deep.yaml", "FILE"),  # check reads scenario and sweep files: its argument is FILE (issue 33)
    ("check deep.json", "FILE"),
    ("check deep-block.yaml", "FILE"),
    ("check bomb.yaml", "FILE"),
    ("check /dev/zero", "FILE"),
    ("study scaleup --trace /dev/zero --json", "--trace"),
    ("te serve --allocations afile/x", "--allocations"),
    ("fl serve --data afile", "--data"),
    # --- once unbounded (past 60 s): now refused above a documented bound -------------------------------------
    ("stragglar rounds --ranks 2..100000000", "--ranks"),
    ("stragglar rounds --ranks 2..3000", "--ranks"),
    ("stragglar sweep --ranks 2..100000 --json", "--ranks"),
    ("simulate mb.yaml --json", "job.micro_batches"),
    (f"sweep --ocs-delays {DELAYS_10K} --json", "--ocs-delays"),
    (f"stragglar sweep --straggler-delays {DELAYS_10K} --json", "--straggler-delays"),
    ("study collectives --ops alltoall --ranks 2..5000 --json", "--ranks"),
    # --- once unbounded (issue 31): ranges and grids bounded before they are built, model sizes, TE's matrices -----
    (f"sweep --ocs-delays {DELAYS_1001} --json", "--ocs-delays"),
    (f"study collectives --ocs-delays {DELAYS_1001} --json", "--ocs-delays"),
    (f"collective-sweep --ranks 8 --sizes {SIZES_1001} --json", "--sizes"),
    (f"study collectives --sizes {SIZES_1001} --json", "--sizes"),
    ("collective-sweep --ranks 8 --sizes 1B..1e300GiB --json", "--sizes"),
    ("sweep range.yaml --local --json", "grid.job.micro_batches"),  # 12.9 GB before
    ("sweep product.yaml --local --json", "grid"),  # 6,000,000 cells
    ("sweep listed.yaml --local --json", "grid"),  # 1,000 x 101 listed cells
    ("check layers.yaml", "model.overrides.layers"),  # past 60 s before
    ("simulate layers.yaml --json", "model.overrides.layers"),
    ("check digits.yaml", "model.overrides.layers"),  # a 4,000-digit parameter count before
    ("check hidden.yaml", "model.overrides.hidden"),
    ("te run --topology ring500.json --json", "--topology"),  # 500 nodes: its memory estimated, refused up front
    # --- once blamed on the wrong field -----------------------------------------------------------------------
    ("collective --ranks 0", "--ranks"),  # was --root
    ("study scaleup --mtbf-hours nan --json", "--mtbf-hours"),  # was mtbf
    ("study te --lambdas nan --json", "--lambdas"),  # was --lambda
    ("study te --slice-counts 100 --json", "--slice-counts"),  # was --slices, after minutes of solves
    ("cost --gpus 3", "--gpus"),  # was cluster.gpus
    ("cost --gpus-per-server 0", "--gpus-per-server"),  # was cluster.gpus_per_server
    ("te run --load inf", "--load"),  # was demand
]


@pytest.mark.parametrize(("command", "field"), CASES, ids=[c[:60] for c, _ in CASES])
def test_hostile_input_is_one_line_naming_the_field(command: str, field: str, scratch: Path):
    if command.startswith(("te ", "study te")):
        pytest.importorskip("highspy")
    before = sorted(scratch.rglob("*"))
    result = runner.invoke(app, command.split())
    assert result.exception is None or isinstance(result.exception, SystemExit), repr(result.exception)
    assert result.exit_code == 2, result.output
    lines = result.output.strip().splitlines()
    assert len(lines) == 1, result.output
    assert lines[0].startswith(f"error: {field}:"), lines[0]
    assert sorted(scratch.rglob("*")) == before, "wrote files"


def _strict(text: str):
    return json.loads(text, parse_constant=lambda c: (_ for _ in ()).throw(ValueError(f"{c} is not JSON")))


def test_json_never_prints_infinity(scratch: Path):
    """A link of 1e-300 b/s takes forever: the time is null, not ``Infinity``, and the rest is intact (and no
    numpy overflow warning reaches the terminal)."""
    with warnings.catch_warnings():
        warnings.simplefilter("error", RuntimeWarning)
        result = runner.invoke(app, ["collective", "--ranks", "8", "--bandwidth", "1e-300bps", "--json"])
    assert result.exit_code == 0, result.output
    out = _strict(result.stdout)
    assert out["time_s"] is None
    assert out["steps"] == 2 * (8 - 1)


# --- the helpers behind the cases ------------------------------------------------------------------------------

nested = st.recursive(st.one_of(st.floats(), st.integers(), st.text(max_size=3), st.none(), st.booleans()),
                      lambda kids: st.one_of(st.lists(kids, max_size=4),
                                             st.dictionaries(st.text(max_size=3), kids, max_size=4)), max_leaves=20)


@given(nested)
def test_dumps_json_is_strict_and_keeps_every_finite_value(obj):
    back = _strict(dumps_json(obj))

    def same(a, b):
        if isinstance(a, float):
            return b is None if not math.isfinite(a) else b == a
        if isinstance(a, dict):
            return a.keys() == b.keys() and all(same(a[k], b[k]) for k in a)
        if isinstance(a, list):
            return len(a) == len(b) and all(same(x, y) for x, y in zip(a, b, strict=True))
        return a == b

    assert same(obj, back)
    assert finite(back) == back


def test_check_writable_writes_nothing(tmp_path: Path):
    target = tmp_path / "new" / "deeper"
    assert check_writable(target) == target
    assert list(tmp_path.iterdir()) == []  # proven, not created
    (tmp_path / "f").write_text("x")
    for bad in (tmp_path / "f", tmp_path / "f" / "sub", Path("/proc/lightrail-hostile/x")):
        with pytest.raises(ScenarioError) as info:
            check_writable(bad, field="--out")
        assert info.value.field == "--out"
    assert sorted(p.name for p in tmp_path.iterdir()) == ["f"]


def test_read_bounded_stops_at_the_limit(tmp_path: Path):
    big = tmp_path / "big.yaml"
    big.write_bytes(b"a" * 101)
    assert read_bounded(big, field="F", what="x", limit=101) == "a" * 101
    with pytest.raises(ScenarioError, match="over"):
        read_bounded(big, field="F", what="x", limit=100)
    for special in ("/dev/zero", str(tmp_path)):
        with pytest.raises(ScenarioError, match="not a regular file|is a folder"):
            read_bounded(special, field="F", what="x")


@pytest.mark.parametrize("depth", [MAX_DEPTH - 1, MAX_DEPTH, MAX_DEPTH + 1])
@pytest.mark.parametrize("suffix", [".yaml", ".json"])
def test_nesting_is_refused_exactly_above_the_bound(tmp_path: Path, depth: int, suffix: str):
    """``depth`` collections inside the top-level mapping: accepted up to MAX_DEPTH levels in all."""
    path = tmp_path / f"n{suffix}"
    path.write_text('{"a": ' + "[" * (depth - 1) + "]" * (depth - 1) + "}")
    if depth <= MAX_DEPTH:
        value = read_mapping(path, field="F")["a"]
        for _ in range(depth - 2):
            (value,) = value
    else:
        with pytest.raises(ScenarioError, match="nested more than") as info:
            read_mapping(path, field="F")
        assert info.value.field == "F"


def test_yaml_aliases_are_counted_in_full(tmp_path: Path):
    """Nine aliases of nine values is 81 (fine); the seven-level "billion laughs" file is refused."""
    small = tmp_path / "small.yaml"
    small.write_text('a: &a [1,2,3,4,5,6,7,8,9]\nb: [*a,*a,*a,*a,*a,*a,*a,*a,*a]\n')
    assert sum(len(x) for x in read_mapping(small, field="F")["b"]) == 81
    bomb = tmp_path / "bomb.yaml"
    bomb.write_text('a: &a ["x","x","x","x","x","x","x","x","x"]\n' + "".join(
        f"{c}: &{c} [{','.join(['*' + p] * 9)}]\n" for p, c in zip("abcdefg", "bcdefgh", strict=True)))
    with pytest.raises(ScenarioError, match="expands to more than"):
        read_mapping(bomb, field="F")


@pytest.mark.parametrize(("op", "algo"), [("allreduce", "stragglar"), ("alltoall", "bruck"), ("allreduce", "direct")])
def test_the_rank_bound_named_is_the_one_applied(op: str, algo: str, monkeypatch):
    """An explicit schedule's bound: the count the error names is accepted, 5% more is refused."""
    from lightrail.cli.options import check_collective_size

    monkeypatch.setenv("LIGHTRAIL_MEMORY_BUDGET", str(8 << 30))
    with pytest.raises(ScenarioError) as info:
        check_collective_size(op, algo, 60_000)
    most = int(info.value.fix.split("at most ")[1].split(" ")[0].replace(",", ""))
    assert 256 < most < 60_000
    check_collective_size(op, algo, most)
    with pytest.raises(ScenarioError):
        check_collective_size(op, algo, int(most * 1.05) + 1)


def test_linear_schedules_are_not_held_to_the_quadratic_bound(monkeypatch):
    """Binomial trees hold ~n transfers: 65,536 ranks fit in any budget of a few GB."""
    from lightrail.cli.options import MAX_RANKS, check_collective_size

    monkeypatch.setenv("LIGHTRAIL_MEMORY_BUDGET", str(2 << 30))
    for op in ("broadcast", "reduce"):
        check_collective_size(op, "binomial-tree", MAX_RANKS)
    with pytest.raises(ScenarioError, match="too many"):
        check_collective_size("broadcast", "binomial-tree", MAX_RANKS + 1)


# --- issue 31: one helper bounds every list, range and grid before it is built ---------------------------------

def test_lists_take_exactly_the_bound():
    """1,000 values are taken and 1,001 refused, by every list parser (``lightrail.limits.MAX_VALUES``)."""
    from lightrail.cli.options import parse_sizes, parse_times
    from lightrail.limits import MAX_VALUES

    assert MAX_VALUES == 1_000
    for parse, item, field in ((parse_times, "{}us", "--ocs-delays"), (parse_sizes, "{}KiB", "--sizes")):
        assert len(parse(",".join(item.format(k + 1) for k in range(MAX_VALUES)), field=field)) == MAX_VALUES
        with pytest.raises(ScenarioError, match="1,001 .* too many") as info:
            parse(",".join(item.format(k + 1) for k in range(MAX_VALUES + 1)), field=field)
        assert info.value.field == field


def test_sweep_ranges_and_grids_are_refused_before_they_are_built():
    """``1..100000000`` reached 12.9 GB and 3,000 x 2,000 cells had no bound: both refused from their sizes,
    allocating next to nothing; the largest grid allowed is built."""
    import tracemalloc

    from lightrail.limits import MAX_CELLS
    from lightrail.studies.sweep import parse_sweep

    base = {"scenario": {"model": {"preset": "debug"}, "cluster": {"gpus": 32, "gpus_per_server": 4}}}
    tracemalloc.start()
    for grid, field in (({"job.micro_batches": "1..100000000"}, "grid.job.micro_batches"),
                        ({"job.micro_batches": "1..3000", "job.dp_buckets": "1..2000"}, "grid")):
        with pytest.raises(ScenarioError) as info:
            parse_sweep({**base, "grid": grid})
        assert info.value.field == field
    peak = tracemalloc.get_traced_memory()[1]
    tracemalloc.stop()
    assert peak < 32 * 2**20, peak
    sweep = parse_sweep({**base, "grid": {"job.micro_batches": f"1..{MAX_CELLS // 2}", "ocs.partial": [True, False]}})
    assert len(sweep.cells) == MAX_CELLS


@pytest.mark.parametrize("field", ["layers", "hidden", "vocab", "experts"])
def test_model_sizes_take_exactly_their_bound(field: str):
    from lightrail.workload.model import MODEL_BOUNDS, preset

    model = preset("debug")
    bound = MODEL_BOUNDS[field]
    extra = {"heads": 1, "kv_heads": 1, "head_dim": 64} if field == "hidden" else {}
    extra |= {"top_k": 1} if field == "experts" else {}
    assert getattr(model.with_(**{field: bound}, **extra), field) == bound
    with pytest.raises(ScenarioError, match="too many") as info:
        model.with_(**{field: bound + 1}, **extra)
    assert info.value.field == f"model.{field}"
