"""The demo fleet's health events (sim_events.py): each kind within the first five minutes of
scenario time somewhere in the fleet, each recurring, all of it deterministic."""

from __future__ import annotations

import json

import pytest

from telemetry.agent import BackendUnavailable
from telemetry.agent.scenario import build_scenario
from telemetry.agent.sim_backend import SimBackend
from telemetry.agent.sim_events import KINDS, PERIOD_S

START = 1_780_000_000.0  # the fleet process's start
HOSTS = 4
STEP_S = 10  # the collector's polling interval in the demo


def _scenario(n: int) -> dict:
    return build_scenario(f"node-{n:02d}", [
        {"name": "NVIDIA L40S", "fb_total_mib": 46068, "power_limit_w": 350, "max_sm_clock_mhz": 2520,
         "vgpus": [{"vm_name": f"ws-{n}-{i}", "type_name": "L40S-8Q", "fb_mib": 8192, "workflow": "lighting"}
                   for i in range(3)]},
        {"name": "Quadro RTX 6000", "fb_total_mib": 24576, "power_limit_w": 250, "max_sm_clock_mhz": 1770,
         "vgpus": [{"vm_name": f"ws-{n}-x", "type_name": "RTX6000-12Q", "fb_mib": 12288, "workflow": "modeling"}]},
    ], timezone="UTC")


def _fleet() -> list[SimBackend]:
    return [SimBackend(_scenario(n), events_from=START, slot=n, hosts=HOSTS) for n in range(HOSTS)]


def _kinds_seen(fleet: list[SimBackend], since: float, until: float) -> dict[str, float]:
    """kind -> first instant (seconds after START) any host showed it, polling every STEP_S."""
    seen: dict[str, float] = {}
    for t in range(int(since), int(until), STEP_S):
        for backend in fleet:
            try:
                gpus = backend.collect(float(t))
            except BackendUnavailable:
                seen.setdefault("outage", t - START)
                continue
            for kind in _kinds_in(gpus):
                seen.setdefault(kind, t - START)
    return seen


def _kinds_in(gpus: list[dict]) -> set[str]:
    kinds = set()
    for gpu in gpus:
        health = gpu["health"]
        if health["xid_events"]:
            kinds.add("xid")
        if health["ecc_uncorrected_volatile"]:
            kinds.add("ecc")
        if health["remapped_rows_pending"] or health["remapped_rows_failure"] or health["retired_pages_pending"]:
            kinds.add("remap")
        if "hw_thermal_slowdown" in health["throttle_reasons"] and gpu["temp_c"] > health["temp_slowdown_c"]:
            kinds.add("thermal")
        for vgpu in gpu["vgpus"]:
            if vgpu["license_state"] == "unlicensed":
                kinds.add("license_lapse")
            if vgpu["license_expiry"] is not None and vgpu["license_expiry"] - gpu_time(gpu) < 7 * 86400:
                kinds.add("license_expiring")
    return kinds | _fb_full(gpus)


def gpu_time(gpu: dict) -> float:
    return gpu["_t"]


PROFILE_MIB = {"L40S-8Q": 8192, "RTX6000-12Q": 12288}


def _fb_full(gpus: list[dict]) -> set[str]:
    """Some vGPU's frame buffer above 95 % of its profile."""
    return {"fb_full" for gpu in gpus for vgpu in gpu["vgpus"]
            if vgpu["fb_used_mib"] > 0.95 * PROFILE_MIB[vgpu["type_name"]]}


@pytest.fixture(autouse=True)
def _stamp_instants(monkeypatch):
    """Let `_kinds_in` know each reading's instant (the licence test compares expiry with it)."""
    collect = SimBackend.collect

    def stamped(self, now=None):
        gpus = collect(self, now)
        for gpu in gpus:
            gpu["_t"] = now
        return gpus

    monkeypatch.setattr(SimBackend, "collect", stamped)


def test_every_kind_shows_somewhere_in_the_fleet_within_five_minutes_of_the_start():
    seen = _kinds_seen(_fleet(), START, START + 300)

    assert set(seen) == set(KINDS), f"missing: {set(KINDS) - set(seen)}"
    assert all(0 <= first < 300 for first in seen.values()), seen


def test_every_kind_recurs_within_the_next_hour():
    seen = _kinds_seen(_fleet(), START + PERIOD_S, START + PERIOD_S + 300)

    assert set(seen) == set(KINDS)


def test_a_healthy_fleet_without_a_schedule_shows_no_event():
    calm = [SimBackend(_scenario(n)) for n in range(HOSTS)]

    assert _kinds_seen(calm, START, START + 600) == {}


def test_readings_are_deterministic_and_an_xid_is_reported_once():
    def run() -> list:
        fleet = _fleet()
        out = []
        for t in range(int(START), int(START) + 120, STEP_S):
            out.append(json.dumps([b.collect(float(t)) for b in fleet], sort_keys=True))
        return out

    first, second = run(), run()
    assert first == second
    xids = [event for snapshot in first for host in json.loads(snapshot) for gpu in host
            for event in gpu["health"]["xid_events"]]
    assert len(xids) == 1, "one XID in the first two minutes, reported by one poll"
    assert xids[0]["code"] in {13, 31, 43, 48, 63, 64, 74, 79, 92, 94, 95}


def test_one_host_runs_an_older_driver_branch_and_one_guest_is_newer_than_its_host():
    fleet = _fleet()
    drivers = [backend.driver()["driver_version"] for backend in fleet]
    assert len(set(drivers)) == 2
    older = fleet[drivers.index(min(drivers))]
    guests = [v["guest_driver_version"] for gpu in older.collect(START + 5) for v in gpu["vgpus"]]
    host_branch = older.driver()["driver_version"].split(".")[0]
    assert any(g.split(".")[0] > host_branch for g in guests)
    assert older.driver()["vgpu_manager_version"] != fleet[0].driver()["vgpu_manager_version"]
