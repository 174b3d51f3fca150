"""Storing reports: samples once each, discovery, drift upserted and resolved, the clock check,
one transaction and a constant number of queries per batch."""

from __future__ import annotations

from datetime import UTC, datetime

import pytest
from django.db import connection
from django.test.utils import CaptureQueriesContext

import telemetry.ingest as ingest_module
from fleet import services
from fleet.models import Gpu, GpuModel, Host, Vgpu
from fleet.placement import PlacementError
from fleet.tests.factories import GpuFactory, HostFactory, VirtualMachineFactory, profile
from telemetry import inventory_cache
from telemetry.ingest import PLACEHOLDER_CPU_THREADS, PLACEHOLDER_RAM_GIB, sample_time, store_reports
from telemetry.models import Drift, DriftKind, GpuSample, VgpuSample
from telemetry.sources.dcgm import parse_dcgm_metrics
from telemetry.sources.nvidia_smi import parse_nvidia_smi
from telemetry.tests.ingest_world import (
    OWN_FIXTURES,
    SHARED_CAPTURES,
    T0,
    gpu_reading,
    l40s_world,
    make_agent,
    report,
    vgpu_reading,
)

pytestmark = pytest.mark.django_db

STRAY_VM = "7e2f6a9b-3c8d-4d2e-8f40-1b2c3d4e5f60"


@pytest.fixture
def world():
    return l40s_world()


def _open(kind: str) -> list[Drift]:
    return list(Drift.objects.filter(kind=kind, resolved_at__isnull=True))


def _lighting_reading(world, **fields):
    return vgpu_reading(str(world.lighting.uuid), "ws-lighting-01", **fields)


def test_samples_are_stored_with_every_metric_at_the_whole_second(world):
    reading = gpu_reading(world.gpu.uuid, vgpus=[_lighting_reading(world)])

    stats = store_reports([(world.agent, report("render-01", [reading], collected_at=T0 + 0.75))], received_at=T0 + 1)

    assert (stats.gpu_samples, stats.vgpu_samples, stats.drifts, stats.errors) == (1, 1, 0, {})
    sample = GpuSample.objects.get()
    assert sample.gpu == world.gpu
    assert sample.ts == datetime.fromtimestamp(T0, tz=UTC)
    assert (sample.util_gpu, sample.util_mem, sample.fb_used_mib, sample.fb_total_mib) == (38, 21, 14336, 46068)
    assert (sample.enc_util, sample.dec_util, sample.temp_c, sample.power_w, sample.sm_clock_mhz) == (
        4, 0, 52, 161.2, 2490)
    vgpu_sample = VgpuSample.objects.get()
    assert (vgpu_sample.vm, vgpu_sample.gpu, vgpu_sample.vgpu) == (world.lighting, world.gpu, world.vgpu)
    assert (vgpu_sample.fb_used_mib, vgpu_sample.util_gpu, vgpu_sample.util_mem) == (9011, 30, 15)


def test_unsupported_metrics_are_stored_as_null(world):
    reading = gpu_reading(world.gpu.uuid, util_gpu=None, temp_c=None, power_w=None)
    store_reports([(world.agent, report("render-01", [reading]))], received_at=T0)
    sample = GpuSample.objects.get()
    assert (sample.util_gpu, sample.temp_c, sample.power_w) == (None, None, None)


def test_a_repeated_report_stores_nothing_twice(world):
    item = (world.agent, report("render-01", [gpu_reading(world.gpu.uuid, vgpus=[_lighting_reading(world)])]))
    store_reports([item], received_at=T0)

    again = store_reports([item], received_at=T0 + 5)
    # A second poll inside the same second is the same reading.
    same_second = store_reports(
        [(world.agent, report("render-01", [gpu_reading(world.gpu.uuid, util_gpu=99)], collected_at=T0 + 0.9))],
        received_at=T0 + 1)

    assert (again.gpu_samples, again.vgpu_samples, same_second.gpu_samples) == (0, 0, 0)
    assert GpuSample.objects.count() == 1
    assert GpuSample.objects.get().util_gpu == 38
    assert VgpuSample.objects.count() == 1
    next_poll = store_reports([(world.agent, report("render-01", [gpu_reading(world.gpu.uuid)], T0 + 10))],
                              received_at=T0 + 10)
    assert next_poll.gpu_samples == 1
    assert list(GpuSample.objects.values_list("ts", flat=True)) == [sample_time(T0), sample_time(T0 + 10)]


