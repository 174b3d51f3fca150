"""Storing the health fields (issue 19): state rows written only when they change, XID events
once each, vGPU rows that go with their vGPU, and nothing outside the agent's scope."""

from __future__ import annotations

import dataclasses
from datetime import UTC, datetime

import pytest
from django.db import connection
from django.test.utils import CaptureQueriesContext

from fleet import services
from fleet.tests.factories import VirtualMachineFactory, profile
from telemetry.ingest import sample_time, store_reports
from telemetry.models import (
    AgentKind,
    Drift,
    DriftKind,
    GpuHealthState,
    GpuSample,
    HostDriverState,
    VgpuHealthState,
    XidError,
)
from telemetry.payload import DriverInfo, GpuHealth, VgpuHealth, XidEvent
from telemetry.sources.nvidia_smi import parse_nvidia_smi
from telemetry.tests.ingest_world import (
    OWN_FIXTURES,
    T0,
    gpu_reading,
    l40s_world,
    make_agent,
    report,
    vgpu_reading,
)

pytestmark = pytest.mark.django_db

HEALTH_TABLES = ("telemetry_gpuhealthstate", "telemetry_vgpuhealthstate", "telemetry_hostdriverstate",
                 "telemetry_xiderror")


@pytest.fixture
def world():
    return l40s_world()


def _health(**fields) -> GpuHealth:
    values = dict(
        ecc_mode="enabled", ecc_corrected_volatile=3, ecc_uncorrected_volatile=0, ecc_corrected_aggregate=12,
        ecc_uncorrected_aggregate=0, retired_pages_sbe=None, retired_pages_dbe=None, retired_pages_pending=None,
        remapped_rows_correctable=1, remapped_rows_uncorrectable=0, remapped_rows_pending=False,
        remapped_rows_failure=False, throttle_reasons=["sw_power_cap"], pcie_replay_counter=7, fan_speed_pct=None,
        temp_slowdown_c=87.0, temp_shutdown_c=92.0, power_limit_w=350.0, performance_state="P0", xid_events=[],
        unsupported=["retired_pages_sbe", "retired_pages_dbe", "retired_pages_pending", "fan_speed_pct"],
    )
    values.update(fields)
    return GpuHealth(**values)


def _vgpu_health(**fields) -> VgpuHealth:
    values = dict(license_state="licensed", license_expiry=T0 + 86400 * 30, guest_driver_version="580.95",
                  frame_rate_limit=60, encoder_sessions=1, guest_info_state="initialized", unsupported=[])
    values.update(fields)
    return VgpuHealth(**values)


DRIVER = DriverInfo(driver_version="580.159.04", vgpu_manager_version="19.2", nvml_version="12.580.159.04",
                    cuda_driver_version=13000, unsupported=[])


def _report(world, at: float = T0, *, health: GpuHealth | None = None, vgpu_health: VgpuHealth | None = None,
            lighting: bool = True, driver: DriverInfo | None = DRIVER, **gpu_fields):
    """render-01's report: the first L40S (running ws-lighting-01's vGPU unless `lighting` is off)
    and the second, both with `health`."""
    health = _health() if health is None else health
    vgpus = [vgpu_reading(str(world.lighting.uuid), "ws-lighting-01", health=vgpu_health or _vgpu_health())
             ] if lighting else []
    gpus = [gpu_reading(world.gpu.uuid, vgpus=vgpus, health=health, clocks_event_reasons=4, **gpu_fields),
            gpu_reading(world.gpu_2.uuid, index=1, pci_bus_id=world.gpu_2.pci_bus_id,
                        health=dataclasses.replace(health, xid_events=[]))]
    return world.agent, report("render-01", gpus, at, driver=driver)


def _store(item, at: float) -> list[str]:
    """Store one (agent, report); return the SQL of the statements that touched the health tables."""
    with CaptureQueriesContext(connection) as queries:
        stats = store_reports([item], received_at=at)
    assert stats.errors == {}
    return [q["sql"] for q in queries.captured_queries if any(t in q["sql"] for t in HEALTH_TABLES)]


