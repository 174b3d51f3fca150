"""Talking to hosts' hypervisors and bringing what they say into the inventory.

- `check_host`: reach the hypervisor and keep the answer (`HypervisorStatus`);
- `sync_host`: read its domains, compare them with the inventory (`hypervisors.discovery`) and
  keep the diff (`SyncReport`);
- `apply_report`: apply what an admin chose of a diff: new VMs created, vCPUs, RAM, names,
  UUIDs and vGPU device ids updated. Through `fleet.services` only, so the placement rules
  decide every vGPU and every capacity change; each refusal is reported for its entry. Sync
  never deletes: a VM the hypervisor lacks is reported and left to the admin.

The network is reached outside any transaction (a slow host must not hold database locks);
the rows are written afterwards, each change in `transaction.atomic` with its AuditEvent.
"""

from __future__ import annotations

import logging
from dataclasses import dataclass
from datetime import timedelta

from django.core.exceptions import ValidationError
from django.db import IntegrityError, transaction
from django.db.models import Q
from django.utils import timezone

from fleet import audit, locks, placement
from fleet import services as fleet_services
from fleet.models import Gpu, Host, Vgpu, VgpuProfile, VirtualMachine
from fleet.placement import PlacementError
from hypervisors import discovery
from hypervisors.backends import open_backend
from hypervisors.backends.base import Domain, HypervisorError
from hypervisors.models import HypervisorStatus, SyncReport, SyncTrigger
from telemetry.queries import recent_vgpu_gpus

logger = logging.getLogger(__name__)

#: How far back the agent's readings count as "lately" when joined to a diff.
TELEMETRY_WINDOW = timedelta(minutes=30)

APPLY_ALL = "all"
APPLY_NONE = "none"


class NotLinked(HypervisorError):
    """The host has no hypervisor URI: the product changes only its inventory."""


class UnknownEntries(ValueError):
    """An apply choice names UUIDs that are not entries of the diff."""

    def __init__(self, uuids: list[str]):
        self.uuids = uuids
        super().__init__(f"Not in the diff of this host: {', '.join(uuids)}. Use the UUIDs of its entries.")


def linked_hosts():
    return Host.objects.exclude(hypervisor_uri="").order_by("name")


def open_link(host: Host):
    """The backend of the host's hypervisor link; NotLinked when it has none."""
    if not host.hypervisor_uri:
        raise NotLinked(f"{host.name} has no hypervisor URI: set one on the host to link it.")
    return open_backend(host.hypervisor_uri, secret_ref=host.hypervisor_secret_ref)


# Connection status -----------------------------------------------------------------------------


def check_host(host: Host) -> HypervisorStatus:
    """Reach the host's hypervisor and keep its answer (reachable, version, message); never raises
    for the hypervisor's sake: an unreachable one is a status with ok False."""
    try:
        backend = open_link(host)
    except HypervisorError as exc:
        ok, message, version, hostname = False, str(exc), "", ""
    else:
        try:
            answer = backend.check()
        finally:
            backend.close()
        ok, message, version, hostname = answer.ok, answer.message, answer.hypervisor_version, answer.hostname
    with transaction.atomic():
        status, _ = HypervisorStatus.objects.update_or_create(host=host, defaults={
            "uri": host.hypervisor_uri, "checked_at": timezone.now(), "ok": ok, "message": message[:2000],
            "hypervisor_version": version[:100], "hostname": hostname[:255],
        })
    return status


# Reading and comparing -------------------------------------------------------------------------


