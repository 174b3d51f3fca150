"""The agent as hosts run it: `python -m telemetry.agent` in its own process, on the bare stdlib."""

from __future__ import annotations

import http.client
import json
import os
import re
import shutil
import signal
import socket
import subprocess
import sys
from pathlib import Path

import pynvml
import pytest

from telemetry.agent.__main__ import ConfigError, parse_listen, read_token

REPO = Path(__file__).resolve().parents[2]


def agent_command(*args: str) -> list[str]:
    # -S: no site-packages at all (no Django, no pynvml); -m adds the cwd (the repo) to sys.path.
    return [sys.executable, "-S", "-m", "telemetry.agent", *args]


def clean_env() -> dict[str, str]:
    return {k: v for k, v in os.environ.items() if k not in {"PYTHONPATH", "DJANGO_SETTINGS_MODULE"}}


@pytest.fixture
def token_file(tmp_path):
    path = tmp_path / "token"
    path.write_text("  proc-token-123\n", encoding="utf-8")
    path.chmod(0o600)
    return path


def test_agent_process_serves_metrics_with_only_the_standard_library(token_file):
    process = subprocess.Popen(
        agent_command("--listen", "127.0.0.1:0", "--token-file", str(token_file), "--backend", "sim"),
        cwd=REPO,
        env=clean_env(),
        stderr=subprocess.PIPE,
        text=True,
    )
    try:
        banner = process.stderr.readline()
        match = re.search(r"serving sim metrics of vws-poc-01 on http://127\.0\.0\.1:(\d+)", banner)
        assert match, f"unexpected start-up line: {banner!r}"
        conn = http.client.HTTPConnection("127.0.0.1", int(match.group(1)), timeout=5)

        conn.request("GET", "/v1/metrics", headers={"Authorization": "Bearer proc-token-123"})
        response = conn.getresponse()
        payload = json.loads(response.read())
        assert response.status == 200
        assert payload["agent"]["backend"] == "sim"
        assert [g["name"] for g in payload["gpus"]] == ["Quadro RTX 6000"] * 3

        conn.request("GET", "/v1/metrics", headers={"Authorization": "Bearer proc-token-12"})
        response = conn.getresponse()
        response.read()
        assert response.status == 401

        conn.request("GET", "/healthz")
        response = conn.getresponse()
        assert (response.status, json.loads(response.read())) == (200, {"status": "ok"})
        conn.close()

        process.send_signal(signal.SIGTERM)
        assert process.wait(timeout=10) == 0, "SIGTERM should stop the agent cleanly"
    finally:
        if process.poll() is None:
            process.kill()
            process.wait()
        process.stderr.close()


@pytest.mark.parametrize(
    ("content", "message"),
    [
        (None, "token file {path} does not exist"),
        ("", "token file {path} is empty"),
        ("  \n\t\n", "token file {path} is empty"),
        ("two words", "token in {path} must be one word"),
    ],
    ids=["missing", "empty", "blank", "spaces"],
)
def test_agent_refuses_to_start_without_a_usable_token(tmp_path, content, message):
    path = tmp_path / "token"
    if content is not None:
        path.write_text(content, encoding="utf-8")

    result = subprocess.run(
        agent_command("--listen", "127.0.0.1:0", "--token-file", str(path), "--backend", "sim"),
        cwd=REPO,
        env=clean_env(),
        capture_output=True,
        text=True,
        timeout=30,
    )

    assert result.returncode == 2
    assert result.stderr.startswith("telemetry.agent: error: " + message.format(path=path))
    assert "Traceback" not in result.stderr


def test_nvml_backend_without_nvidia_ml_py_says_what_to_install(token_file):
    result = subprocess.run(
        agent_command("--listen", "127.0.0.1:0", "--token-file", str(token_file), "--backend", "nvml"),
        cwd=REPO,
        env=clean_env(),
        capture_output=True,
        text=True,
        timeout=30,
    )
    assert result.returncode == 2
    assert "pip install nvidia-ml-py" in result.stderr


def test_bad_scenario_is_reported_not_raised(token_file, tmp_path):
    scenario = tmp_path / "fleet.json"
    scenario.write_text('{"hostname": "x"}', encoding="utf-8")
    result = subprocess.run(
        agent_command("--token-file", str(token_file), "--backend", "sim", "--scenario", str(scenario)),
        cwd=REPO,
        env=clean_env(),
        capture_output=True,
        text=True,
        timeout=30,
    )
    assert result.returncode == 2
    assert f"scenario file {scenario}: scenario needs a 'gpus' list" in result.stderr


