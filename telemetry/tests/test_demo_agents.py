"""`manage.py demo_agents` and `manage.py runfleet`: the embedded fleet of `make run`."""

from __future__ import annotations

import json
import os
import signal
import socket
import stat
import subprocess
import sys
import threading
import time
from pathlib import Path

import pytest
from django.conf import settings
from django.core.management import call_command

from fleet import demo as fleet_demo
from telemetry import collect
from telemetry.agent.__main__ import read_token
from telemetry.agent.scenario import load_scenario
from telemetry.agent.server import AgentServer
from telemetry.agent.sim_backend import SimBackend
from telemetry.models import Agent, AgentStatus, Drift, GpuSample, VgpuSample
from telemetry.tests.loopback import serving

pytestmark = pytest.mark.django_db


@pytest.fixture
def demo_fleet():
    fleet_demo.seed_demo(hosts=4, admin_password="pass-word-123", artist_password="pass-word-123")


def test_demo_agents_write_scenarios_from_the_inventory_and_samples_map_back(demo_fleet, tmp_path, capsys):
    call_command("demo_agents", "--dir", str(tmp_path), "--base-port", "9511")
    out = capsys.readouterr().out

    manifest = json.loads((tmp_path / "agents.json").read_text())
    assert [entry["host"] for entry in manifest][0] == fleet_demo.POC_HOST
    assert len(manifest) == 3
    assert [entry["url"] for entry in manifest] == [f"http://127.0.0.1:{p}" for p in (9511, 9512, 9513)]
    assert "poc-rtx6000      http://127.0.0.1:9511" in out
    for entry in manifest:
        token_file = Path(entry["token_file"])
        assert stat.S_IMODE(token_file.stat().st_mode) == 0o600
        agent = Agent.objects.get(name=entry["name"])
        assert read_token(token_file) == agent.token
        assert (agent.kind, agent.url, agent.host.name) == ("nvml", entry["url"], entry["host"])

    # Each agent serves its scenario; one poll stores a sample for every GPU and VM, and no drift.
    for entry in manifest:
        agent = Agent.objects.get(name=entry["name"])
        backend = SimBackend(load_scenario(entry["scenario"]))
        with serving(AgentServer(("127.0.0.1", 0), backend, read_token(entry["token_file"]), entry["host"])) as srv:
            Agent.objects.filter(pk=agent.pk).update(url=srv.url)
            assert collect.poll_batch([agent.pk]).ok == 1
        assert GpuSample.objects.filter(gpu__host__name=entry["host"]).count() == entry["gpus"]
        assert VgpuSample.objects.filter(gpu__host__name=entry["host"]).count() == entry["vgpus"]
    assert Drift.objects.count() == 0


def test_demo_agents_twice_keeps_the_tokens(demo_fleet, tmp_path):
    call_command("demo_agents", "--dir", str(tmp_path))
    tokens = {a.name: a.token for a in Agent.objects.all()}
    call_command("demo_agents", "--dir", str(tmp_path))
    assert {a.name: a.token for a in Agent.objects.all()} == tokens
    assert Agent.objects.count() == 3


def test_demo_agents_in_compose_are_polled_by_service_name(demo_fleet, tmp_path):
    """In docker-compose the agents listen on 0.0.0.0 but the worker reaches them as agent-sim."""
    call_command("demo_agents", "--dir", str(tmp_path), "--hosts", "poc-rtx6000",
                 "--listen-host", "0.0.0.0", "--url-host", "agent-sim")
    assert Agent.objects.get(name="poc-rtx6000").url == "http://agent-sim:9411"
    manifest = json.loads((tmp_path / "agents.json").read_text())
    assert manifest[0]["listen"] == "0.0.0.0:9411"


def test_demo_agents_without_a_demo_fleet_says_what_to_run(tmp_path):
    from django.core.management.base import CommandError

    with pytest.raises(CommandError, match="run `manage.py seed_demo` first"):
        call_command("demo_agents", "--dir", str(tmp_path))


def _free_port() -> int:
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        return sock.getsockname()[1]


@pytest.mark.django_db(transaction=True, serialized_rollback=True)
def test_runfleet_collects_and_stops_every_child_on_sigterm(demo_fleet, tmp_path):
    """The launcher of `make run`: agents, worker, beat and web come up, samples land, and one
    SIGTERM stops every process it started (none is left behind)."""
    from django.db import connection

    call_command("demo_agents", "--dir", str(tmp_path / "agents"), "--base-port", str(_free_port()),
                 "--hosts", fleet_demo.POC_HOST)
    db = connection.settings_dict
    env = {**os.environ, "PYTHONUNBUFFERED": "1", "CELERY_QUEUE_DIR": str(tmp_path / "queue"),
           "TELEMETRY_POLL_INTERVAL_S": "2"}
    if connection.vendor == "postgresql":
        env["DATABASE_URL"] = f"postgres://{db['USER']}@{db['HOST'] or '127.0.0.1'}:{db['PORT'] or 5432}/{db['NAME']}"
        env.pop("REDIS_URL", None)
        env["CELERY_BROKER_URL"] = "filesystem://"
    else:
        env["SQLITE_PATH"] = str(db["NAME"])
    from django_celery_beat.models import IntervalSchedule, PeriodicTask

    PeriodicTask.objects.filter(name="poll_agents").update(
        interval=IntervalSchedule.objects.get_or_create(every=2, period=IntervalSchedule.SECONDS)[0],
        expire_seconds=1)
    launcher = subprocess.Popen(
        [sys.executable, "manage.py", "runfleet", f"127.0.0.1:{_free_port()}", "--noreload",
         "--agents-dir", str(tmp_path / "agents")],
        cwd=settings.BASE_DIR, env=env, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True,
    )
    lines: list[str] = []
    children: list[str] = []
    threading.Thread(target=lambda: lines.extend(line.rstrip() for line in launcher.stdout), daemon=True).start()
    try:
        deadline = time.monotonic() + 60

        def collected() -> bool:
            # A poll stores its samples, then records the agent's status in a second statement.
            return (GpuSample.objects.filter(gpu__host__name="poc-rtx6000").exists()
                    and Agent.objects.get(name="poc-rtx6000").status == AgentStatus.OK)

        while time.monotonic() < deadline and not collected():
            assert launcher.poll() is None, "\n".join(lines)
            time.sleep(0.5)
        assert GpuSample.objects.filter(gpu__host__name="poc-rtx6000").exists(), "\n".join(lines[-40:])
        assert Agent.objects.get(name="poc-rtx6000").status == AgentStatus.OK
        groups = subprocess.run(["pgrep", "-P", str(launcher.pid)], capture_output=True, text=True).stdout.split()
        children = subprocess.run(["pgrep", "-g", ",".join(groups)], capture_output=True, text=True).stdout.split()
        assert len(groups) == 4, "one agent, worker, beat and web"
    finally:
        launcher.send_signal(signal.SIGTERM)
        launcher.wait(timeout=30)
    time.sleep(0.5)
    left = [pid for pid in children if Path(f"/proc/{pid}").exists()]
    assert left == [], "\n".join(lines[-20:])
    assert any("SIGTERM received; stopping" in line for line in lines)
    assert any(line.startswith("web") for line in lines)
    assert any(line.startswith("agent:poc-rtx6000") for line in lines)
