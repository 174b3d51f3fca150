"""/metrics: the Prometheus exposition, read back with prometheus_client's own parser, and who
may read it: a scraper with METRICS_TOKEN or a staff user (API token or session), from loopback
as from anywhere; anonymous callers, wrong tokens and artists are refused."""

import subprocess
from datetime import UTC, datetime, timedelta

import pytest
from django.db import connection
from django.test import Client
from django.test.utils import CaptureQueriesContext
from django.utils import timezone
from prometheus_client.parser import text_string_to_metric_families

from fleet.api_tokens import issue_token, revoke_token
from fleet.tests.factories import GpuFactory, HostFactory, UserFactory, VirtualMachineFactory
from telemetry.models import (
    Agent,
    AgentKind,
    GpuHealthState,
    GuestSample,
    HostDriverState,
    VgpuHealthState,
    XidError,
)
from telemetry.tests.rollup_world import gpu_samples, studio, vgpu_samples

SCRAPE_TOKEN = "s3cret-scrape-token"
#: The clock stands still at this instant in every test here: ages are exact.
NOW = datetime(2026, 3, 4, 12, 0, 30, tzinfo=UTC)
pytestmark = pytest.mark.time_machine(NOW, tick=False)
SCRAPER = {"HTTP_AUTHORIZATION": f"Bearer {SCRAPE_TOKEN}"}


@pytest.fixture(autouse=True)
def _metrics_token(settings):
    settings.METRICS_TOKEN = SCRAPE_TOKEN
    settings.METRICS_PUBLIC = False


def scrape(client=None, **extra) -> dict[str, list]:
    """{metric name: [(labels, value), ...]} of one scrape with METRICS_TOKEN, as Prometheus sends it."""
    response = (client or Client()).get("/metrics", **{**SCRAPER, **extra})
    assert response.status_code == 200, response.content
    assert response["Content-Type"].startswith("text/plain; version=")
    return {
        family.name: [(sample.labels, sample.value) for sample in family.samples]
        for family in text_string_to_metric_families(response.content.decode())
    }


def value(metrics, name, **labels):
    """The value of the one series of `name` whose labels include `labels`."""
    found = [v for series_labels, v in metrics[name] if labels.items() <= series_labels.items()]
    assert len(found) == 1, (name, labels, metrics.get(name))
    return found[0]


@pytest.fixture
def world(db):
    return studio()


def test_gpu_gauges_carry_inventory_labels_and_newest_values(world):
    now = timezone.now()
    gpu_samples(world.gpu_1, now - timedelta(seconds=25), 2, util_gpu=lambda i: [40.0, 75.0][i], util_mem=33.0,
                fb_used_mib=20480.0, fb_total_mib=46068.0, enc_util=None, dec_util=2.0, temp_c=61.0,
                power_w=233.5, sm_clock_mhz=2040.0)

    metrics = scrape()

    labels = {"host": "render-01", "gpu_uuid": "GPU-aaaa-0001", "pci_bus_id": "00000000:3B:00.0",
              "gpu_model": "NVIDIA L40S"}
    assert metrics["vgpu_fleet_gpu_utilization_percent"] == [(labels, 75.0)]  # the newer of the two
    assert value(metrics, "vgpu_fleet_gpu_memory_utilization_percent", **labels) == 33.0
    assert value(metrics, "vgpu_fleet_gpu_fb_used_mib", **labels) == 20480.0
    assert value(metrics, "vgpu_fleet_gpu_fb_total_mib", **labels) == 46068.0
    assert value(metrics, "vgpu_fleet_gpu_temperature_celsius", **labels) == 61.0
    assert value(metrics, "vgpu_fleet_gpu_power_watts", **labels) == 233.5
    assert value(metrics, "vgpu_fleet_gpu_sm_clock_mhz", **labels) == 2040.0
    assert value(metrics, "vgpu_fleet_gpu_decoder_utilization_percent", **labels) == 2.0
    assert value(metrics, "vgpu_fleet_gpu_sample_age_seconds", **labels) == 15  # the newer one, 25 - 10 s ago
    # Not reported by the GPU: no series at all, never a 0.
    assert metrics["vgpu_fleet_gpu_encoder_utilization_percent"] == []