def host_inventory(host: Host, domains: list[Domain]) -> discovery.HostInventory:
    """The inventory snapshot `discovery.diff_host` compares `domains` with (a few queries)."""
    uuids = {domain.uuid for domain in domains}
    names = {domain.name for domain in domains}
    vms = list(VirtualMachine.objects.filter(Q(host=host) | Q(uuid__in=uuids) | Q(name__in=names))
               .select_related("host").order_by("name"))
    vgpus = Vgpu.objects.filter(vm__in=vms).select_related("profile", "gpu").order_by("vm_id", "gpu__pci_bus_id")
    by_vm: dict[int, list[discovery.InventoryVgpu]] = {}
    # The devices the agents report, per VM and GPU: ingest keeps a report on the vGPU it read on
    # that GPU, so they join the readings of that GPU.
    reported: dict[tuple[int, str], list[str]] = {}
    for vgpu in vgpus:
        by_vm.setdefault(vgpu.vm_id, []).append(
            discovery.InventoryVgpu(vgpu.pk, vgpu.profile.name, vgpu.gpu.pci_bus_id, vgpu.device_id))
        if vgpu.reported_device_id:
            reported.setdefault((vgpu.vm_id, vgpu.gpu.pci_bus_id), []).append(vgpu.reported_device_id)
    model_profiles: dict[int, list[str]] = {}
    for name, model_id in VgpuProfile.objects.order_by("name").values_list("name", "gpu_model_id"):
        model_profiles.setdefault(model_id, []).append(name)
    gpu_profiles = {bus: tuple(model_profiles.get(model_id, ()))
                    for bus, model_id in Gpu.objects.filter(host=host).values_list("pci_bus_id", "gpu_model_id")}
    readings = recent_vgpu_gpus([vm.pk for vm in vms], since=timezone.now() - TELEMETRY_WINDOW)
    telemetry = {str(vm.uuid): tuple(discovery.TelemetryVgpu(bus, seen.isoformat(),
                                                             tuple(reported.get((vm.pk, bus), ())))
                                     for bus, seen in readings[vm.pk])
                 for vm in vms if vm.pk in readings}
    return discovery.HostInventory(
        name=host.name,
        vms=tuple(discovery.InventoryVm(vm.pk, str(vm.uuid), vm.name, vm.vcpus, vm.ram_gib,
                                        vm.host.name if vm.host else None, tuple(by_vm.get(vm.pk, ())))
                  for vm in vms),
        gpu_profiles=gpu_profiles,
        telemetry=telemetry,
    )


def read_domains(host: Host) -> list[Domain]:
    backend = open_link(host)
    try:
        return backend.list_domains()
    finally:
        backend.close()


def sync_host(host: Host, *, user=None, trigger: str = SyncTrigger.TASK) -> SyncReport:
    """Read the host's hypervisor, compare it with the inventory and store the diff; returns the
    report. A hypervisor that cannot be read is a report with ok False and the reason (the
    connection status says so too)."""
    error, diff = "", {}
    try:
        domains = read_domains(host)
    except HypervisorError as exc:
        error = str(exc)
    else:
        diff = discovery.diff_host(domains, host_inventory(host, domains))
    with transaction.atomic():
        report = SyncReport.objects.create(host=host, uri=host.hypervisor_uri, ok=not error, error=error, diff=diff,
                                           requested_by=user if user is not None and user.is_authenticated else None,
                                           trigger=trigger)
        if error:
            HypervisorStatus.objects.update_or_create(host=host, defaults={
                "uri": host.hypervisor_uri, "checked_at": timezone.now(), "ok": False, "message": error[:2000],
            })
    return report


# Applying --------------------------------------------------------------------------------------


@dataclass
class Outcome:
    """What applying one entry did: `ok` when everything it asked for was written."""

    uuid: str
    name: str
    kind: str
    ok: bool = True
    messages: list[str] | None = None

    def say(self, message: str, *, refused: bool = False) -> None:
        self.messages = [*(self.messages or []), message]
        if refused:
            self.ok = False

    def as_dict(self) -> dict:
        return {"uuid": self.uuid, "name": self.name, "kind": self.kind, "ok": self.ok,
                "messages": self.messages or []}


def chosen_entries(report: SyncReport, choice) -> list[dict]:
    """The entries `choice` names: "all" (every appliable entry), "none", or a list of UUIDs
    (UnknownEntries for one the diff lacks)."""
    if choice == APPLY_NONE or choice is None:
        return []
    if choice == APPLY_ALL:
        return [entry for entry in report.entries if entry["appliable"]]
    wanted = [str(value).lower() for value in choice]
    by_uuid = {entry["uuid"]: entry for entry in report.entries}
    unknown = [value for value in wanted if value not in by_uuid]
    if unknown:
        raise UnknownEntries(unknown)
    return [by_uuid[value] for value in dict.fromkeys(wanted)]