def test_agent_package_imports_nothing_but_the_stdlib_and_pynvml(tmp_path):
    """Hosts have no Django: every module the agent loads must be stdlib, the agent, or pynvml."""
    only_pynvml = tmp_path / "site"
    only_pynvml.mkdir()
    shutil.copy(pynvml.__file__, only_pynvml / "pynvml.py")
    code = f"""
import sys
sys.path[:0] = [{str(REPO)!r}, {str(only_pynvml)!r}]
import telemetry.agent, telemetry.agent.server, telemetry.agent.sim_backend, telemetry.agent.scenario
import telemetry.agent.nvml_backend, telemetry.agent.__main__
from telemetry.agent.sim_backend import SimBackend
from telemetry.agent.scenario import poc_scenario
SimBackend(poc_scenario()).collect(0.0)
try:  # without a GPU this fails cleanly, after importing pynvml
    telemetry.agent.__main__.make_backend("nvml", None).close()
except telemetry.agent.__main__.ConfigError:
    pass
allowed = set(sys.stdlib_module_names) | {{"telemetry", "pynvml", "__main__"}}
print(sorted({{name.split(".")[0] for name in sys.modules}} - allowed))
print("pynvml" in sys.modules)
"""
    result = subprocess.run(
        [sys.executable, "-S", "-c", code],
        cwd=tmp_path,
        env=clean_env(),
        capture_output=True,
        text=True,
        timeout=30,
    )
    assert result.returncode == 0, result.stderr
    assert result.stdout.split("\n")[:2] == ["[]", "True"], result.stdout


def test_listen_address_parsing():
    assert parse_listen("0.0.0.0:9410") == ("0.0.0.0", 9410)
    assert parse_listen(":9410") == ("0.0.0.0", 9410)
    assert parse_listen("[::1]:9410") == ("::1", 9410)


def test_token_is_stripped_and_read_from_the_file(token_file):
    assert read_token(token_file) == "proc-token-123"
    token_file.write_text("\n", encoding="utf-8")
    with pytest.raises(ConfigError, match="is empty"):
        read_token(token_file)


@pytest.mark.parametrize(("flag", "value", "message"), [
    ("--max-connections", "0", "expected a whole number of at least 1, got '0'"),
    ("--workers", "-2", "expected a whole number of at least 1, got '-2'"),
    ("--workers", "²", "expected a whole number of at least 1, got '²'"),
    ("--request-timeout", "0", "expected a number of seconds above 0, got '0'"),
    ("--idle-timeout", "nan", "expected a number of seconds above 0, got 'nan'"),
    ("--idle-timeout", "inf", "expected a number of seconds above 0, got 'inf'"),
])
def test_connection_limits_must_be_positive(token_file, capsys, flag, value, message):
    from telemetry.agent.__main__ import main

    with pytest.raises(SystemExit) as caught:
        main(["--listen", "127.0.0.1:0", "--token-file", str(token_file), "--backend", "sim", flag, value])
    assert caught.value.code == 2
    assert f"argument {flag}: {message}" in capsys.readouterr().err


def test_under_a_low_open_file_limit_the_agent_lowers_its_cap_and_keeps_answering(token_file):
    """ulimit -n 100 (soft and hard) with --max-connections 512: accept() would run out of
    descriptors under 150 idle sockets; the agent serves at most 36 and closes the oldest."""
    process = subprocess.Popen(
        ["bash", "-c", 'ulimit -n 100 && exec "$@"', "agent",
         *agent_command("--listen", "127.0.0.1:0", "--token-file", str(token_file), "--backend", "sim",
                        "--max-connections", "512")],
        cwd=REPO,
        env=clean_env(),
        stderr=subprocess.PIPE,
        text=True,
    )
    idle = []
    try:
        lines = [process.stderr.readline() for _ in range(2)]
        assert "the open-file limit (ulimit -n) is 100: serving at most 36 connections instead of " \
               "--max-connections 512" in lines[0]
        port = int(re.search(r"on http://127\.0\.0\.1:(\d+)", lines[1]).group(1))
        idle = [socket.create_connection(("127.0.0.1", port)) for _ in range(150)]

        conn = http.client.HTTPConnection("127.0.0.1", port, timeout=10)
        conn.request("GET", "/v1/metrics", headers={"Authorization": "Bearer proc-token-123"})
        response = conn.getresponse()
        assert (response.status, len(json.loads(response.read())["gpus"])) == (200, 3)
        conn.close()
    finally:
        for sock in idle:
            sock.close()
        process.send_signal(signal.SIGTERM)
        process.wait(timeout=10)
        process.stderr.close()


@pytest.mark.parametrize(
    ("manifest", "message"),
    [
        (None, "manifest {path} does not exist (run `manage.py demo_agents` first)"),
        ("[]", "manifest {path} must be a non-empty JSON list of agents"),
        ('[{"name": "a16-01", "listen": "127.0.0.1:0", "scenario": "a16-01.json"}]',
         "manifest {path}: entry 0 lacks 'token_file'"),
    ],
    ids=["missing", "empty", "no-token-file"],
)
def test_simfleet_refuses_a_manifest_it_cannot_serve_and_says_why(tmp_path, manifest, message):
    path = tmp_path / "agents.json"
    if manifest is not None:
        path.write_text(manifest, encoding="utf-8")
    result = subprocess.run(
        [sys.executable, "-S", "-m", "telemetry.agent.simfleet", "--manifest", str(path)],
        cwd=REPO, env=clean_env(), capture_output=True, text=True, timeout=30,
    )
    assert result.returncode == 2
    assert result.stderr.startswith("telemetry.agent.simfleet: error: " + message.format(path=path))
    assert "Traceback" not in result.stderr