def test_stale_and_missing_readings_are_left_out(world, settings):
    settings.TELEMETRY_STALE_AFTER_S = 60
    now = timezone.now()
    gpu_samples(world.gpu_1, now - timedelta(seconds=5), 1, util_gpu=10.0)
    gpu_samples(world.gpu_2, now - timedelta(minutes=10), 1, util_gpu=90.0)  # stale
    vgpu_samples(world.vm_bob, world.gpu_2, now - timedelta(minutes=10), 1, fb_used_mib=4096.0)  # stale

    metrics = scrape()

    assert [labels["gpu_uuid"] for labels, _ in metrics["vgpu_fleet_gpu_utilization_percent"]] == ["GPU-aaaa-0001"]
    assert metrics["vgpu_fleet_vgpu_fb_used_mib"] == []


def test_vgpu_gauges_name_vm_artist_and_profile(world):
    now = timezone.now()
    vgpu_samples(world.vm_ana, world.gpu_1, now - timedelta(seconds=10), 1, fb_used_mib=6000.0, util_gpu=20.0,
                 util_mem=10.0, enc_util=None, dec_util=1.0)
    vgpu_samples(world.vm_ana, world.gpu_2, now - timedelta(seconds=10), 1, fb_used_mib=7000.0, util_gpu=30.0)
    world.vm_bob.artist = None
    world.vm_bob.save(update_fields=["artist"])

    metrics = scrape()

    ana_1 = {"host": "render-01", "gpu_uuid": "GPU-aaaa-0001", "vm": "ws-ana", "artist": "Ana", "profile": "L40S-12Q"}
    ana_2 = {**ana_1, "gpu_uuid": "GPU-aaaa-0002"}
    assert sorted(metrics["vgpu_fleet_vgpu_fb_used_mib"], key=lambda s: s[1]) == [(ana_1, 6000.0), (ana_2, 7000.0)]
    assert value(metrics, "vgpu_fleet_vgpu_utilization_percent", **ana_2) == 30.0
    assert value(metrics, "vgpu_fleet_vgpu_memory_utilization_percent", **ana_1) == 10.0
    assert value(metrics, "vgpu_fleet_vgpu_decoder_utilization_percent", **ana_1) == 1.0
    assert metrics["vgpu_fleet_vgpu_encoder_utilization_percent"] == []
    # Every placed vGPU has its profile's frame buffer, with or without a reading.
    assert value(metrics, "vgpu_fleet_vgpu_profile_fb_mib", vm="ws-bob", artist="") == 12288.0
    assert len(metrics["vgpu_fleet_vgpu_profile_fb_mib"]) == 3


def test_capacity_gauges(world):
    GpuFactory(host=world.host, mode="passthrough", pci_bus_id="00000000:86:00.0")  # a Quadro RTX 6000

    metrics = scrape()

    assert value(metrics, "vgpu_fleet_gpus", gpu_model="NVIDIA L40S", mode="vgpu") == 3
    assert value(metrics, "vgpu_fleet_gpus", gpu_model="Quadro RTX 6000", mode="passthrough") == 1
    assert value(metrics, "vgpu_fleet_vgpus_placed", gpu_model="NVIDIA L40S") == 3
    assert value(metrics, "vgpu_fleet_fb_total_mib", gpu_model="NVIDIA L40S") == 3 * 49152
    assert value(metrics, "vgpu_fleet_fb_allocated_mib", gpu_model="NVIDIA L40S") == 3 * 12288
    # Passthrough GPUs give no frame buffer to vGPUs.
    assert [labels["gpu_model"] for labels, _ in metrics["vgpu_fleet_fb_total_mib"]] == ["NVIDIA L40S"]