def test_a_report_stamped_too_far_off_is_refused_and_the_others_are_stored(world, settings):
    settings.TELEMETRY_MAX_CLOCK_SKEW_S = 300
    far = make_agent("agent-render-02", host=world.other_host)
    behind = make_agent("agent-behind", host=world.other_host)

    stats = store_reports([
        (world.agent, report("render-01", [gpu_reading(world.gpu.uuid)], collected_at=T0 + 290)),
        (far, report("render-02", [gpu_reading(world.far_gpu.uuid)], collected_at=T0 + 3600)),
        (behind, report("render-02", [gpu_reading(world.far_gpu.uuid)], collected_at=T0 - 301)),
    ], received_at=datetime.fromtimestamp(T0, tz=UTC))

    assert stats.gpu_samples == 1
    assert list(GpuSample.objects.values_list("gpu", flat=True)) == [world.gpu.pk]
    assert stats.errors[far.pk].startswith(
        "report refused: stamped 2026-05-28T21:26:40+00:00, 3600 s ahead of the server's clock (at most 300 s "
        "allowed); check the clock of render-02 (NTP).")
    assert "301 s behind the server's clock" in stats.errors[behind.pk]
    assert world.agent.pk not in stats.errors


def test_unknown_gpu_is_discovered_on_the_agents_host_with_its_model_found_by_name(world):
    uuid = "GPU-3f7c6d85-bc41-4a9e-8d3a-8e5a4b6f7c93"
    # Drivers spell one board several ways: "L40S" is the catalog's "NVIDIA L40S".
    reading = gpu_reading(uuid, name="L40S", pci_bus_id="00000000:81:00.0")

    stats = store_reports([(world.agent, report("render-01", [reading]))], received_at=T0)

    gpu = Gpu.objects.get(uuid=uuid)
    assert (gpu.host, gpu.gpu_model, gpu.pci_bus_id, gpu.mode) == (world.host, world.model, "00000000:81:00.0", "vgpu")
    assert stats.discovered_gpus == 1
    assert GpuSample.objects.get().gpu == gpu
    (drift,) = _open(DriftKind.UNKNOWN_GPU)
    assert (drift.subject, drift.agent) == (uuid, world.agent)
    assert drift.detail.startswith(f"GPU {uuid} (NVIDIA L40S, PCI bus id 00000000:81:00.0) reported by render-01 "
                                   f"was not in the inventory: added to host render-01 in vGPU (shared) mode.")
    assert drift.reported["name"] == "L40S"

    # Known from now on: no second GPU, and the notice stays open until an admin resolves it.
    later = store_reports([(world.agent, report("render-01", [reading], T0 + 10))], received_at=T0 + 10)
    assert later.discovered_gpus == 0
    assert Gpu.objects.filter(uuid=uuid).count() == 1
    assert _open(DriftKind.UNKNOWN_GPU) == [drift]


def test_discovery_creates_an_unknown_model_from_the_report(world):
    h200 = parse_nvidia_smi((SHARED_CAPTURES / "h200-v13.xml").read_bytes(), "render-01")

    stats = store_reports([(world.agent, h200)], received_at=h200.collected_at)

    gpu = Gpu.objects.select_related("gpu_model").get(uuid="GPU-8f9caa6d-a69d-7318-7329-fa0dcff3636d")
    assert (gpu.gpu_model.name, gpu.gpu_model.code, gpu.gpu_model.fb_mib) == ("NVIDIA H200", "H200", 143771)
    assert not gpu.gpu_model.profiles.exists()
    assert gpu.mode == "passthrough"  # the capture says Pass-Through: no vGPU goes there
    assert stats.discovered_gpus == 1
    assert "GPU model NVIDIA H200 (code H200, 143771 MiB) was created without vGPU profiles" in \
        _open(DriftKind.UNKNOWN_GPU)[0].detail
    sample = GpuSample.objects.get()
    assert (sample.fb_total_mib, sample.temp_c, sample.power_w) == (143771, 44, 84.58)


def test_two_new_gpus_of_one_new_model_share_it_and_codes_stay_unique(world):
    GpuModel.objects.create(name="Some H200 board", code="H200", fb_mib=1024)
    gpus = [gpu_reading(f"GPU-new-{i}", index=i, name="NVIDIA H200", pci_bus_id=f"00000000:0{i}:00.0",
                        fb_total_mib=143771, fb_used_mib=0) for i in range(2)]

    store_reports([(world.agent, report("render-01", gpus))], received_at=T0)

    model = GpuModel.objects.get(name="NVIDIA H200")
    assert model.code == "H200-2"
    assert set(Gpu.objects.filter(uuid__startswith="GPU-new-").values_list("gpu_model", flat=True)) == {model.pk}


