"""`manage.py demo_agents` and `manage.py runfleet`: the embedded fleet of `make run`."""

from __future__ import annotations

import contextlib
import datetime as dt
import json
import os
import re
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
from django.contrib.auth import get_user_model
from django.core.management import call_command

from fleet import demo as fleet_demo
from fleet.catalog import catalog_model
from fleet.models import Gpu, Host, Vgpu
from telemetry import collect
from telemetry.agent.__main__ import read_token
from telemetry.agent.scenario import load_scenario
from telemetry.agent.server import AgentServer
from telemetry.agent.sim_backend import SimBackend
from telemetry.demo import demo_hosts, host_scenario
from telemetry.ingest import store_reports
from telemetry.models import Agent, AgentStatus, Drift, GpuSample, VgpuSample
from telemetry.payload import parse_agent_payload
from telemetry.queries import latest_gpu_samples, latest_vgpu_samples
from telemetry.tests.loopback import polled_agent, serving

pytestmark = pytest.mark.django_db


@pytest.fixture
def demo_fleet():
    fleet_demo.seed_demo(hosts=4, admin_password="pass-word-123", artist_password="pass-word-123")


@pytest.fixture
def make_run_fleet():
    """The fleet `make run` seeds: seed_demo's default options (the proof of concept and 8 hosts
    of Quadro RTX 6000, Quadro RTX 8000, L40S and A16)."""
    fleet_demo.seed_demo(admin_password="pass-word-123", artist_password="pass-word-123")


def test_demo_agents_write_scenarios_from_the_inventory_and_samples_map_back(demo_fleet, tmp_path, capsys):
    call_command("demo_agents", "--dir", str(tmp_path), "--base-port", "9511")
    out = capsys.readouterr().out

    manifest = json.loads((tmp_path / "agents.json").read_text())
    assert [entry["host"] for entry in manifest][0] == fleet_demo.POC_HOST
    assert sorted(entry["host"] for entry in manifest) == sorted(Host.objects.values_list("name", flat=True))
    assert [entry["url"] for entry in manifest] == [f"http://127.0.0.1:{9511 + n}" for n in range(len(manifest))]
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
    assert Agent.objects.count() == Host.objects.count()


def test_demo_agents_in_compose_are_polled_by_service_name(demo_fleet, tmp_path):
    """In docker-compose the agents listen on 0.0.0.0 but the worker reaches them as agent-sim."""
    call_command("demo_agents", "--dir", str(tmp_path), "--listen-host", "0.0.0.0", "--url-host", "agent-sim")
    assert Agent.objects.get(name="poc-rtx6000").url == "http://agent-sim:9411"
    manifest = json.loads((tmp_path / "agents.json").read_text())
    ports = range(9411, 9411 + Host.objects.count())
    assert [entry["listen"] for entry in manifest] == [f"0.0.0.0:{port}" for port in ports]
    assert {agent.url for agent in Agent.objects.all()} == {f"http://agent-sim:{port}" for port in ports}


def test_demo_agents_without_a_demo_fleet_says_what_to_run(tmp_path):
    from django.core.management.base import CommandError

    with pytest.raises(CommandError, match="run `manage.py seed_demo` first"):
        call_command("demo_agents", "--dir", str(tmp_path))


def _free_port() -> int:
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        return sock.getsockname()[1]


def _free_port_run(count: int) -> int:
    """The first of `count` consecutive ports on which nothing listens now."""
    for _ in range(50):
        base = _free_port()
        try:
            with contextlib.ExitStack() as stack:
                for port in range(base, base + count):
                    sock = stack.enter_context(socket.socket())
                    sock.bind(("127.0.0.1", port))
            return base
        except OSError:
            continue
    raise AssertionError(f"no {count} consecutive free ports")


def test_every_demo_host_gets_an_agent_and_one_simfleet_process_answers_for_all(make_run_fleet, tmp_path):
    """After seed_demo and demo_agents (as `make run` runs them) every host has an enabled agent
    bound to it, the one process runfleet starts serves each over real HTTP on loopback, and one
    poll gives every GPU and every VM of the demo figures: no blank row on /gpus/ or /vms/."""
    call_command("demo_agents", "--dir", str(tmp_path), "--base-port", str(_free_port_run(Host.objects.count())))

    hosts = set(Host.objects.values_list("name", flat=True))
    assert len(hosts) == 1 + fleet_demo.DEFAULT_HOSTS
    assert {agent.host.name for agent in Agent.objects.filter(enabled=True).select_related("host")} == hosts

    process = subprocess.Popen(
        # -S: the demo's agents need nothing beyond the standard library, like a real host's.
        [sys.executable, "-S", "-m", "telemetry.agent.simfleet", "--manifest", str(tmp_path / "agents.json")],
        cwd=settings.BASE_DIR, env={k: v for k, v in os.environ.items() if k != "PYTHONPATH"},
        stderr=subprocess.PIPE, text=True,
    )
    try:
        banners = [process.stderr.readline() for _ in hosts]
        assert {re.search(r"serving sim metrics of (\S+) on", line).group(1) for line in banners} == hosts, banners
        result = collect.poll_batch(list(Agent.objects.values_list("pk", flat=True)))
        assert result.ok == len(hosts)
        process.send_signal(signal.SIGTERM)
        assert process.wait(timeout=10) == 0, "SIGTERM stops every agent of the process cleanly"
    finally:
        if process.poll() is None:
            process.kill()
            process.wait()
        process.stderr.close()

    assert set(latest_gpu_samples()) == set(Gpu.objects.values_list("pk", flat=True))
    placed = set(Vgpu.objects.values_list("vm_id", "gpu_id"))
    assert len(placed) == Vgpu.objects.count() > 60
    assert set(latest_vgpu_samples()) == placed
    assert Drift.objects.count() == 0