def test_agent_gauges(world):
    now = timezone.now()
    Agent.objects.create(name="agent-ok", url="http://render-01:9410", host=world.host,
                         last_seen=now - timedelta(seconds=5))
    Agent.objects.create(name="agent-stale", url="http://render-02:9410", last_seen=now - timedelta(hours=1))
    Agent.objects.create(name="agent-new", url="http://render-03:9410")
    Agent.objects.create(name="agent-off", url="http://render-04:9410", enabled=False)

    metrics = scrape()

    assert value(metrics, "vgpu_fleet_agent_up", agent="agent-ok", kind="nvml", host="render-01") == 1
    assert value(metrics, "vgpu_fleet_agent_up", agent="agent-stale", host="") == 0
    assert value(metrics, "vgpu_fleet_agent_up", agent="agent-new") == 0
    assert "agent-off" not in {labels["agent"] for labels, _ in metrics["vgpu_fleet_agent_up"]}
    assert value(metrics, "vgpu_fleet_agent_last_seen_age_seconds", agent="agent-stale") == 3600
    assert {labels["agent"] for labels, _ in metrics["vgpu_fleet_agent_last_seen_age_seconds"]} == {
        "agent-ok", "agent-stale",
    }


VM_GAUGES = ("vgpu_fleet_vm_vcpu_utilization_percent", "vgpu_fleet_vm_vcpu_max_utilization_percent",
             "vgpu_fleet_vm_cpu_steal_percent", "vgpu_fleet_vm_ram_used_mib", "vgpu_fleet_vm_ram_mib",
             "vgpu_fleet_vm_vcpus")


def guest_sample(vm, age_s: float, **fields) -> GuestSample:
    """A guest reading of `vm` taken `age_s` seconds ago: 8 vCPUs and 32 GiB unless `fields` say otherwise."""
    values = {"vcpus": 8, "ram_mib": 32768, "vcpu_util": 12.5, "vcpu_max_util": 96.0, "cpu_steal_pct": 0.8,
              "ram_used_mib": 6144, **fields}
    return GuestSample.objects.create(vm=vm, ts=timezone.now() - timedelta(seconds=age_s), **values)


def test_guest_gauges_carry_host_vm_and_artist_and_the_newest_reading(world):
    guest_sample(world.vm_ana, 40, vcpu_util=50.0)  # older: not shown
    guest_sample(world.vm_ana, 10)

    metrics = scrape()

    ana = {"host": "render-01", "vm": "ws-ana", "artist": "Ana"}
    assert metrics["vgpu_fleet_vm_vcpu_utilization_percent"] == [(ana, 12.5)]
    assert metrics["vgpu_fleet_vm_vcpu_max_utilization_percent"] == [(ana, 96.0)]
    assert metrics["vgpu_fleet_vm_cpu_steal_percent"] == [(ana, 0.8)]
    assert metrics["vgpu_fleet_vm_ram_used_mib"] == [(ana, 6144.0)]
    assert metrics["vgpu_fleet_vm_ram_mib"] == [(ana, 32768.0)]
    assert metrics["vgpu_fleet_vm_vcpus"] == [(ana, 8.0)]


def test_guest_figures_not_reported_or_stale_have_no_series(world, settings):
    settings.TELEMETRY_STALE_AFTER_S = 60
    spare = VirtualMachineFactory(name="ws-spare", artist=None)  # no vGPU, so not placed on a host
    # Its guest has no balloon driver and its vCPU counters went back: no memory or CPU figure.
    guest_sample(spare, 5, vcpu_util=None, vcpu_max_util=None, cpu_steal_pct=None, ram_used_mib=None)
    guest_sample(world.vm_bob, 5 * 60, vcpu_util=70.0)  # stale

    metrics = scrape()

    for name in ("vgpu_fleet_vm_vcpu_utilization_percent", "vgpu_fleet_vm_vcpu_max_utilization_percent",
                 "vgpu_fleet_vm_cpu_steal_percent", "vgpu_fleet_vm_ram_used_mib"):
        assert metrics[name] == [], name
    spare_labels = {"host": "", "vm": "ws-spare", "artist": ""}
    assert metrics["vgpu_fleet_vm_ram_mib"] == [(spare_labels, 32768.0)]
    assert metrics["vgpu_fleet_vm_vcpus"] == [(spare_labels, 8.0)]
    assert "ws-bob" not in {labels["vm"] for name in VM_GAUGES for labels, _ in metrics[name]}