def test_an_unbound_agent_naming_a_known_host_is_refused_until_an_admin_binds_it(world):
    # A token issued without a host must not pick an existing host by the name it reports
    # (here by FQDN, in another case): binding to a known host is the admin's decision.
    agent = make_agent("dcgm-render-01", kind="dcgm-exporter")
    readings = [gpu_reading(world.gpu.uuid), gpu_reading("GPU-fqdn", index=1, pci_bus_id="00000000:C1:00.0")]

    stats = store_reports([(agent, report("Render-01.studio.lan", readings))], received_at=T0)

    assert stats.errors[agent.pk] == (
        "report refused: agent dcgm-render-01 is bound to no host, and its report is from host render-01, which is "
        "in the inventory; an admin binds agent dcgm-render-01 to its host (or, for pushes from inside a VM, to its "
        "VM) before its reports are stored (host: render-01). Nothing of it was stored.")
    assert agent.pk in stats.forbidden
    assert not GpuSample.objects.exists()
    assert not Gpu.objects.filter(uuid="GPU-fqdn").exists()
    assert (Host.objects.count(), Drift.objects.count()) == (2, 0)

    agent.host = world.host
    agent.save()
    bound = store_reports([(agent, report("Render-01.studio.lan", readings, T0 + 10))], received_at=T0 + 10)

    assert (bound.errors, bound.gpu_samples, bound.discovered_gpus) == ({}, 2, 1)
    assert Gpu.objects.get(uuid="GPU-fqdn").host == world.host


def test_an_unbound_agents_first_report_binds_it_to_the_new_host_it_introduces(world):
    agent = make_agent("dcgm-render-09", kind="dcgm-exporter")
    first = store_reports([(agent, report("render-09", [gpu_reading("GPU-first", pci_bus_id="00000000:C1:00.0")]))],
                          received_at=T0)
    host = Host.objects.get(name="render-09")
    agent.refresh_from_db()
    assert (first.discovered_gpus, agent.host) == (1, host)

    # Bound now: the token writes render-09 only, whatever name the next report gives.
    later = store_reports([(agent, report("render-01", [gpu_reading(world.gpu.uuid)], T0 + 10))],
                          received_at=T0 + 10)
    assert (later.gpu_samples, later.out_of_scope) == (0, 1)
    assert not GpuSample.objects.filter(gpu=world.gpu).exists()


def test_an_unbound_agent_seen_before_or_with_nothing_to_discover_is_refused(world):
    seen = make_agent("dcgm-old", kind="dcgm-exporter", last_seen=datetime.fromtimestamp(T0 - 60, tz=UTC))
    empty = make_agent("dcgm-empty", kind="dcgm-exporter")

    stats = store_reports([
        (seen, report("render-42", [gpu_reading("GPU-late", pci_bus_id="00000000:C1:00.0")])),
        (empty, report("render-43", [gpu_reading(world.far_gpu.uuid)])),
    ], received_at=T0)

    assert "agent dcgm-old is bound to no host or VM, and only its first report may introduce a new host" in \
        stats.errors[seen.pk]
    assert "its report has no new GPU to introduce host render-43 by" in stats.errors[empty.pk]
    assert stats.forbidden == {seen.pk, empty.pk}
    assert not Host.objects.filter(name__in=["render-42", "render-43"]).exists()
    assert not GpuSample.objects.exists()


def test_an_unknown_host_is_created_with_a_capacity_no_vm_fits_in(world):
    agent = make_agent("dcgm-render-09", kind="dcgm-exporter")
    scrape = parse_dcgm_metrics((OWN_FIXTURES / "dcgm-exporter" / "render-07-l40s.prom").read_bytes(),
                                collected_at=T0)

    stats = store_reports([(agent, scrape)], received_at=T0)

    host = Host.objects.get(name="render-07")
    assert (host.cpu_threads, host.ram_gib) == (PLACEHOLDER_CPU_THREADS, PLACEHOLDER_RAM_GIB)
    assert stats.discovered_gpus == 3
    assert set(host.gpus.values_list("pci_bus_id", flat=True)) == {"00000000:3B:00.0", "00000000:5E:00.0",
                                                                   "00000000:86:00.0"}
    assert GpuSample.objects.filter(gpu__host=host).count() == 3
    drift = _open(DriftKind.UNKNOWN_GPU)[0]
    assert "host render-07 was created for it with placeholder capacity (1 CPU thread, 1 GiB RAM, so no VM " \
           "fits): enter its real CPU threads and RAM" in drift.detail
    # The guess never over-commits a real server: placement refuses until an admin enters the figures.
    with pytest.raises(PlacementError):
        services.place_vgpu(VirtualMachineFactory(name="ws-new"), host.gpus.first(), profile("L40S-4Q"))