def _writes(sqls: list[str]) -> list[str]:
    return [sql for sql in sqls if not sql.lstrip().upper().startswith("SELECT")]


def test_health_is_stored_with_every_field(world):
    at = T0 + 0.6
    item = _report(world, at, health=_health(xid_events=[XidEvent(code=79, at=T0 - 2.75)]))

    store_reports([item], received_at=at)

    state = GpuHealthState.objects.get(gpu=world.gpu)
    assert (state.ecc_mode, state.ecc_corrected_volatile, state.ecc_uncorrected_volatile,
            state.ecc_corrected_aggregate, state.ecc_uncorrected_aggregate) == ("enabled", 3, 0, 12, 0)
    assert (state.retired_pages_sbe, state.retired_pages_dbe, state.retired_pages_pending) == (None, None, None)
    assert (state.remapped_rows_correctable, state.remapped_rows_uncorrectable, state.remapped_rows_pending,
            state.remapped_rows_failure) == (1, 0, False, False)
    assert (state.throttle_reasons, state.pcie_replay_counter, state.fan_speed_pct) == (["sw_power_cap"], 7, None)
    assert (state.temp_slowdown_c, state.temp_shutdown_c, state.power_limit_w, state.performance_state) == (
        87.0, 92.0, 350.0, "P0")
    assert state.unsupported == ["retired_pages_sbe", "retired_pages_dbe", "retired_pages_pending", "fan_speed_pct"]
    assert state.changed_at == datetime.fromtimestamp(at, tz=UTC)
    assert GpuHealthState.objects.count() == 2

    assert GpuSample.objects.get(gpu=world.gpu).clocks_event_reasons == 4

    (xid,) = XidError.objects.all()
    assert (xid.gpu, xid.code) == (world.gpu, 79)
    assert xid.at == sample_time(T0 - 2.75) == datetime.fromtimestamp(T0 - 3, tz=UTC)  # the agent's clock

    vgpu = VgpuHealthState.objects.get()
    assert (vgpu.vm, vgpu.gpu, vgpu.vgpu, vgpu.type_name) == (world.lighting, world.gpu, world.vgpu,
                                                              "NVIDIA L40S-12Q")
    assert (vgpu.license_state, vgpu.license_expiry) == ("licensed", datetime.fromtimestamp(T0 + 86400 * 30, tz=UTC))
    assert (vgpu.guest_driver_version, vgpu.frame_rate_limit, vgpu.encoder_sessions, vgpu.guest_info_state) == (
        "580.95", 60, 1, "initialized")

    driver = HostDriverState.objects.get()
    assert (driver.host, driver.driver_version, driver.vgpu_manager_version, driver.nvml_version,
            driver.cuda_driver_version, driver.unsupported) == (
        world.host, "580.159.04", "19.2", "12.580.159.04", 13000, [])


def test_unchanged_health_is_read_once_and_never_written(world):
    first = _store(_report(world, T0), T0)
    assert len(_writes(first)) == 3  # one upsert per state table

    again = _store(_report(world, T0 + 10), T0 + 10)

    assert _writes(again) == []
    # GPU, vGPU and driver state: one read each, or on PostgreSQL one statement that compares them all.
    assert len(again) == (1 if connection.vendor == "postgresql" else 3)
    assert {s.changed_at for s in GpuHealthState.objects.all()} == {datetime.fromtimestamp(T0, tz=UTC)}
    assert VgpuHealthState.objects.get().changed_at == datetime.fromtimestamp(T0, tz=UTC)
    assert HostDriverState.objects.get().changed_at == datetime.fromtimestamp(T0, tz=UTC)