def fleet_of(gpus: int) -> None:
    """`gpus` GPUs with a fresh sample, and as many VMs with a fresh guest reading."""
    host = HostFactory()
    now = timezone.now()
    for _ in range(gpus):
        gpu_samples(GpuFactory(host=host), now - timedelta(seconds=5), 1, util_gpu=50.0)
        guest_sample(VirtualMachineFactory(host=host), 5)


def test_scrape_costs_the_same_queries_for_2_and_20_gpus(db):
    fleet_of(2)
    with CaptureQueriesContext(connection) as small:
        small_metrics = scrape()
    fleet_of(18)
    with CaptureQueriesContext(connection) as large:
        large_metrics = scrape()

    assert len(small_metrics["vgpu_fleet_gpu_utilization_percent"]) == 2
    assert len(large_metrics["vgpu_fleet_gpu_utilization_percent"]) == 20
    assert len(small_metrics["vgpu_fleet_vm_vcpu_utilization_percent"]) == 2
    assert len(large_metrics["vgpu_fleet_vm_vcpu_utilization_percent"]) == 20
    # GPUs, their samples, health states, XIDs, vGPUs, their samples, vGPU health, drivers, guest
    # readings, VMs, agents: the module docstring's eleven.
    assert len(large) == len(small) == 11


# Health (issue 19) ------------------------------------------------------------------------------

GPU_1 = {"host": "render-01", "gpu_uuid": "GPU-aaaa-0001", "pci_bus_id": "00000000:3B:00.0", "gpu_model": "NVIDIA L40S"}


def _health_world(world):
    now = timezone.now()
    gpu_samples(world.gpu_1, now - timedelta(seconds=5), 1, util_gpu=50.0, clocks_event_reasons=0x44)
    gpu_samples(world.gpu_2, now - timedelta(seconds=5), 1, util_gpu=10.0)
    gpu_samples(world.gpu_idle, now - timedelta(hours=2), 1, util_gpu=0.0)  # stale
    GpuHealthState.objects.create(
        gpu=world.gpu_1, ecc_mode="enabled", ecc_corrected_volatile=3, ecc_uncorrected_volatile=1,
        ecc_corrected_aggregate=40, ecc_uncorrected_aggregate=2, remapped_rows_correctable=4,
        remapped_rows_uncorrectable=1, remapped_rows_pending=True, remapped_rows_failure=False, pcie_replay_counter=9,
        temp_slowdown_c=87.0, temp_shutdown_c=92.0, power_limit_w=350.0, performance_state="P2",
        unsupported=["retired_pages_sbe", "retired_pages_dbe", "retired_pages_pending", "fan_speed_pct"],
        throttle_reasons=["sw_power_cap", "hw_thermal_slowdown"], changed_at=now)
    GpuHealthState.objects.create(gpu=world.gpu_2, ecc_mode="disabled", unsupported=[], changed_at=now)
    GpuHealthState.objects.create(gpu=world.gpu_idle, ecc_corrected_volatile=7, unsupported=[], changed_at=now)
    XidError.objects.create(gpu=world.gpu_1, code=48, at=now - timedelta(hours=1))
    XidError.objects.create(gpu=world.gpu_1, code=79, at=now - timedelta(minutes=1))
    VgpuHealthState.objects.create(vm=world.vm_ana, gpu=world.gpu_1, license_state="licensed",
                                   license_expiry=datetime(2027, 1, 1, tzinfo=UTC), frame_rate_limit=60,
                                   encoder_sessions=1, unsupported=[], changed_at=now)
    VgpuHealthState.objects.create(vm=world.vm_bob, gpu=world.gpu_2, license_state="unlicensed", unsupported=[],
                                   changed_at=now)
    HostDriverState.objects.create(host=world.host, driver_version="580.159.04", vgpu_manager_version="19.2",
                                   cuda_driver_version=13000, unsupported=[], changed_at=now)