def test_a_declared_gpu_without_uuid_at_the_same_slot_gets_the_uuid(world):
    declared = GpuFactory(host=world.host, gpu_model=world.model, pci_bus_id="00000000:A1:00.0", uuid="")

    stats = store_reports([(world.agent, report("render-01", [
        gpu_reading("GPU-from-nvml", pci_bus_id="00000000:A1:00.0")]))], received_at=T0)

    declared.refresh_from_db()
    assert declared.uuid == "GPU-from-nvml"
    assert stats.discovered_gpus == 0
    assert GpuSample.objects.get().gpu == declared


def test_a_gpu_typed_in_lspci_form_is_the_one_nvml_reports(world):
    """An admin typed 0000:a1:00.0 (stored as 00000000:A1:00.0); the agent's NVML form finds it."""
    declared = GpuFactory(host=world.host, gpu_model=world.model, pci_bus_id="0000:a1:00.0", uuid="")

    stats = store_reports([(world.agent, report("render-01", [
        gpu_reading("GPU-from-nvml", pci_bus_id="00000000:A1:00.0")]))], received_at=T0)

    declared.refresh_from_db()
    assert (declared.pci_bus_id, declared.uuid) == ("00000000:A1:00.0", "GPU-from-nvml")
    assert stats.discovered_gpus == 0


def test_a_gpu_discovered_in_lspci_form_is_stored_in_nvml_form(world):
    store_reports([(world.agent, report("render-01", [
        gpu_reading("GPU-lspci-form", pci_bus_id="0000:c1:00.0")]))], received_at=T0)

    assert Gpu.objects.get(uuid="GPU-lspci-form").pci_bus_id == "00000000:C1:00.0"


def test_a_gpu_in_a_slot_the_inventory_gives_another_gpu_is_not_added(world):
    stats = store_reports([(world.agent, report("render-01", [
        gpu_reading("GPU-swapped-board", pci_bus_id=world.gpu.pci_bus_id)]))], received_at=T0)

    assert not Gpu.objects.filter(uuid="GPU-swapped-board").exists()
    assert stats.gpu_samples == 0
    (drift,) = _open(DriftKind.UNKNOWN_GPU)
    assert drift.detail.startswith(f"GPU GPU-swapped-board (NVIDIA L40S) is reported at PCI bus id "
                                   f"00000000:41:00.0 of host render-01, where the inventory has GPU {world.gpu.uuid}")


def test_a_gpu_reported_without_identity_cannot_be_discovered(world):
    stats = store_reports([(world.agent, report("render-01", [
        gpu_reading("GPU-nameless", name=None, fb_total_mib=None)]))], received_at=T0)

    assert stats.gpu_samples == 0
    assert "cannot be added: its product name and frame buffer size was not reported" in \
        _open(DriftKind.UNKNOWN_GPU)[0].detail


def test_gpu_reported_by_another_host_keeps_inventory_stores_nothing_and_resolves_later(world):
    item = (world.agent, report("render-01", [gpu_reading(world.far_gpu.uuid, pci_bus_id="00000000:42:00.0")]))

    first = store_reports([item], received_at=T0)

    world.far_gpu.refresh_from_db()
    assert world.far_gpu.host == world.other_host  # the inventory is the admin's word
    assert (first.gpu_samples, first.out_of_scope) == (0, 1)
    assert not GpuSample.objects.exists()  # render-02's series is not render-01's agent's to write
    (drift,) = _open(DriftKind.GPU_ELSEWHERE)
    assert (drift.subject, drift.agent) == (world.far_gpu.uuid, world.agent)
    assert drift.detail == (f"GPU {world.far_gpu.uuid} (NVIDIA L40S) is on host render-02 in the inventory but is "
                            f"reported by agent agent-render-01 of host render-01. Nothing of it is stored (an agent "
                            f"writes only its own host's series); the inventory is unchanged. If the board moved, "
                            f"change its host.")

    # The admin moves it; the agent's next report no longer differs: resolved, and stored.
    services.update_gpu(world.far_gpu, host=world.host, pci_bus_id="00000000:42:00.0")
    stats = store_reports([(world.agent, report("render-01", [item[1].gpus[0]], T0 + 10))], received_at=T0 + 10)

    assert (stats.resolved_drifts, stats.gpu_samples) == (1, 1)
    drift.refresh_from_db()
    assert drift.resolved_at == datetime.fromtimestamp(T0 + 10, tz=UTC)