def test_a_change_rewrites_only_the_rows_that_changed(world):
    _store(_report(world, T0), T0)

    agent, changed = _report(world, T0 + 10, health=_health(ecc_uncorrected_volatile=1, throttle_reasons=[]),
                             vgpu_health=_vgpu_health(license_state="unlicensed", license_expiry=None))
    changed.gpus[1].health = _health()  # the second GPU as before
    writes = _writes(_store((agent, changed), T0 + 10))

    assert len(writes) == 2  # the first GPU's row and the vGPU's: the driver is unchanged
    before, later = datetime.fromtimestamp(T0, tz=UTC), datetime.fromtimestamp(T0 + 10, tz=UTC)
    states = {s.gpu_id: s for s in GpuHealthState.objects.all()}
    assert (states[world.gpu.pk].ecc_uncorrected_volatile, states[world.gpu.pk].throttle_reasons) == (1, [])
    assert (states[world.gpu.pk].changed_at, states[world.gpu_2.pk].changed_at) == (later, before)
    assert states[world.gpu_2.pk].ecc_uncorrected_volatile == 0
    vgpu = VgpuHealthState.objects.get()
    assert (vgpu.license_state, vgpu.license_expiry, vgpu.changed_at) == ("unlicensed", None, later)
    assert HostDriverState.objects.get().changed_at == before

    store_reports([_report(world, T0 + 20, driver=dataclasses.replace(DRIVER, driver_version="580.160.01"))],
                  received_at=T0 + 20)
    driver = HostDriverState.objects.get()
    assert (driver.driver_version, driver.changed_at) == ("580.160.01", datetime.fromtimestamp(T0 + 20, tz=UTC))


def test_repeated_readings_of_every_kind_of_value_are_not_changes(world):
    """Nulls, empty lists, fractions, large counters and text with quotes compare equal to what
    was stored from them, so `changed_at` keeps saying when the health last changed."""
    sparse = _health(ecc_mode=None, ecc_corrected_volatile=2**62, throttle_reasons=None, fan_speed_pct=33.3,
                     temp_slowdown_c=86.75, power_limit_w=None, performance_state=None, remapped_rows_pending=None,
                     unsupported=[])
    vgpu = _vgpu_health(license_expiry=T0 + 0.123456, guest_driver_version='580.95 "beta"', frame_rate_limit=None,
                        unsupported=["frame_rate_limit"])
    driver = DriverInfo(driver_version="580.159.04", vgpu_manager_version=None, nvml_version=None,
                        cuda_driver_version=None, unsupported=["vgpu_manager_version"])
    first = _store(_report(world, T0, health=sparse, vgpu_health=vgpu, driver=driver), T0)
    assert len(_writes(first)) == 3

    again = _store(_report(world, T0 + 10, health=sparse, vgpu_health=vgpu, driver=driver), T0 + 10)

    assert _writes(again) == []
    state = GpuHealthState.objects.get(gpu=world.gpu)
    assert (state.throttle_reasons, state.ecc_corrected_volatile, state.fan_speed_pct) == (None, 2**62, 33.3)
    assert VgpuHealthState.objects.get().guest_driver_version == '580.95 "beta"'

    # From nothing to something (and back) is a change.
    later = _store(_report(world, T0 + 20, health=dataclasses.replace(sparse, throttle_reasons=[]),
                           vgpu_health=dataclasses.replace(vgpu, license_expiry=None), driver=driver), T0 + 20)
    assert len(_writes(later)) == 2
    assert GpuHealthState.objects.get(gpu=world.gpu).throttle_reasons == []
    assert VgpuHealthState.objects.get().license_expiry is None