def test_gpu_health_has_dcgm_exporters_names_and_no_series_for_what_is_unsupported(world):
    _health_world(world)

    metrics = scrape()

    assert value(metrics, "DCGM_FI_DEV_ECC_SBE_VOL_TOTAL", **GPU_1) == 3
    assert value(metrics, "DCGM_FI_DEV_ECC_DBE_VOL_TOTAL", **GPU_1) == 1
    assert value(metrics, "DCGM_FI_DEV_ECC_SBE_AGG_TOTAL", **GPU_1) == 40
    assert value(metrics, "DCGM_FI_DEV_ECC_DBE_AGG_TOTAL", **GPU_1) == 2
    assert value(metrics, "DCGM_FI_DEV_CORRECTABLE_REMAPPED_ROWS", **GPU_1) == 4
    assert value(metrics, "DCGM_FI_DEV_UNCORRECTABLE_REMAPPED_ROWS", **GPU_1) == 1
    assert value(metrics, "DCGM_FI_DEV_ROW_REMAP_PENDING", **GPU_1) == 1
    assert value(metrics, "DCGM_FI_DEV_ROW_REMAP_FAILURE", **GPU_1) == 0
    assert value(metrics, "DCGM_FI_DEV_PCIE_REPLAY_COUNTER", **GPU_1) == 9
    assert value(metrics, "DCGM_FI_DEV_POWER_MGMT_LIMIT", **GPU_1) == 350
    assert value(metrics, "DCGM_FI_DEV_CLOCK_THROTTLE_REASONS", **GPU_1) == 0x44
    assert value(metrics, "DCGM_FI_DEV_XID_ERRORS", **GPU_1) == 79  # the newest
    assert value(metrics, "vgpu_fleet_gpu_slowdown_temperature_celsius", **GPU_1) == 87
    assert value(metrics, "vgpu_fleet_gpu_shutdown_temperature_celsius", **GPU_1) == 92
    assert value(metrics, "vgpu_fleet_gpu_performance_state", **GPU_1) == 2
    assert value(metrics, "vgpu_fleet_gpu_ecc_enabled", **GPU_1) == 1
    assert value(metrics, "vgpu_fleet_gpu_ecc_enabled", gpu_uuid="GPU-aaaa-0002") == 0
    # Unsupported (null): no series, never 0; an XID gauge of 0 where health is reported but no XID.
    assert metrics["DCGM_FI_DEV_FAN_SPEED"] == []
    assert metrics["DCGM_FI_DEV_RETIRED_SBE"] == []
    assert [labels["gpu_uuid"] for labels, _ in metrics["DCGM_FI_DEV_ECC_SBE_VOL_TOTAL"]] == ["GPU-aaaa-0001"]
    assert value(metrics, "DCGM_FI_DEV_XID_ERRORS", gpu_uuid="GPU-aaaa-0002") == 0
    assert [labels["gpu_uuid"] for labels, _ in metrics["DCGM_FI_DEV_CLOCK_THROTTLE_REASONS"]] == ["GPU-aaaa-0001"]
    # The idle GPU's sample is stale: none of its health either.
    assert "GPU-bbbb-0001" not in {labels["gpu_uuid"] for labels, _ in metrics["DCGM_FI_DEV_XID_ERRORS"]}