def test_drift_is_one_open_row_bumped_while_the_difference_lasts(world):
    item = lambda t: (world.agent, report("render-01", [gpu_reading(world.far_gpu.uuid)], t))  # noqa: E731

    store_reports([item(T0)], received_at=T0)
    store_reports([item(T0 + 10)], received_at=T0 + 10)
    stats = store_reports([item(T0 + 20)], received_at=T0 + 20)

    (drift,) = Drift.objects.all()
    assert drift.resolved_at is None
    assert drift.first_seen == datetime.fromtimestamp(T0, tz=UTC)
    assert drift.last_seen == datetime.fromtimestamp(T0 + 20, tz=UTC)
    assert (stats.drifts, stats.resolved_drifts) == (1, 0)

    # Gone from the agent's report: resolved; it comes back: a new open row, the old one stays history.
    store_reports([(world.agent, report("render-01", [], T0 + 30))], received_at=T0 + 30)
    store_reports([item(T0 + 40)], received_at=T0 + 40)
    assert Drift.objects.filter(resolved_at__isnull=False).count() == 1
    assert len(_open(DriftKind.GPU_ELSEWHERE)) == 1


def test_another_agents_report_does_not_resolve_a_drift_it_cannot_see(world):
    store_reports([(world.agent, report("render-01", [gpu_reading(world.far_gpu.uuid)]))], received_at=T0)
    other = make_agent("agent-render-02", host=world.other_host)

    store_reports([(other, report("render-02", [], T0 + 10))], received_at=T0 + 10)

    assert len(_open(DriftKind.GPU_ELSEWHERE)) == 1


def test_gpu_reporting_another_model_than_the_inventory(world):
    store_reports([(world.agent, report("render-01", [gpu_reading(world.gpu.uuid, name="NVIDIA L40")]))],
                  received_at=T0)

    (drift,) = _open(DriftKind.GPU_MODEL)
    assert drift.detail == f"GPU {world.gpu.uuid} on render-01 reports itself as NVIDIA L40; the inventory says " \
                           f"NVIDIA L40S."
    assert GpuSample.objects.count() == 1


def test_vgpu_of_an_unknown_vm_is_a_drift_and_no_sample(world):
    stray = vgpu_reading(STRAY_VM, "ws-stray-99", type_name="NVIDIA L40S-2Q")

    stats = store_reports([(world.agent, report("render-01", [gpu_reading(world.gpu.uuid, vgpus=[stray])]))],
                          received_at=T0)

    assert stats.vgpu_samples == 0
    assert not VgpuSample.objects.exists()
    (drift,) = _open(DriftKind.UNKNOWN_VM)
    assert drift.subject == STRAY_VM
    assert drift.detail == (f"A NVIDIA L40S-2Q on GPU {world.gpu.uuid} (render-01) runs for VM ws-stray-99, which "
                            f"the inventory does not know; no samples are stored for it.")
    assert drift.reported["vm_uuid"] == STRAY_VM

    store_reports([(world.agent, report("render-01", [gpu_reading(world.gpu.uuid)], T0 + 10))], received_at=T0 + 10)
    assert _open(DriftKind.UNKNOWN_VM) == []


def test_vm_found_by_name_where_the_hypervisor_gives_no_uuid(world):
    # ESXi and Xen report a domain id: the VM is matched by name.
    reading = vgpu_reading(None, "ws-layout-02", type_name="NVIDIA L40S-4Q", fb_used_mib=2100)

    store_reports([(world.agent, report("render-01", [gpu_reading(world.gpu_2.uuid, vgpus=[reading])]))],
                  received_at=T0)

    sample = VgpuSample.objects.get()
    assert (sample.vm, sample.gpu, sample.vgpu, sample.fb_used_mib) == (world.layout, world.gpu_2,
                                                                         world.layout_vgpu, 2100)
    assert not Drift.objects.exists()


def test_a_vm_uuid_the_inventory_does_not_know_is_not_mapped_by_its_name(world):
    # A clone or a rebuilt VM under the name of an inventory VM: its usage must not feed that VM's series.
    clone = vgpu_reading(STRAY_VM, "ws-lighting-01", fb_used_mib=512)

    stats = store_reports([(world.agent, report("render-01", [gpu_reading(world.gpu.uuid, vgpus=[clone])]))],
                          received_at=T0)

    assert (stats.gpu_samples, stats.vgpu_samples, stats.drifts) == (1, 0, 1)
    assert not VgpuSample.objects.exists()
    assert _open(DriftKind.UNKNOWN_VM) == []
    (drift,) = _open(DriftKind.VM_UUID_MISMATCH)
    assert drift.subject == STRAY_VM
    assert drift.agent == world.agent
    assert drift.detail.startswith(
        f"A NVIDIA L40S-12Q on GPU {world.gpu.uuid} (render-01) runs for VM UUID {STRAY_VM} named ws-lighting-01; "
        f"the inventory's VM ws-lighting-01 has UUID {world.lighting.uuid}. Not stored")
    assert drift.reported["vm_uuid"] == STRAY_VM

    # The VM's own reading maps, and the difference, no longer reported, is over.
    store_reports([(world.agent, report("render-01", [gpu_reading(world.gpu.uuid, vgpus=[_lighting_reading(world)])],
                                        T0 + 10))], received_at=T0 + 10)
    assert VgpuSample.objects.get().vm == world.lighting
    assert _open(DriftKind.VM_UUID_MISMATCH) == []


