"""``lightrail controller serve``: bad input fails before serving (exit 2, the field named, no
traceback); good input reaches ``serve``; the old ``--delay`` still works, with a note."""

from __future__ import annotations

import json
import sys

import pytest
from typer.testing import CliRunner

from lightrail.cli import app
from lightrail.fabric.params import RECONFIG_DELAY
from lightrail.runtime.controller.config import DeviceConfig, default_config
from lightrail.runtime.ocs import EmulatedOCS

runner = CliRunner()


@pytest.fixture
def no_serve(monkeypatch):
    """If validation wrongly passes, record the config instead of serving forever."""
    calls = []
    monkeypatch.setattr("lightrail.runtime.controller.serve.serve", lambda cfg, state, **_: calls.append(cfg))
    return calls


CONFIGS = [
    ("unknown field", "devices:\n  - {name: rail0, colour: red}\n", "devices.0.colour"),
    ("unknown top-level field", "devices:\n  - {name: rail0}\nbogus: 1\n", "bogus"),
    ("duplicate device", "devices:\n  - {name: rail0}\n  - {name: rail0, ports: 8}\n", "devices"),
    ("no ports", "devices:\n  - {name: rail0, ports: 0}\n", "devices.0.ports"),
    ("no devices", "devices: []\n", "devices"),
    ("bad delay", "devices:\n  - {name: rail0, delay: soon}\n", "delay"),
    ("not a mapping", "- rail0\n", "--config"),
    ("not yaml", "devices: [\n", "--config"),
]


@pytest.mark.parametrize("what,text,field", CONFIGS, ids=[c[0] for c in CONFIGS])
def test_cli_bad_config_exits_2_naming_the_field(tmp_path, no_serve, what, text, field):
    path = tmp_path / "controller.yaml"
    path.write_text(text)
    result = runner.invoke(app, ["controller", "serve", "--config", str(path), "--state", str(tmp_path / "c.db")])
    assert result.exit_code == 2, result.output
    assert f"{field}:" in result.output and "Traceback" not in result.output
    assert not no_serve


@pytest.mark.parametrize("args,field", [
    (["--config", "missing.yaml"], "--config"),
    (["--rails", "0"], "--rails"),
    (["--ports", "0"], "--ports"),
    (["--delay", "soon"], "--delay"),
    (["--port", "70000"], "--port"),
    (["--admin-port", "-1"], "--admin-port"),
])
def test_cli_bad_options_exit_2_naming_the_flag(tmp_path, no_serve, args, field):
    if args[0] == "--config":
        args = ["--config", str(tmp_path / args[1])]
    result = runner.invoke(app, ["controller", "serve", *args, "--state", str(tmp_path / "c.db")])
    assert result.exit_code == 2, result.output
    assert field in result.output and "Traceback" not in result.output
    assert not no_serve


def test_cli_good_config_reaches_serve_with_the_port_overrides(tmp_path, no_serve):
    path = tmp_path / "controller.json"
    path.write_text(json.dumps({"devices": [{"name": "a", "ports": 16, "delay": "25ms", "duplex": True}]}))
    result = runner.invoke(app, ["controller", "serve", "--config", str(path), "--port", "0", "--admin-port", "0",
                                 "--state", str(tmp_path / "c.db")])
    assert result.exit_code == 0, result.output
    (cfg,) = no_serve
    assert (cfg.port, cfg.admin_port) == (0, 0)
    assert cfg.devices == [DeviceConfig(name="a", ports=16, delay=0.025, duplex=True)]


# --- --ocs-delay (was --delay), defaults, the optional extra -------------------------------------------------


def test_cli_old_delay_spelling_still_works_with_a_note(tmp_path, no_serve):
    result = runner.invoke(app, ["controller", "serve", "--rails", "2", "--delay", "25ms",
                                 "--state", str(tmp_path / "c.db")])
    assert result.exit_code == 0, result.output
    assert "note: --delay is now --ocs-delay" in result.output
    (cfg,) = no_serve
    assert [d.delay for d in cfg.devices] == [0.025, 0.025]


@pytest.mark.parametrize("args,field", [
    (["--ocs-delay", "soon"], "--ocs-delay"),
    (["--delay", "soon"], "--ocs-delay"),  # the old spelling: its value is read as the new flag's
    (["--delay", "5ms", "--ocs-delay", "5ms"], "--ocs-delay"),  # one flag, given twice
])
def test_cli_bad_delay_names_the_flag(tmp_path, no_serve, args, field):
    result = runner.invoke(app, ["controller", "serve", *args, "--state", str(tmp_path / "c.db")])
    assert result.exit_code == 2, result.output
    assert f"{field}:" in result.output and "Traceback" not in result.output
    assert not no_serve


def test_the_ocs_delay_default_is_defined_once(tmp_path, no_serve):
    """The controller config, the emulated OCS and the CLI all take fabric.params.RECONFIG_DELAY."""
    assert runner.invoke(app, ["controller", "serve", "--state", str(tmp_path / "c.db")]).exit_code == 0
    (cfg,) = no_serve
    assert {d.delay for d in cfg.devices} == {RECONFIG_DELAY} and len(cfg.devices) == 8
    assert DeviceConfig(name="a").delay == default_config().devices[0].delay == EmulatedOCS().delay_s == RECONFIG_DELAY


