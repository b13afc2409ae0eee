"""nccl-tests logs in: fourteen real logs (tests/data/nccl) and each messy form people paste, built by hand."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from lightrail.errors import ScenarioError
from lightrail.workload.nccl_tests import NcclLog, parse_nccl_tests, read_nccl_tests

DATA = Path(__file__).parent.parent / "data" / "nccl"

# Per file: (op, rows, ranks listed in the header, hosts listed) for each table, and the lines skipped with a
# warning. Rows counted with grep -cE '^\s*(\S+:\s*)?\s*[0-9]+\s+[0-9]+\s+(float|double)\s' (split by table by
# eye); ops from '# Collective test starting:' or a command line in the file, None where the file has neither.
EXPECTED: dict[str, tuple[list[tuple[str | None, int, int | None, int]], int]] = {
    "a100-1x8-sendrecv.txt": ([("sendrecv", 4, None, 0)], 0),
    "alcf-polaris-8x4-a100-allreduce.txt": ([(None, 29, 32, 8)], 0),
    "alcf-polaris-8x4-a100-alltoall.txt": ([(None, 29, 32, 8)], 0),
    "amd-mi300x-1x8.txt": ([("allreduce", 31, 8, 1)], 0),
    "amd-mi355x-2x8-pollara.txt": ([(None, 31, 16, 2)], 0),
    "aws-batch-p5-1x8-h100.txt": ([(None, 32, None, 0)], 0),
    "aws-eks-p5-2x8-h100-efa-elided.txt": ([(None, 7, None, 0)], 0),
    "aws-g4dn-2x1-t4-efa-debug.txt": ([(None, 31, 2, 2)], 2),  # two "Warning: Permanently added" ssh lines
    "aws-p4de-2x8-a100-efa.txt": ([(None, 29, None, 0)], 0),
    "aws-p5-2x8-h100-efa.txt": ([(None, 32, None, 0)], 0),
    "dgx2-v100-1x12-5ops-legacy.txt": ([(op, 31, 12, 1) for op in
                                        ("allgather", "allreduce", "broadcast", "reduce", "reducescatter")], 0),
    "gcp-a3mega-2x8-h100-tcpxo.txt": ([(None, 31, 16, 2)], 0),
    "h100-10x8-5ops.txt": ([(op, 10, 80, 10) for op in
                            ("allreduce", "allgather", "reducescatter", "alltoall", "sendrecv")], 0),
    "oci-a100-2x8-roce.txt": ([(None, 31, 16, 2)], 3),  # kubectl's "Defaulted container" and two ssh lines
}
# Old all_gather/reduce_scatter print algbw = size/time * (n-1)/n; every other table prints size/time.
OLD_ALGBW = {("dgx2-v100-1x12-5ops-legacy.txt", "allgather"), ("dgx2-v100-1x12-5ops-legacy.txt", "reducescatter")}


def read(name: str) -> NcclLog:
    return read_nccl_tests((DATA / name).read_text(), source=name)


def test_every_committed_log_is_listed():
    assert sorted(p.name for p in DATA.glob("*.txt")) == sorted(EXPECTED)


@pytest.mark.parametrize("name", sorted(EXPECTED))
def test_real_logs_parse(name):
    text = (DATA / name).read_text()
    assert text.startswith("# provenance: ")
    log = read_nccl_tests(text, source=name)
    tables, warnings = EXPECTED[name]
    assert [(t.op, len(t.rows), t.ranks, len(t.nodes)) for t in log.tables] == tables
    assert len(log.warnings) == warnings
    assert all(w.startswith(f"{name}:") for w in log.warnings)
    for table in log.tables:
        sizes = [r.size for r in table.rows]
        assert sizes == sorted(sizes)
        nonzero = [s for s in sizes if s > 0]
        assert all(a < b for a, b in zip(nonzero, nonzero[1:], strict=False)), "sizes strictly increasing"
        assert all(r.time_s is not None and r.time_s > 0 for r in table.rows)
        assert all(r.in_place_time_s is not None and r.in_place_time_s > 0 for r in table.rows)
        assert [r.line for r in table.rows] == sorted(r.line for r in table.rows)
        if table.ranks is not None:
            assert len(table.devices) == table.ranks
        if (name, table.op) in OLD_ALGBW:
            continue
        for r in table.rows:  # the columns land where they belong: algbw is size / time as printed
            assert r.algbw_GBps == pytest.approx(r.size / r.time_s / 1e9, abs=0.0051, rel=0.002)
            assert r.in_place_algbw_GBps == pytest.approx(r.size / r.in_place_time_s / 1e9, abs=0.0051, rel=0.002)


def test_index_describes_every_log():
    index = json.loads((DATA / "index.json").read_text())
    assert sorted(e["file"] for e in index) == sorted(EXPECTED)
    for e in index:
        assert set(e) == {"file", "op", "ranks", "gpus_per_server", "servers", "gpu", "nvlink_GBps", "nic_Gbps",
                          "nvls", "source", "vendor"}
        assert e["ranks"] == e["gpus_per_server"] * e["servers"]
        assert (e["nic_Gbps"] is None) if e["servers"] == 1 else True
        log = read(e["file"])
        assert e["op"] == ",".join(t.op or e["op"] for t in log.tables)
        assert all(t.ranks in (None, e["ranks"]) for t in log.tables)
        assert e["source"].split("/blob/")[0] in (DATA / e["file"]).read_text().splitlines()[0]


def test_real_log_details():
    dgx2 = read("dgx2-v100-1x12-5ops-legacy.txt").tables
    assert [(t.rows[0].redop, t.rows[0].root) for t in dgx2] == [("none", -1), ("sum", -1), ("none", 0), ("sum", 0),
                                                                 ("sum", -1)]
    assert [r.size for r in dgx2[0].rows[:4]] == [0, 0, 0, 48]
    assert dgx2[1].devices == ("Tesla V100-SXM3-32GB",) * 12 and dgx2[1].nodes == ("seville",)
    eks = read("aws-eks-p5-2x8-h100-efa-elided.txt")
    assert eks.tables[0].elided and [r.size for r in eks.rows[:2]] == [0, 67108864]
    assert not read("amd-mi300x-1x8.txt").tables[0].elided  # its <snip> is before the header
    alltoall = read("alcf-polaris-8x4-a100-alltoall.txt").rows
    assert alltoall[-1].redop == "none" and alltoall[-1].busbw_GBps == 5.04
    assert alltoall[-1].in_place_time_s == pytest.approx(206162e-6)
    p5 = read("aws-p5-2x8-h100-efa.txt").rows
    assert (p5[-1].size, p5[-1].time_s, p5[-1].busbw_GBps, p5[-1].in_place_busbw_GBps) == \
        (17179869184, pytest.approx(66132e-6), 487.09, 487.26)
    assert read("amd-mi355x-2x8-pollara.txt").tables[0].devices == ("",) * 16
    assert read("h100-10x8-5ops.txt").tables[0].rows[0].dtype == "double"


# ---- synthetic logs: one messy form at a time --------------------------------------------------------------
def cells(t_us: float, size: int, n: int, wrong: str = "0") -> str:
    alg = size / t_us / 1e3
    return f"  {t_us:7.2f}  {alg:6.2f}  {alg * 2 * (n - 1) / n:6.2f}  {wrong:>6s}"


def row(size: int, t_us: float, n: int = 8, *, redop: str = "sum", root: str = "-1", inplace: str | None = None) -> str:
    head = f"{size:12d}  {size // 4:12d}  {'float':>8s}" + (f"  {redop:>6s}" if redop else "") + \
        (f"  {root:>6s}" if root else "")
    tail = inplace if inplace is not None else cells(t_us * 0.98, size, n)
    return head + cells(t_us, size, n) + tail


TITLES = (
    "#                                                              out-of-place                       in-place\n"
    "#       size         count      type   redop    root     time   algbw   busbw #wrong     time   algbw   busbw"
    " #wrong\n"
    "#        (B)    (elements)                               (us)  (GB/s)  (GB/s)            (us)  (GB/s)  (GB/s)\n")


def log(op: str = "all_reduce_perf", n: int = 8, sizes=(1024, 2048, 4096), *, host: str = "node0") -> list[str]:
    lines = [f"# Collective test starting: {op}",
             "# nThread 1 nGpus 1 minBytes 1024 maxBytes 4096 step: 2(factor) warmup iters: 5 iters: 20 agg iters: 1"
             " validation: 1 graph: 0", "#", "# Using devices"]
    lines += [f"#  Rank {r:2d} Group  0 Pid {100 + r:6d} on {host} device {r:2d} [0x{r:02x}] NVIDIA H100 80GB HBM3"
              for r in range(n)]
    lines += TITLES.rstrip("\n").split("\n")
    lines += [row(s, 10.0 * (1 + k), n) for k, s in enumerate(sizes)]
    lines += ["# Out of bounds values : 0 OK", "# Avg bus bandwidth    : 1.23", "#"]
    return lines


PLAIN = read_nccl_tests("\n".join(log()))


def same_rows(got: NcclLog, want: NcclLog = PLAIN) -> bool:
    strip = [[(r.size, r.time_s, r.busbw_GBps, r.in_place_time_s) for r in t.rows] for t in got.tables]
    return strip == [[(r.size, r.time_s, r.busbw_GBps, r.in_place_time_s) for r in t.rows] for t in want.tables]


def test_a_plain_log():
    assert [(t.op, len(t.rows), t.ranks, t.nodes) for t in PLAIN.tables] == [("allreduce", 3, 8, ("node0",))]
    assert PLAIN.warnings == [] and PLAIN.rows[0].time_s == pytest.approx(10e-6)
    assert PLAIN.rows[0].in_place_time_s == pytest.approx(9.8e-6)


@pytest.mark.parametrize("prefix", ["0: ", "[1,0]<stdout>:", "[1,0]<stderr>:", "host123: ", "ip-10-0-0-1.ec2: ",
                                    "2024-05-01T12:00:00.123456Z ", "[2024-05-01 12:00:00] 0: "])
def test_labels_on_every_line(prefix):
    got = read_nccl_tests("\n".join(prefix + line for line in log()))
    assert same_rows(got) and got.warnings == [] and got.tables[0].ranks == 8


def test_nccl_debug_lines_with_and_without_labels_are_read_silently():
    lines = log()
    lines.insert(4, "node0:1234:1240 [0] NCCL INFO Bootstrap : Using eth0:10.0.0.1<0>")
    lines.insert(6, "[1,3]<stdout>:node0:1234:1240 [3] NCCL INFO Channel 00/02 :    0   1   2   3")
    lines.insert(-5, "0: node0:1234:1240 [0] NCCL WARN NET/IB : something")
    lines.insert(-4, "NCCL version 2.21.5+cuda12.4")
    got = read_nccl_tests("\n".join(lines))
    assert same_rows(got) and got.warnings == []


def test_elided_rows():
    lines = log(sizes=(1024, 2048, 1048576, 2097152))
    at = next(i for i, line in enumerate(lines) if line.lstrip().startswith("2048"))
    lines[at] = "..."
    got = read_nccl_tests("\n".join(lines))
    assert [r.size for r in got.rows] == [1024, 1048576, 2097152] and got.tables[0].elided and got.warnings == []


def test_two_tables_one_per_op():
    got = read_nccl_tests("\n".join(log() + [""] + log("all_gather_perf_mpi", 4, (4096, 8192))))
    assert [(t.op, len(t.rows), t.ranks) for t in got.tables] == [("allreduce", 3, 8), ("allgather", 2, 4)]
    assert got.rows == got.tables[0].rows and parse_nccl_tests("\n".join(log()))[1] == 8


def test_the_op_from_a_command_line():
    lines = ["$ mpirun -np 8 ./build/reduce_scatter_perf -b 1K -e 4K -f 2 -g 1"] + log()[1:]
    assert read_nccl_tests("\n".join(lines)).tables[0].op == "reducescatter"


def test_the_same_table_printed_by_every_rank_is_kept_once():
    one = log(n=2, host="a")
    sequential = [f"{r}: {line}" for r in range(2) for line in one]
    interleaved = [f"{r}: {line}" for line in one for r in range(2)]
    for lines in (sequential, interleaved):
        got = read_nccl_tests("\n".join(lines))
        assert [(len(t.rows), t.ranks, t.nodes) for t in got.tables] == [(3, 2, ("a",))] and got.warnings == []
    doubled = [line for line in one for _ in range(2)]  # unlabelled: each line twice
    got = read_nccl_tests("\n".join(doubled))
    assert [(len(t.rows), t.ranks) for t in got.tables] == [(3, 2)]


def test_rank_lines_cut_with_dots_still_count_every_rank():
    lines = log(n=8)
    lines[6:10] = ["..."]  # Rank 2..5
    got = read_nccl_tests("\n".join(lines))
    assert got.tables[0].ranks == 8 and not got.tables[0].elided


@pytest.mark.parametrize("inplace, want", [
    ("  {na:>7s}  {na:>6s}  {na:>6s}  {na:>6s}", None),  # a whole half N/A
    ("     N/A    0.00    0.00     N/A", None),  # the in-place time N/A
])
def test_na_cells(inplace, want):
    text = "\n".join(TITLES.rstrip("\n").split("\n") + [row(1024, 10.0, inplace=inplace.format(na="N/A")),
                                                      row(2048, 12.0, inplace=cells(11.0, 2048, 8, "N/A"))])
    got = read_nccl_tests(text)
    assert got.rows[0].in_place_time_s is want and got.rows[0].time_s == pytest.approx(10e-6)
    assert got.rows[1].in_place_time_s == pytest.approx(11e-6) and got.warnings == []


def test_in_place_only_and_out_of_place_only_tables():
    head = f"{1024:12d}  {256:12d}  {'float':>8s}  {'sum':>6s}  {-1:6d}"
    blank = head + " " * 32 + cells(9.0, 1024, 8)  # nccl-tests blanks the out-of-place columns of a trace replay
    got = read_nccl_tests(TITLES + blank)
    assert (got.rows[0].time_s, got.rows[0].in_place_time_s) == (None, pytest.approx(9e-6))
    only_out = "#       size  count  type  redop  root  time  algbw  busbw  #wrong\n" + head + cells(8.0, 1024, 8)
    got = read_nccl_tests(only_out)
    assert (got.rows[0].time_s, got.rows[0].in_place_time_s) == (pytest.approx(8e-6), None)


def test_old_formats_without_root_or_redop():
    text = "\n".join([
        "#       size         count    type   redop     time   algbw   busbw  error     time   algbw   busbw  error",
        row(1024, 10.0, redop="sum", root="", inplace=cells(9.0, 1024, 8, "2e-07")),  # 12 columns
        "#       size         count    type     time   algbw   busbw  error     time   algbw   busbw  error",
        row(2048, 11.0, redop="", root=""),  # 11 columns (all_gather)
        "#       size         count    type    root     time   algbw   busbw  error     time   algbw   busbw  error",
        row(4096, 12.0, redop="", root="3"),  # 12 columns (broadcast: root, no redop)
    ])
    got = read_nccl_tests(text)
    assert [(r.size, r.redop, r.root) for t in got.tables for r in t.rows] == \
        [(1024, "sum", -1), (2048, "none", -1), (4096, "none", 3)]
    assert got.warnings == []


def test_header_lines_that_lost_their_hash():
    lines = [line.lstrip("#") for line in log()]
    got = read_nccl_tests("\n".join(lines))
    assert same_rows(got) and got.tables[0].ranks == 8 and got.warnings == []


def test_per_iteration_columns():
    title = ("#       size  count  type  redop  root  time  algbw  busbw  #wrong  i_min  i_max  i_p99  i_cv%"
             "  time  algbw  busbw  #wrong  i_min  i_max  i_p99  i_cv%")
    extra = "     9.90    10.10    10.20     0.50"
    line = (f"{1024:12d}  {256:12d}  {'float':>8s}  {'sum':>6s}  {-1:6d}" + cells(10.0, 1024, 8) + extra +
            cells(9.5, 1024, 8) + extra)
    got = read_nccl_tests(title + "\n" + line)
    assert (got.rows[0].time_s, got.rows[0].in_place_time_s) == (pytest.approx(10e-6), pytest.approx(9.5e-6))


def test_a_garbage_line_is_skipped_with_a_warning_naming_it():
    lines = log()
    lines.insert(-4, "   4096  1024  float  sum  -1  fast  0.08  0.15  0  11.9  0.09  0.15  0")
    lines.insert(3, "Warning: Permanently added 'node1' (ED25519) to the list of known hosts.")
    got = read_nccl_tests("\n".join(lines), source="run.log")
    assert same_rows(got)
    assert [w.split(":")[:2] for w in got.warnings] == [["run.log", "4"], ["run.log", str(len(lines) - 4)]]
    assert "Warning: Permanently" in got.warnings[0] and "fast" in got.warnings[1]


def test_nothing_left_raises_naming_the_source_and_the_fix():
    with pytest.raises(ScenarioError, match=r"log\.txt: no table rows.*log\.txt:2.*nccl-tests binary"):
        read_nccl_tests("# only a comment\nsomething else\n", source="log.txt")
    with pytest.raises(ScenarioError, match="no table rows"):
        parse_nccl_tests("")