def test_a_mismatched_reading_costs_only_itself(world):
    clone = vgpu_reading(STRAY_VM, "ws-lighting-01")
    layout = vgpu_reading(str(world.layout.uuid), "ws-layout-02", type_name="NVIDIA L40S-4Q")
    gpus = [gpu_reading(world.gpu.uuid, vgpus=[clone]), gpu_reading(world.gpu_2.uuid, vgpus=[layout])]

    stats = store_reports([(world.agent, report("render-01", gpus))], received_at=T0)

    assert (stats.gpu_samples, stats.vgpu_samples) == (2, 1)
    assert VgpuSample.objects.get().vm == world.layout


def test_vgpu_the_inventory_does_not_declare_is_stored_without_a_vgpu(world):
    # ws-layout-02 is placed on render-01's second GPU: running on the first, it is still this host's VM.
    running = vgpu_reading(str(world.layout.uuid), "ws-layout-02", type_name="GRID L40S-4Q")

    store_reports([(world.agent, report("render-01", [gpu_reading(world.gpu.uuid, vgpus=[running])]))],
                  received_at=T0)

    sample = VgpuSample.objects.get()
    assert (sample.vm, sample.gpu, sample.vgpu) == (world.layout, world.gpu, None)
    (drift,) = _open(DriftKind.VGPU_MISSING)
    assert drift.subject == f"ws-layout-02 on {world.gpu.uuid}"
    assert drift.detail == (f"VM ws-layout-02 runs a GRID L40S-4Q on GPU {world.gpu.uuid} (render-01) that the "
                            f"inventory does not declare; its samples are stored without a vGPU.")


def test_vgpu_of_a_vm_placed_nowhere_is_a_drift_and_no_sample(world):
    running = vgpu_reading(str(world.idle.uuid), "ws-idle-03", type_name="GRID L40S-4Q")

    stats = store_reports([(world.agent, report("render-01", [gpu_reading(world.gpu.uuid, vgpus=[running])]))],
                          received_at=T0)

    assert (stats.gpu_samples, stats.vgpu_samples, stats.out_of_scope) == (1, 0, 1)
    assert not VgpuSample.objects.exists()
    (drift,) = _open(DriftKind.VGPU_MISSING)
    assert drift.subject == f"ws-idle-03 on {world.gpu.uuid}"
    assert drift.detail.startswith(f"VM ws-idle-03 runs a GRID L40S-4Q on GPU {world.gpu.uuid} (render-01) that the "
                                   f"inventory does not declare, and the inventory places the VM on no GPU: its "
                                   f"samples are not stored until an admin places it")


def test_vgpu_of_another_type_than_declared_is_a_profile_drift_resolved_when_it_matches(world):
    wrong = _lighting_reading(world, type_name="NVIDIA L40S-24Q")

    store_reports([(world.agent, report("render-01", [gpu_reading(world.gpu.uuid, vgpus=[wrong])]))],
                  received_at=T0)

    assert VgpuSample.objects.get().vgpu == world.vgpu
    (drift,) = _open(DriftKind.PROFILE)
    assert drift.subject == f"ws-lighting-01 on {world.gpu.uuid}"
    assert drift.detail == (f"VM ws-lighting-01 runs a NVIDIA L40S-24Q on GPU {world.gpu.uuid}, but the inventory "
                            f"declares L40S-12Q.")

    # "GRID " prefix or not, the declared profile now matches.
    right = _lighting_reading(world, type_name="GRID L40S-12Q")
    stats = store_reports([(world.agent, report("render-01", [gpu_reading(world.gpu.uuid, vgpus=[right])], T0 + 10))],
                          received_at=T0 + 10)
    assert stats.resolved_drifts == 1
    assert _open(DriftKind.PROFILE) == []