def test_vgpu_licence_and_host_driver(world):
    _health_world(world)

    metrics = scrape()

    ana = {"vm": "ws-ana", "gpu_uuid": "GPU-aaaa-0001", "artist": "Ana", "profile": "L40S-12Q"}
    assert value(metrics, "DCGM_FI_DEV_VGPU_LICENSE_STATUS", **ana) == 1
    assert value(metrics, "DCGM_FI_DEV_VGPU_LICENSE_STATUS", vm="ws-bob") == 0
    assert value(metrics, "vgpu_fleet_vgpu_license_expiry_timestamp_seconds", **ana) == datetime(
        2027, 1, 1, tzinfo=UTC).timestamp()
    assert value(metrics, "vgpu_fleet_vgpu_frame_rate_limit_fps", **ana) == 60
    assert value(metrics, "vgpu_fleet_vgpu_encoder_sessions", **ana) == 1
    assert [labels["vm"] for labels, _ in metrics["vgpu_fleet_vgpu_encoder_sessions"]] == ["ws-ana"]
    assert metrics["vgpu_fleet_host_driver_info"] == [(
        {"host": "render-01", "driver_version": "580.159.04", "vgpu_manager_version": "19.2",
         "cuda_driver_version": "13000"}, 1.0)]


def test_the_exposition_with_health_passes_promtool(world):
    _health_world(world)
    guest_sample(world.vm_ana, 5)
    guest_sample(world.vm_bob, 5, ram_used_mib=None)
    response = Client().get("/metrics", **SCRAPER)

    checked = subprocess.run(["promtool", "check", "metrics"], input=response.content, capture_output=True,
                             check=False)

    # promtool's lint asks counters for a _total suffix and snake_case labels: dcgm-exporter's
    # names (gauges here, as there) are kept for compatibility. Anything else is a failure.
    problems = [line for line in checked.stderr.decode().splitlines() + checked.stdout.decode().splitlines()
                if line and "DCGM_FI_" not in line.split(" ")[0]]
    assert problems == []
    assert checked.returncode in (0, 3), checked  # 3: lint findings only


# Access ----------------------------------------------------------------------------------------

LAN = "10.1.2.3"
LOOPBACK = ("127.0.0.1", "::1", "::ffff:127.0.0.1")


def get(client=None, **extra):
    return (client or Client()).get("/metrics", **extra)


def assert_refused(response, status: int) -> None:
    """Refused, and nothing of the fleet (artists' names, VMs, hosts) in the answer."""
    assert response.status_code == status, response.content
    for secret in (b"Ana", b"ws-ana", b"render-01", b"vgpu_fleet"):
        assert secret not in response.content


@pytest.mark.parametrize("token", [SCRAPE_TOKEN, ""])
def test_anonymous_scrapes_are_refused_from_loopback_too(world, settings, token):
    """A reverse proxy on the dashboard's own machine makes every request loopback's."""
    settings.METRICS_TOKEN = token
    for addr in (*LOOPBACK, LAN):
        response = get(REMOTE_ADDR=addr)
        assert_refused(response, 401)
        assert response["WWW-Authenticate"].startswith('Bearer realm="metrics"')


def test_wrong_bearer_tokens_are_refused(world, settings):
    agent = Agent.objects.create(name="render-01-push", kind=AgentKind.NVIDIA_SMI, host=world.host)
    for header in ("Bearer not-it", f"Bearer {SCRAPE_TOKEN}x", f"Bearer {SCRAPE_TOKEN[:-1]}", "Bearer ",
                   f"Basic {SCRAPE_TOKEN}", SCRAPE_TOKEN, "Bearer \u00e9t\u00e9", f"Bearer {agent.token}"):
        assert_refused(get(HTTP_AUTHORIZATION=header, REMOTE_ADDR="127.0.0.1"), 401)
    # With no METRICS_TOKEN set, no bearer token is right, the empty one included.
    settings.METRICS_TOKEN = ""
    for header in ("Bearer ", "Bearer", 'Bearer ""'):
        assert_refused(get(HTTP_AUTHORIZATION=header), 401)