def apply_report(report: SyncReport, choice, *, user=None) -> list[dict]:
    """Apply the entries of `report` that `choice` names (see `chosen_entries`); returns one
    outcome per entry and keeps them on the report."""
    entries = chosen_entries(report, choice)
    host = report.host
    outcomes = []
    with audit.because(f"hypervisor sync of {host.name}"):
        for entry in entries:
            outcome = Outcome(entry["uuid"], entry["name"], entry["kind"])
            if not entry["appliable"]:
                outcome.say(f"Nothing to apply: {entry['name']} is {entry['kind']}"
                            + (f" ({'; '.join(entry['notes'])})" if entry["notes"] else "") + ".", refused=True)
            elif entry["kind"] == discovery.Kind.NEW:
                _apply_new(host, entry, outcome)
            else:
                _apply_changed(entry, outcome)
            outcomes.append(outcome.as_dict())
    if outcomes:
        with transaction.atomic():
            SyncReport.objects.filter(pk=report.pk).update(applied=[*report.applied, *outcomes],
                                                           applied_at=timezone.now())
        report.refresh_from_db(fields=["applied", "applied_at"])
    return outcomes


def sync_and_apply(host: Host, choice, *, user=None, trigger: str = SyncTrigger.TASK):
    """Read the hypervisor, apply what `choice` names of the fresh diff, and when anything was
    applied read it once more, so the host's last report is the state after the change (the
    page and GET show no difference that was just applied). Returns (the report applied from,
    the outcomes); UnknownEntries for a choice naming UUIDs the diff lacks."""
    report = sync_host(host, user=user, trigger=trigger)
    if not report.ok:
        return report, []
    outcomes = apply_report(report, choice, user=user)
    if outcomes:
        sync_host(host, user=user, trigger=trigger)
    return report, outcomes


def record_device_id(vgpu_id: int, device_id: str) -> bool:
    """Keep the hypervisor's id of a vGPU's device (mdev UUID or VF address) on its inventory row;
    False when the row is gone."""
    with transaction.atomic():
        vgpu = next(iter(locks.lock_for_change(vgpus=Vgpu.objects.filter(pk=vgpu_id)).vgpus.values()), None)
        if vgpu is None:
            return False
        if vgpu.device_id != device_id:
            before = audit.snapshot(vgpu)
            vgpu.device_id = device_id
            vgpu.save(update_fields=["device_id"])
            audit.record("vgpu.device", vgpu, before=before, after=audit.snapshot(vgpu))
    return True


def _refusal(exc: Exception) -> str:
    if isinstance(exc, ValidationError):
        return "; ".join(exc.messages)
    if isinstance(exc, IntegrityError):
        return "another VM already has that name or UUID"
    return str(exc)


def _apply_changed(entry: dict, outcome: Outcome) -> None:
    vm = VirtualMachine.objects.filter(pk=entry["vm_id"]).first()
    if vm is None:
        outcome.say(f"{entry['name']} was deleted from the inventory meanwhile.", refused=True)
        return
    fields = {change["field"]: change["hypervisor"] for change in entry["changes"]}
    if fields:
        try:
            with transaction.atomic():
                fleet_services.update_vm(vm, **fields)
            outcome.say("Updated " + ", ".join(f"{name} to {value}" for name, value in fields.items()) + ".")
        except (PlacementError, ValidationError, IntegrityError) as exc:
            outcome.say(f"{entry['name']} kept its {', '.join(fields)}: {_refusal(exc)}", refused=True)
    for row in entry["device_ids"]:
        if record_device_id(row["vgpu_id"], row["device_id"]):
            outcome.say(f"vGPU {row['vgpu_id']}: device {row['device_id']}.")
        else:
            outcome.say(f"vGPU {row['vgpu_id']} was removed from the inventory meanwhile.", refused=True)