MDEV = "5c3b2a19-8f7e-4d6c-b5a4-93827160f5e4"
MDEV_NEW = "0a1b2c3d-4e5f-4a6b-8c7d-9e0f1a2b3c4d"


def _queries_of(report_, at: float) -> int:
    """The queries of storing `report_` as a worker that kept no copy of the inventory would make."""
    inventory_cache.CACHE.clear()
    with CaptureQueriesContext(connection) as queries:
        store_reports([report_], received_at=at)
    return len(queries)


def test_the_device_an_agent_reports_is_written_once_and_not_while_unchanged(world):
    def lighting(collected_at: float, mdev_uuid: str | None):
        reading = _lighting_reading(world, type_name="GRID L40S-12Q", mdev_uuid=mdev_uuid)
        return world.agent, report("render-01", [gpu_reading(world.gpu.uuid, vgpus=[reading])], collected_at)

    # An agent from before mdev_uuid: stored as ever, nothing of a device written.
    old_agent = _queries_of(lighting(T0, None), T0)
    world.vgpu.refresh_from_db()
    assert (world.vgpu.reported_device_id, world.vgpu.reported_device_at) == ("", None)

    first = _queries_of(lighting(T0 + 10, MDEV.upper()), T0 + 10)
    world.vgpu.refresh_from_db()
    assert world.vgpu.reported_device_id == MDEV  # in the hypervisor backends' spelling
    assert world.vgpu.reported_device_at == datetime.fromtimestamp(T0 + 10, tz=UTC)
    assert first == old_agent + 2  # lock and write the changed row

    unchanged = _queries_of(lighting(T0 + 20, MDEV), T0 + 20)
    missing = _queries_of(lighting(T0 + 30, None), T0 + 30)  # a failed read, or an older agent again
    assert unchanged == missing == old_agent
    world.vgpu.refresh_from_db()
    assert (world.vgpu.reported_device_id, world.vgpu.reported_device_at) == (
        MDEV, datetime.fromtimestamp(T0 + 10, tz=UTC)), "not written again while unchanged"
    assert VgpuSample.objects.filter(vgpu=world.vgpu).count() == 4

    _queries_of(lighting(T0 + 40, MDEV_NEW), T0 + 40)  # the device was recreated
    world.vgpu.refresh_from_db()
    assert (world.vgpu.reported_device_id, world.vgpu.reported_device_at) == (
        MDEV_NEW, datetime.fromtimestamp(T0 + 40, tz=UTC))


def test_the_reported_device_picks_the_vgpu_among_several_of_one_profile_on_a_gpu(world):
    world.vgpu.device_id = MDEV
    world.vgpu.save(update_fields=["device_id"])
    second = Vgpu.objects.create(vm=world.lighting, gpu=world.gpu, profile=world.vgpu.profile, placement_id=2,
                                 device_id=MDEV_NEW)
    readings = [_lighting_reading(world, mdev_uuid=MDEV_NEW), _lighting_reading(world, mdev_uuid=MDEV)]

    store_reports([(world.agent, report("render-01", [gpu_reading(world.gpu.uuid, vgpus=readings)]))],
                  received_at=T0)

    assert Vgpu.objects.get(pk=world.vgpu.pk).reported_device_id == MDEV
    assert Vgpu.objects.get(pk=second.pk).reported_device_id == MDEV_NEW
    assert not Drift.objects.exists()


def test_guest_reading_is_stored_on_the_gpu_of_the_vms_declared_vgpu(world):
    guest = parse_nvidia_smi((OWN_FIXTURES / "nvidia-smi" / "l40s-2q-guest-v13.xml").read_bytes(), "ws-lighting-01")

    stats = store_reports([(world.agent, guest)], received_at=guest.collected_at)

    sample = VgpuSample.objects.get()
    assert (sample.vm, sample.gpu, sample.vgpu) == (world.lighting, world.gpu, world.vgpu)
    assert (sample.fb_used_mib, sample.util_gpu, sample.util_mem) == (612, 23, 11)
    assert stats.gpu_samples == 0
    assert not Gpu.objects.filter(uuid="GPU-5d8e2b1c-9a4f-11f0-8de9-0242ac120002").exists()  # a vGPU is no GPU
    (drift,) = _open(DriftKind.PROFILE)  # the guest runs an L40S-2Q, the inventory says L40S-12Q
    assert drift.subject == f"ws-lighting-01 on {world.gpu.uuid}"


def test_guest_reading_of_a_vm_without_declared_vgpu_stores_nothing(world):
    guest = parse_nvidia_smi((OWN_FIXTURES / "nvidia-smi" / "l40s-2q-guest-v13.xml").read_bytes(), "ws-idle-03")

    stats = store_reports([(world.agent, guest)], received_at=guest.collected_at)

    assert stats.vgpu_samples == 0
    assert _open(DriftKind.VGPU_MISSING)[0].subject == "ws-idle-03 (guest)"