WEEK_START = dt.datetime(2026, 1, 5, tzinfo=dt.UTC).timestamp()  # a Monday, 00:00 UTC


def _working_week(step_s: int = 20 * 60):
    """Instants of a working week, 9:00-19:00 UTC Monday to Friday: when the GPUs are busiest."""
    for day in range(5):
        start = WEEK_START + day * 86400 + 9 * 3600
        yield from range(int(start), int(start + 10 * 3600), step_s)


def test_every_demo_gpu_model_reports_power_and_clocks_within_its_board_limits(make_run_fleet, client):
    """For every GPU model `make run` seeds, a working week of simulated readings stays within
    the board's power limit and highest SM clock (fleet/catalog.py), and the GPU page and API
    never quote more watts than the board can draw: an A16 GPU, a quarter of a 250 W board, once
    showed up to 250 W."""
    peaks: dict[str, tuple[float, Host, float, str]] = {}  # model: (W, host, instant, GPU UUID)
    clocks: dict[str, int] = {}  # model: highest MHz
    for host in demo_hosts():
        backend = SimBackend(host_scenario(host, timezone="UTC"))
        for t in _working_week():
            for gpu in backend.collect(t):
                if gpu["power_w"] > peaks.get(gpu["name"], (-1.0,))[0]:
                    peaks[gpu["name"]] = (gpu["power_w"], host, t, gpu["uuid"])
                clocks[gpu["name"]] = max(clocks.get(gpu["name"], 0), gpu["sm_clock_mhz"])

    assert set(peaks) == set(fleet_demo.DEFAULT_GPU_MODELS)
    for name, (power, *_) in peaks.items():
        board, clock = catalog_model(name), clocks[name]
        assert power <= board.power_limit_w, f"{name} drew {power} W, over its {board.power_limit_w} W limit"
        assert power > 0.5 * board.power_limit_w, f"{name} never got busy: the check above would prove nothing"
        assert clock <= board.max_sm_clock_mhz, f"{name} ran at {clock} MHz, over its {board.max_sm_clock_mhz} MHz"

    # Each model's busiest reading, stored through the ingest, is what its GPU's page then quotes.
    client.force_login(get_user_model().objects.get(username="admin"))
    for name, (_, host, t, uuid) in peaks.items():
        board = catalog_model(name)
        agent = polled_agent(f"peak-{host.name}", "http://127.0.0.1:9", host=host)
        report = {"agent": {"version": "1.0.0", "hostname": host.name, "backend": "sim"}, "collected_at": t,
                  "gpus": SimBackend(host_scenario(host, timezone="UTC")).collect(t)}
        store_reports([(agent, parse_agent_payload(report))], check_clock=False)
        gpu = Gpu.objects.get(uuid=uuid)
        page = client.get(f"/gpus/{gpu.pk}/").content.decode()
        shown_w = int(re.search(r"°C, (\d+) W", page).group(1))
        assert shown_w <= board.power_limit_w, f"the {name} page shows {shown_w} W"
        latest = client.get(f"/api/v1/gpus/{gpu.pk}/").json()["latest"]
        assert latest["power_w"] <= board.power_limit_w
        assert latest["sm_clock_mhz"] <= board.max_sm_clock_mhz


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
        assert len(groups) == 4, "one process of agents, worker, beat and web"
    finally:
        launcher.send_signal(signal.SIGTERM)
        launcher.wait(timeout=30)
    time.sleep(0.5)
    left = [pid for pid in children if Path(f"/proc/{pid}").exists()]
    assert left == [], "\n".join(lines[-20:])
    assert any("SIGTERM received; stopping" in line for line in lines)
    assert any(line.startswith("web") for line in lines)
    assert any(line.startswith("agents") and "serving sim metrics of poc-rtx6000" in line for line in lines)