def test_cli_without_the_service_extra_exits_2_naming_the_fix(tmp_path, monkeypatch):
    monkeypatch.setitem(sys.modules, "fastapi", None)  # as if not installed: importing it raises ImportError
    monkeypatch.setitem(sys.modules, "uvicorn", None)
    result = runner.invoke(app, ["controller", "serve", "--port", "0", "--admin-port", "0",
                                 "--state", str(tmp_path / "c.db")])
    assert result.exit_code == 2, result.output
    assert "pip install 'lightrail[service]'" in result.output and "Traceback" not in result.output
    assert not (tmp_path / "c.db").exists()  # it stopped before opening its state


# --- checked before any work: the state path, the ports, the lock, the operator token -----------------------


def test_cli_state_directory_exits_2_and_writes_nothing(tmp_path, no_serve):
    result = runner.invoke(app, ["controller", "serve", "--state", str(tmp_path)])
    assert result.exit_code == 2, result.output
    assert "--state:" in result.output and "directory" in result.output and "Traceback" not in result.output
    assert not no_serve and list(tmp_path.iterdir()) == []


@pytest.mark.parametrize("flag", ["--port", "--admin-port"])
def test_cli_port_in_use_exits_2_naming_the_flag(tmp_path, no_serve, flag):
    import socket

    with socket.socket() as busy:
        busy.bind(("127.0.0.1", 0))
        busy.listen()
        port = busy.getsockname()[1]
        other = "--admin-port" if flag == "--port" else "--port"
        result = runner.invoke(app, ["controller", "serve", flag, str(port), other, "0",
                                     "--state", str(tmp_path / "c.db")])
    assert result.exit_code == 2, result.output
    assert f"{flag}:" in result.output and str(port) in result.output and "Traceback" not in result.output
    assert not no_serve and list(tmp_path.iterdir()) == []


@pytest.mark.parametrize("args,field", [
    (["--heartbeat-timeout", "0"], "--heartbeat-timeout"),
    (["--heartbeat-timeout", "soon"], "--heartbeat-timeout"),
    (["--hello-timeout", "2h"], "--hello-timeout"),
    (["--max-connections", "0"], "--max-connections"),
])
def test_cli_bad_limits_exit_2(tmp_path, no_serve, args, field):
    result = runner.invoke(app, ["controller", "serve", *args, "--state", str(tmp_path / "c.db")])
    assert result.exit_code == 2, result.output
    assert f"{field}:" in result.output and "Traceback" not in result.output
    assert not no_serve


def test_cli_operator_token_file(tmp_path, no_serve):
    short, good = tmp_path / "short", tmp_path / "good"
    short.write_text("abc\n")
    good.write_text("a-long-enough-operator-secret\n")
    for path in (short, tmp_path / "missing"):
        result = runner.invoke(app, ["controller", "serve", "--operator-token-file", str(path),
                                     "--state", str(tmp_path / "c.db")])
        assert result.exit_code == 2 and "--operator-token-file:" in result.output, result.output
    assert not no_serve
    result = runner.invoke(app, ["controller", "serve", "--operator-token-file", str(good),
                                 "--state", str(tmp_path / "c.db")])
    assert result.exit_code == 0, result.output
    assert no_serve[0].operator_token == "a-long-enough-operator-secret"


def test_a_second_controller_on_the_same_state_exits_2_naming_the_first(spawn, tmp_path):
    """The contract: the state file is locked to one controller; a second one names the first's pid and
    ports, exits 2 without a traceback and leaves the first's state alone. Once the first is killed
    (SIGKILL: the kernel drops the lock), a new one starts on the same file."""
    import subprocess

    httpx = pytest.importorskip("httpx")
    pytest.importorskip("fastapi")
    state = tmp_path / "c.db"
    proc, info = spawn(state)
    second = subprocess.run([sys.executable, "-m", "lightrail.cli", "controller", "serve", "--port", "0",
                             "--admin-port", "0", "--state", str(state)], capture_output=True, text=True,
                            timeout=60)
    assert second.returncode == 2, second.stderr
    out = second.stdout + second.stderr
    assert "--state:" in out and f"pid {proc.pid}" in out and str(info["port"]) in out
    assert str(info["admin_port"]) in out and "Traceback" not in out
    assert httpx.get(f"http://127.0.0.1:{info['admin_port']}/healthz", timeout=10).json() == {"ok": True}
    proc.kill()
    proc.wait(10)
    _, info2 = spawn(state)
    assert info2["port"] != 0


def test_operator_token_from_the_environment_is_not_printed(spawn, tmp_path):
    import os

    httpx = pytest.importorskip("httpx")
    secret = "an-operator-secret-from-the-env"
    _, info = spawn(tmp_path / "c.db", env={**os.environ, "LIGHTRAIL_OPERATOR_TOKEN": secret})
    assert "operator_token" not in info
    base = f"http://127.0.0.1:{info['admin_port']}"
    assert httpx.get(f"{base}/state", headers={"Authorization": f"Bearer {secret}"}, timeout=10).status_code == 200
    assert httpx.get(f"{base}/state", timeout=10).status_code == 401