def test_vgpu_host_capture_maps_each_instance(world):
    capture = parse_nvidia_smi((OWN_FIXTURES / "nvidia-smi" / "l40s-vgpu-host-v13.xml").read_bytes(), "render-01")

    stats = store_reports([(world.agent, capture)], received_at=capture.collected_at)

    assert (stats.gpu_samples, stats.vgpu_samples) == (1, 2)
    by_vm = {s.vm.name: s for s in VgpuSample.objects.select_related("vm")}
    assert by_vm["ws-lighting-01"].vgpu == world.vgpu
    assert by_vm["ws-layout-02"].vgpu is None  # running on the first L40S; declared on the second
    assert {(d.kind, d.subject) for d in Drift.objects.all()} == {
        (DriftKind.VGPU_MISSING, f"ws-layout-02 on {world.gpu.uuid}"),
        (DriftKind.UNKNOWN_VM, STRAY_VM),
    }


def test_nothing_is_half_stored_when_a_write_fails(world, monkeypatch):
    def broken(*args, **kwargs):
        raise RuntimeError("disk full")

    monkeypatch.setattr(VgpuSample.objects, "bulk_create", broken)
    monkeypatch.setattr(ingest_module, "_copy_or_insert", broken)  # the PostgreSQL writer
    items = [(world.agent, report("render-01", [
        gpu_reading(world.gpu.uuid, vgpus=[_lighting_reading(world)]),
        gpu_reading("GPU-would-be-discovered", index=1, pci_bus_id="00000000:E1:00.0")]))]

    with pytest.raises(RuntimeError):
        store_reports(items, received_at=T0)

    assert not GpuSample.objects.exists()
    assert not Gpu.objects.filter(uuid="GPU-would-be-discovered").exists()
    assert not Drift.objects.exists()


def _fleet_of_agents(count: int):
    """`count` hosts, each with an agent, two declared GPUs (one VM on each) and an undeclared GPU,
    reporting a known VM, an unknown VM and a vGPU the inventory does not declare."""
    items = []
    model = profile("L40S-12Q").gpu_model
    for n in range(count):
        host = HostFactory(name=f"farm-{n:02d}")
        agent = make_agent(f"agent-farm-{n:02d}", host=host)
        gpus = []
        for slot in range(2):
            gpu = GpuFactory(host=host, gpu_model=model, pci_bus_id=f"00000000:{slot + 1:02X}:00.0",
                             uuid=f"GPU-farm-{n:02d}-{slot}")
            vm = VirtualMachineFactory(name=f"ws-farm-{n:02d}-{slot}")
            services.place_vgpu(vm, gpu, profile("L40S-12Q"))
            gpus.append(gpu_reading(gpu.uuid, index=slot, pci_bus_id=gpu.pci_bus_id, vgpus=[
                vgpu_reading(str(vm.uuid), vm.name, type_name="NVIDIA L40S-24Q"),
                vgpu_reading(None, f"ws-farm-{n:02d}-{1 - slot}"),
                vgpu_reading(f"00000000-0000-4000-8000-{n:06d}{slot:06d}", f"ghost-{n}-{slot}"),
            ]))
        gpus.append(gpu_reading(f"GPU-farm-{n:02d}-new", index=2, pci_bus_id="00000000:03:00.0"))
        items.append((agent, report(f"farm-{n:02d}", gpus)))
    return items


@pytest.mark.parametrize("agents", [1, 20])
def test_queries_do_not_grow_with_agents_or_gpus(agents, django_assert_max_num_queries):
    items = _fleet_of_agents(agents)

    with django_assert_max_num_queries(20):
        first = store_reports(items, received_at=T0)
    later = [(agent, report(r.hostname, r.gpus, T0 + 10)) for agent, r in items]
    # On PostgreSQL the samples take 4 of them: staging tables (IF NOT EXISTS), two COPYs, one move.
    with django_assert_max_num_queries(13):
        second = store_reports(later, received_at=T0 + 10)

    assert first.discovered_gpus == agents
    assert (first.gpu_samples, first.vgpu_samples) == (3 * agents, 4 * agents)
    assert first.drifts == agents * (1 + 2 + 2 + 2)  # discovered, 2 profiles, 2 undeclared, 2 unknown VMs
    assert (second.gpu_samples, second.vgpu_samples, second.discovered_gpus) == (3 * agents, 4 * agents, 0)
