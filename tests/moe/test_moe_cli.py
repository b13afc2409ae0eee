"""``lightrail moe bench`` end to end: the JSON contract at a tiny size, the files, and bad flags exiting 2."""

from __future__ import annotations

import json

import pytest
from typer.testing import CliRunner

from lightrail.cli import app
from lightrail.moe import traffic

runner = CliRunner()


def run(*args):
    return runner.invoke(app, [str(a) for a in args])


def test_bench_json_contract(tmp_path):
    result = run("moe", "bench", "--ranks", 2, "--tokens", 96, "--experts", 4, "--topk", 2, "--hidden", 16,
                 "--repeats", 1, "--warmup", 0, "--capacity-factor", 1.0, "--json", "--out", tmp_path)
    assert result.exit_code == 0, result.output
    out = json.loads(result.stdout)
    for v in ("payload", "padded", "unpipelined"):
        assert {"latency_s", "tokens_per_s", "bytes_on_wire", "correct"} <= set(out[v]), v
        assert out[v]["correct"] is True, v
        assert out[v]["latency_s"] > 0 and out[v]["tokens_per_s"] == pytest.approx(96 / out[v]["latency_s"])
    # padded: 2 ranks x (dispatch + combine) x 2 remote experts x capacity 48 x 16 floats
    cap = traffic.capacity(48, 2, 4, 1.0)
    assert out["padded"]["bytes_on_wire"] == 2 * 2 * 2 * cap * 16 * 4
    assert out["payload"]["bytes_on_wire"] == out["unpipelined"]["bytes_on_wire"] < out["padded"]["bytes_on_wire"]
    assert out["bytes_saved_vs_padded"] == out["padded"]["bytes_on_wire"] - out["payload"]["bytes_on_wire"]
    assert out["payload"]["bytes_on_wire_fwd_bwd"] == 2 * out["payload"]["bytes_on_wire"]
    assert out["payload"]["max_in_flight"] >= 2 and out["unpipelined"]["max_in_flight"] == 1
    assert json.loads((tmp_path / "summary.json").read_text())["payload"]["correct"] is True
    assert (tmp_path / "moe-bench.png").stat().st_size > 1000


@pytest.mark.parametrize(("args", "flag"), [
    (["--ranks", 3], "--ranks"),       # does not divide 64 experts
    (["--ranks", 1], "--ranks"),
    (["--topk", 65], "--topk"),
    (["--tokens", 0], "--tokens"),
    (["--experts", 0], "--experts"),
    (["--hidden", 0], "--hidden"),
    (["--capacity-factor", 0], "--capacity-factor"),
    (["--tiles", 0], "--tiles"),
])
def test_bad_flags_exit_2_naming_the_flag(args, flag):
    result = run("moe", "bench", *args, "--json")
    assert result.exit_code == 2
    assert f"error: {flag}:" in result.output
    assert "Traceback" not in result.output