def test_xid_events_are_stored_once_each(world):
    events = [XidEvent(code=79, at=T0 - 1.5), XidEvent(code=48, at=T0 - 1.5)]
    item = _report(world, T0, health=_health(xid_events=events))

    store_reports([item], received_at=T0)
    store_reports([item], received_at=T0 + 5)  # re-sent: a retried poll
    # The next poll repeats none; a new event of a known code at another time is another error.
    store_reports([_report(world, T0 + 10, health=_health(xid_events=[XidEvent(code=79, at=T0 + 8.2)]))],
                  received_at=T0 + 10)

    assert sorted(XidError.objects.values_list("gpu_id", "code", "at")) == sorted([
        (world.gpu.pk, 79, datetime.fromtimestamp(T0 - 2, tz=UTC)),
        (world.gpu.pk, 48, datetime.fromtimestamp(T0 - 2, tz=UTC)),
        (world.gpu.pk, 79, datetime.fromtimestamp(T0 + 8, tz=UTC)),
    ])
    assert set(XidError.objects.values_list("received_at", flat=True)) == {
        datetime.fromtimestamp(T0, tz=UTC), datetime.fromtimestamp(T0 + 10, tz=UTC)}


def test_a_vgpu_no_longer_reported_loses_its_row(world):
    gaming = VirtualMachineFactory(name="ws-anim-04")
    services.place_vgpu(gaming, world.gpu_2, profile("L40S-4Q"))
    agent, first = _report(world, T0)
    first.gpus[1].vgpus = [vgpu_reading(str(gaming.uuid), "ws-anim-04", type_name="NVIDIA L40S-4Q",
                                        health=_vgpu_health())]
    store_reports([(agent, first)], received_at=T0)
    assert VgpuHealthState.objects.count() == 2

    # ws-lighting-01 stopped; the other GPU still runs ws-anim-04.
    agent, later = _report(world, T0 + 10, lighting=False)
    later.gpus[1].vgpus = first.gpus[1].vgpus
    store_reports([(agent, later)], received_at=T0 + 10)

    assert list(VgpuHealthState.objects.values_list("vm__name", "gpu_id")) == [("ws-anim-04", world.gpu_2.pk)]


def test_an_older_agent_without_health_stores_and_deletes_nothing(world):
    _store(_report(world, T0), T0)

    old = (world.agent, report("render-01", [gpu_reading(world.gpu.uuid), gpu_reading(
        world.gpu_2.uuid, index=1, pci_bus_id=world.gpu_2.pci_bus_id)], T0 + 10))
    touched = _store(old, T0 + 10)

    assert touched == []  # not even a read
    assert (GpuHealthState.objects.count(), VgpuHealthState.objects.count(), HostDriverState.objects.count()) == (
        2, 1, 1)
    assert GpuSample.objects.filter(ts=datetime.fromtimestamp(T0 + 10, tz=UTC)).get(
        gpu=world.gpu).clocks_event_reasons is None


def test_health_outside_the_agents_scope_stores_nothing(world):
    # render-02's agent reports render-01's GPU and VM: none of it is its host's.
    stranger = make_agent("agent-render-02", host=world.other_host)
    _, foreign = _report(world, T0, health=_health(xid_events=[XidEvent(code=79, at=T0)]))
    foreign.hostname = "render-02"
    stats = store_reports([(stranger, foreign)], received_at=T0)

    assert stats.out_of_scope == 3  # two GPUs and a vGPU
    assert not GpuHealthState.objects.exists()
    assert not XidError.objects.exists()
    assert not VgpuHealthState.objects.exists()
    assert list(HostDriverState.objects.values_list("host__name", flat=True)) == ["render-02"]  # its own host's

    # render-02's own GPU, running a vGPU of a VM the inventory places on render-01.
    far = gpu_reading(world.far_gpu.uuid, health=_health(), vgpus=[
        vgpu_reading(str(world.lighting.uuid), "ws-lighting-01", health=_vgpu_health())])
    store_reports([(stranger, report("render-02", [far], T0 + 10))], received_at=T0 + 10)
    assert list(GpuHealthState.objects.values_list("gpu_id", flat=True)) == [world.far_gpu.pk]
    assert not VgpuHealthState.objects.exists()
    assert Drift.objects.filter(kind=DriftKind.OUT_OF_SCOPE, resolved_at__isnull=True).exists()