def _apply_new(host: Host, entry: dict, outcome: Outcome) -> None:
    vm = VirtualMachine(name=entry["name"], uuid=entry["uuid"])
    try:
        with transaction.atomic():
            vm.full_clean(exclude=["host", "artist"], validate_unique=True)
            vm = fleet_services.update_vm(vm, vcpus=entry["vcpus"], ram_gib=discovery.ram_gib_of(entry["ram_mib"]))
    except (ValidationError, IntegrityError) as exc:
        outcome.say(f"{entry['name']} was not created: {_refusal(exc)}", refused=True)
        return
    outcome.say(f"Created VM {vm.name} ({vm.vcpus} vCPUs, {vm.ram_gib} GiB).")
    gpus = {gpu.pci_bus_id: gpu for gpu in Gpu.objects.filter(host=host).select_related("gpu_model", "host")}
    for row in entry["vgpus"]:
        if row["profile"] is not None and not row["gpu_bus_id"]:
            _place_unplaced(vm, row, [gpu for _, gpu in sorted(gpus.items())], outcome)
            continue
        gpu = gpus.get(row["gpu_bus_id"])
        if gpu is None or row["profile"] is None:
            why = next((n for n in entry["vgpu_notes"] if row["device_id"] in n), "no matching GPU or profile")
            outcome.say(f"vGPU {row['device_id']} not placed: {why}.", refused=True)
            continue
        profile = VgpuProfile.objects.select_related("gpu_model").get(name=row["profile"])
        try:
            vgpu = fleet_services.place_vgpu(vm, gpu, profile)
        except PlacementError as exc:
            outcome.say(f"vGPU {row['device_id']} ({profile.name} on GPU {gpu.pci_bus_id}) refused: {exc}",
                        refused=True)
            continue
        record_device_id(vgpu.pk, row["device_id"])
        outcome.say(f"Placed {profile.name} on GPU {gpu.pci_bus_id} (device {row['device_id']}).")
    vm.refresh_from_db()
    if vm.host_id is None:
        _host_without_vgpu(vm, host, outcome)


def _place_unplaced(vm: VirtualMachine, row: dict, gpus: list[Gpu], outcome: Outcome) -> None:
    """A vGPU the hypervisor puts on a GPU only at start (a vSphere VM that is off, a Proxmox VE
    resource mapping): the inventory holds it on the first GPU of its model, in address order,
    that placement's rules let take it, as the hypervisor would."""
    profile = VgpuProfile.objects.select_related("gpu_model").get(name=row["profile"])
    refusals = []
    for gpu in (g for g in gpus if g.gpu_model_id == profile.gpu_model_id):
        try:
            vgpu = fleet_services.place_vgpu(vm, gpu, profile)
        except PlacementError as exc:
            refusals.append(f"GPU {gpu.pci_bus_id}: {exc}")
            continue
        record_device_id(vgpu.pk, row["device_id"])
        outcome.say(f"Placed {profile.name} on GPU {gpu.pci_bus_id} (device {row['device_id']}; the hypervisor "
                    "picks its GPU at start, this is the first with room).")
        return
    why = "; ".join(refusals) or f"the host has no {profile.gpu_model.name}"
    outcome.say(f"vGPU {row['device_id']} ({profile.name}) not placed: {why}.", refused=True)


def _host_without_vgpu(vm: VirtualMachine, host: Host, outcome: Outcome) -> None:
    """Put a VM that got no vGPU on its host, where the host's capacity (fleet's rules) takes it."""
    with transaction.atomic():
        locked = locks.lock_for_change(hosts=[host]).hosts[host.pk]
        violations = placement.check_vm_fits_host(vm.name, vm.vcpus, vm.ram_gib,
                                                  fleet_services.host_state(locked, exclude_vm_id=vm.pk))
        if violations:
            outcome.say(f"{vm.name} is in the inventory on no host: {'; '.join(map(str, violations))}", refused=True)
            return
        fleet_services.update_vm(vm, host=locked)
    outcome.say(f"{vm.name} is on {host.name} (no vGPU).")