def test_the_metrics_token_opens_it_from_anywhere(world):
    for addr in ("127.0.0.1", LAN):
        response = get(HTTP_AUTHORIZATION=f"Bearer {SCRAPE_TOKEN}", REMOTE_ADDR=addr)
        assert response.status_code == 200
        assert b"# TYPE vgpu_fleet_gpus gauge" in response.content


def test_a_staff_api_token_opens_it_and_the_body_parses(world):
    vgpu_samples(world.vm_ana, world.gpu_1, timezone.now() - timedelta(seconds=10), 1, fb_used_mib=6000.0)
    _, key = issue_token(UserFactory(username="prometheus-bot", is_staff=True), "prometheus")

    metrics = scrape(HTTP_AUTHORIZATION=f"Token {key}", REMOTE_ADDR=LAN)

    assert value(metrics, "vgpu_fleet_vgpu_fb_used_mib", vm="ws-ana", artist="Ana") == 6000.0


def test_revoked_or_inactive_staff_tokens_are_refused(world):
    staff = UserFactory(username="prometheus-bot", is_staff=True)
    revoked, revoked_key = issue_token(staff, "old")
    revoke_token(revoked)
    _, inactive_key = issue_token(UserFactory(username="left-the-studio", is_staff=True, is_active=False))

    for header in (f"Token {revoked_key}", f"Token {inactive_key}", "Token " + "0" * 48, "Token "):
        assert_refused(get(HTTP_AUTHORIZATION=header, REMOTE_ADDR=LAN), 401)


def test_a_staff_read_token_opens_it_and_an_ingest_token_does_not(world):
    staff = UserFactory(username="prometheus-bot", is_staff=True)
    _, read_key = issue_token(staff, "prometheus", scope="read")
    _, ingest_key = issue_token(staff, "smi cron", scope="ingest")

    assert get(HTTP_AUTHORIZATION=f"Token {read_key}", REMOTE_ADDR=LAN).status_code == 200
    refused = get(HTTP_AUTHORIZATION=f"Token {ingest_key}", REMOTE_ADDR=LAN)
    assert_refused(refused, 403)
    assert refused.content.decode().startswith("This API token's scope is ingest:")


def test_a_revoked_or_expired_token_is_told_why(world, time_machine):
    time_machine.move_to(datetime(2026, 3, 2, 10, 0, tzinfo=UTC), tick=False)
    staff = UserFactory(username="prometheus-bot", is_staff=True)
    revoked, revoked_key = issue_token(staff, "old")
    revoke_token(revoked, reason="rotated")
    _, expired_key = issue_token(staff, "short", expires_at=datetime(2026, 3, 2, 9, 0, tzinfo=UTC))

    for key, reason in ((revoked_key, "Token revoked on 2026-03-02 10:00 UTC (rotated)."),
                        (expired_key, "Token expired on 2026-03-02 09:00 UTC.")):
        response = get(HTTP_AUTHORIZATION=f"Token {key}", REMOTE_ADDR=LAN)
        assert_refused(response, 401)
        assert response.content.decode().splitlines()[0] == reason


def test_an_artist_may_not_read_fleet_wide_metrics_by_token_or_session(world):
    """The exposition names every artist and VM: an artist's own credentials are not enough."""
    _, key = issue_token(world.ana.user)
    session = Client()
    session.force_login(world.ana.user)

    assert_refused(get(HTTP_AUTHORIZATION=f"Token {key}", REMOTE_ADDR="127.0.0.1"), 403)
    assert_refused(get(session, REMOTE_ADDR="127.0.0.1"), 403)


def test_a_staff_session_opens_it(world):
    staff = Client()
    staff.force_login(UserFactory(username="it-admin", is_staff=True))
    assert get(staff, REMOTE_ADDR=LAN).status_code == 200


def test_metrics_public_opens_it_to_anyone(world, settings):
    settings.METRICS_PUBLIC = True
    metrics = scrape(HTTP_AUTHORIZATION="", REMOTE_ADDR=LAN)
    assert value(metrics, "vgpu_fleet_vgpus_placed", gpu_model="NVIDIA L40S") == 3