def test_an_agent_inside_a_vm_writes_no_health(world):
    guest_agent = make_agent("agent-ws-lighting-01", vm=world.lighting, kind=AgentKind.NVIDIA_SMI)
    guest = report("ws-lighting-01", [], T0, driver=DRIVER,
                   guest_vgpus=[vgpu_reading(str(world.lighting.uuid), "ws-lighting-01", health=_vgpu_health())])

    stats = store_reports([(guest_agent, guest)], received_at=T0)

    assert stats.vgpu_samples == 1
    assert not VgpuHealthState.objects.exists()
    assert not HostDriverState.objects.exists()


def test_a_last_xid_gauge_is_one_event_while_it_holds(world):
    def scrape(at: float, code: int):
        reading = gpu_reading(world.gpu.uuid, health=GpuHealth(xid_events=[XidEvent(code=code, at=at,
                                                                                   last_seen=True)]))
        store_reports([(world.agent, report("render-01", [reading], at))], received_at=at)

    scrape(T0, 79)
    scrape(T0 + 10, 79)  # the gauge holds the value: the same XID
    scrape(T0 + 20, 48)  # another one
    scrape(T0 + 30, 48)

    assert list(XidError.objects.order_by("at").values_list("code", "at")) == [
        (79, datetime.fromtimestamp(T0, tz=UTC)), (48, datetime.fromtimestamp(T0 + 20, tz=UTC))]


def test_an_nvidia_smi_capture_of_a_vgpu_host_stores_its_health(world):
    capture = parse_nvidia_smi((OWN_FIXTURES / "nvidia-smi" / "l40s-vgpu-host-v13.xml").read_bytes(), "render-01")

    store_reports([(world.agent, capture)], received_at=capture.collected_at)

    state = GpuHealthState.objects.get(gpu=world.gpu)
    assert (state.ecc_mode, state.remapped_rows_failure, state.throttle_reasons, state.power_limit_w) == (
        "enabled", False, ["gpu_idle"], 700.0)
    assert GpuSample.objects.get().clocks_event_reasons == 1
    # ws-lighting-01 and ws-layout-02 are known VMs; the third vGPU's VM is not (no row).
    rows = {row.vm.name: row for row in VgpuHealthState.objects.select_related("vm")}
    assert sorted(rows) == ["ws-layout-02", "ws-lighting-01"]
    assert (rows["ws-lighting-01"].license_state, rows["ws-lighting-01"].license_expiry) == (
        "licensed", datetime(2026, 12, 1, 9, 15, 2, tzinfo=UTC))
    assert rows["ws-layout-02"].vgpu is None  # runs where the inventory declares none
    assert HostDriverState.objects.get(host=world.host).driver_version == "580.159.04"


def test_a_report_of_guest_vgpus_only_names_no_host_driver(world):
    guest = report("render-01", [], T0, driver=DRIVER,
                   guest_vgpus=[vgpu_reading(None, "ws-lighting-01", health=_vgpu_health())])

    store_reports([(world.agent, guest)], received_at=T0)

    assert not HostDriverState.objects.exists()
    assert not VgpuHealthState.objects.exists()  # licence is stored from the host's view only


def test_a_dcgm_scrape_keeps_the_vgpu_rows_it_cannot_see(world):
    store_reports([_report(world, T0)], received_at=T0)
    dcgm = report("render-01", [gpu_reading(world.gpu.uuid, health=GpuHealth(pcie_replay_counter=0))], T0 + 10,
                  backend="dcgm-exporter")

    store_reports([(world.agent, dcgm)], received_at=T0 + 10)

    assert VgpuHealthState.objects.get().vm == world.lighting  # dcgm-exporter lists no vGPUs: nothing gone
    assert GpuHealthState.objects.get(gpu=world.gpu).pcie_replay_counter == 0
