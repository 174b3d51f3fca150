"""Storing reports: map what sources say onto the inventory, keep the samples, note the drift.

`store_reports` is the single write path of telemetry: the collector (agents, dcgm-exporter)
and the nvidia-smi push API both call it with validated `Report`s. Rules, and why:

- Clock: a report stamped further than TELEMETRY_MAX_CLOCK_SKEW_S from its arrival is refused
  (its samples would land in the wrong rollup buckets); the refusal is returned per agent in
  `IngestStats.errors` for the caller to record, and the other agents' reports are stored.
- Samples are stamped with `collected_at` truncated to the whole second. Sources are polled
  seconds apart; two readings of one GPU inside one second are one reading sent twice (a
  retried task, an overlapping beat run, a re-posted document) and must count once in the
  averages. With the per-entity unique keys and conflict-ignoring inserts, a repeated report
  stores nothing twice.
- Scope: a report lands only where its agent's token may write (`Agent.host`, `Agent.vm`), so
  a token handed to one host or one VM can never write another's series. Readings outside
  the scope are dropped, the rest of the report is stored, and each dropped part opens a drift
  row naming the agent (`IngestStats.out_of_scope` counts them). An agent bound to a host
  writes that host's GPUs (a GPU the inventory places on another host: `gpu_elsewhere`, not
  stored, the inventory unchanged, as it stays the admin's word) and the vGPUs of the VMs
  placed on that host's GPUs (a VM placed elsewhere: `out_of_scope`; a VM placed nowhere:
  `vgpu_missing`, not stored). An agent bound to a VM (in-guest pushes) writes that VM's vGPU
  readings only: physical GPUs and any other VM are `out_of_scope`, and it discovers nothing.
- Agents bound to nothing: only their first report (never seen before) is admitted, and only
  if it introduces a host the inventory does not have (no host named like the report's
  hostname, case-insensitive, or its first DNS label) with at least one GPU to discover. That
  host is created with placeholder capacity (PLACEHOLDER_CPU_THREADS, PLACEHOLDER_RAM_GIB:
  small enough that no VM can be placed on it until an admin enters the real figures, so a
  guess never over-commits a real server) and the agent is bound to it, in the audit log as
  the agent's doing. Any other report of an unbound agent is refused whole, in
  `IngestStats.errors` and `IngestStats.forbidden` (the push answers 403): binding an agent
  to a host or VM that exists is an admin's decision.
- Bounded growth: a report naming more GPUs the inventory does not know than
  TELEMETRY_MAX_NEW_GPUS (so more new GPU models, too) is refused whole, before anything is
  written: no GPU, model, host or sample of it.
- Discovery: an unknown UUID is added to the agent's host. Its GPU model is found by product
  name without "NVIDIA "/"GRID " prefixes, or created with the reported frame buffer and no
  vGPU profiles. An inventory GPU at the same host and PCI bus id without a UUID is the same
  board: it gets the UUID. Every discovery opens an `unknown_gpu` drift, which stays open
  until an admin resolves it after reviewing the new rows (the GPU is known from then on, so
  no later report could show it to be over). Each row discovery creates or changes is in the
  audit log, by the agent that reported it (source "agent"), written in one statement; a batch
  that discovers nothing writes no event and costs no query for it.
- vGPUs map to VMs by VM UUID when the reading carries one, and then by that alone: a reading
  whose VM UUID matches no inventory VM but whose VM name does is a `vm_uuid_mismatch` drift
  and stores nothing (a clone, a rebuilt VM or another VM given that name would otherwise
  feed that VM's series and its right-sizing). A reading carrying no VM UUID maps by name,
  because its source cannot know the UUID: inside a guest the VM's own UUID is not visible
  (`payload.split_guest_vgpus`, in-guest pushes), and ESXi and Xen give NVML and nvidia-smi a
  domain id, which names no VM (`sources.nvidia_smi`, the agent's `vm_id_type`). Such a
  reading still passes the scope rules below (the VM must be placed on the agent's host, or
  be the agent's own VM), which bounds what a name can reach. An unknown VM gets an `unknown_vm` drift and no
  sample (a sample needs its VM). A VM placed on the agent's host with no vGPU declared on
  that GPU gets a `vgpu_missing` drift and its sample is stored without a vGPU; a type other
  than the declared profile gets a `profile` drift. A guest VM's own reading
  (`Report.guest_vgpus`) maps the same way and is stored against the GPU its declared vGPU
  (on the agent's host, or any for the agent bound to that VM) sits on.
- A host agent's reading names its vGPU instance's mdev UUID where NVML has one. It picks the
  declared vGPU with that device (inventory's or last reported) among several on the GPU, and is
  kept on the vGPU row (`Vgpu.reported_device_id`, for drift and sync), written only when it
  differs from the stored one: a null (older agent, SR-IOV vGPU, a failed read) changes nothing.
- Health (issue 19), stored only where the scope admits the GPU's samples: each GPU's latest
  reading in `GpuHealthState`, each host-reported vGPU's licence and guest (per VM and GPU, as
  the samples) in `VgpuHealthState`, each host's driver versions in `HostDriverState`. They are
  state, not series: a row is upserted only when the reading differs from it (`changed_at`),
  so an unchanged fleet costs one statement a batch (PostgreSQL compares the readings with the
  rows and answers only those that differ) and no write. A host agent's GPU reading that
  carries health lists the vGPUs running on it: the rows of that GPU whose vGPU it no longer
  lists (with health) are deleted (not for dcgm-exporter's, which never lists vGPUs). An
  in-guest agent writes none of them (NVML in a guest sees no licence server's view; the
  host's agent reports it). XID events go to `XidError`,
  stamped like samples (the agent's clock, whole seconds: one code twice in a second is one
  event), dropped by the unique key when re-sent; a source that shows only the last XID code
  (dcgm-exporter, `XidEvent.last_seen`) adds one only when the code differs from the GPU's
  newest stored XID. Readings without health (older agents, sources that do not tell) change
  no state row.
- Drift rows are upserted: one open row per kind and subject, `last_seen` bumped while the
  difference is reported. A later accepted report from the same agent that no longer shows it
  resolves it (`resolved_at`), for every kind except `unknown_gpu` (see above) and
  `out_of_scope`: a write outside the token's scope stays open until an admin has looked at
  it, even if the agent never tries again.
- One transaction per call, and a constant number of queries per call whatever the number of
  agents and GPUs (a first contact adds a savepoint and two statements for the host it
  introduces). On PostgreSQL (the collector's hot path, ~300 agents a second): lookups
  with one array parameter per key list, read as plain tuples, and samples COPied into
  session staging tables then moved with INSERT ... ON CONFLICT DO NOTHING (`_insert_staged`).
  Elsewhere: ORM lookups and inserts batched by Django, which on SQLite means one INSERT per
  ~90 samples because of its 999-parameter cap. On PostgreSQL the inventory rows (GPUs, VMs,
  declared vGPUs) come from the worker process's copy (`telemetry.inventory_cache`), which is
  dropped by the first batch after any process changed an inventory table (the read cache's
  table versions, read once per batch), so an admin's change (a GPU moved, a VM renamed)
  counts from the next report on; elsewhere they are read afresh by every call.
"""

from __future__ import annotations

import math
import re
import time
import uuid as uuid_lib
from collections import defaultdict
from collections.abc import Collection, Iterable
from dataclasses import asdict, dataclass, field
from datetime import UTC, datetime
from functools import cache, lru_cache
from operator import attrgetter, itemgetter

import orjson
from django.conf import settings
from django.core.exceptions import ImproperlyConfigured
from django.db import IntegrityError, connection, transaction
from django.db.models import OuterRef, Q, Subquery
from django.db.models.functions import Lower

from config import read_cache
from fleet import audit
from fleet.choices import AuditSource, GpuMode
from fleet.locks import lock_rows
from fleet.models import Gpu, GpuModel, Host, Vgpu, VirtualMachine
from fleet.pci import canonical_pci_bus_id
from telemetry import inventory_cache
from telemetry.models import (
    Agent,
    Drift,
    DriftKind,
    GpuHealthState,
    GpuSample,
    HostDriverState,
    VgpuHealthState,
    VgpuSample,
    XidError,
)
from telemetry.payload import (
    GPU_HEALTH_FIELDS,
    VGPU_HEALTH_FIELDS,
    DriverInfo,
    GpuHealth,
    GpuReading,
    Report,
    VgpuHealth,
    VgpuReading,
    model_key,
    profile_key,
)
from telemetry.services import agent_snapshot
from telemetry.sources.dcgm import BACKEND as DCGM_BACKEND

# The mapping asks for the key of the same few names thousands of times a batch (a regex each).
_model_key = lru_cache(maxsize=4096)(model_key)
_profile_key = lru_cache(maxsize=4096)(profile_key)

PLACEHOLDER_CPU_THREADS = 1
PLACEHOLDER_RAM_GIB = 1

# Kinds a later report can show to be over (unknown_gpu records a discovery and out_of_scope an
# attempt to write outside the token's scope: an admin resolves those, see the module doc).
SELF_RESOLVING = frozenset({
    DriftKind.GPU_ELSEWHERE, DriftKind.GPU_MODEL, DriftKind.UNKNOWN_VM, DriftKind.VGPU_MISSING, DriftKind.PROFILE,
    DriftKind.VM_UUID_MISMATCH,
})
MAX_SUBJECT = Drift._meta.get_field("subject").max_length

_BRAND = re.compile(r"^(?:(?:NVIDIA|GRID|Tesla|Quadro|GeForce)\s+)+", re.IGNORECASE)
_MAX_CODE = GpuModel._meta.get_field("code").max_length


@dataclass
class IngestStats:
    """What one `store_reports` call did.

    `drifts`: differences found in the accepted reports (each an open Drift row now);
    `resolved_drifts`: open rows that the reports showed to be over; `out_of_scope`: readings
    dropped because they name a GPU or VM outside their agent's scope; `errors`: agent id ->
    why its report was refused (nothing of it was stored), for the caller to record;
    `forbidden`: those of `errors` refused for the agent's scope rather than for the report.
    """

    gpu_samples: int = 0
    vgpu_samples: int = 0
    drifts: int = 0
    discovered_gpus: int = 0
    resolved_drifts: int = 0
    out_of_scope: int = 0
    errors: dict[int, str] = field(default_factory=dict)
    forbidden: set[int] = field(default_factory=set)


def sample_time(collected_at: float) -> datetime:
    """The timestamp samples of a report are stored under: whole seconds, UTC."""
    return datetime.fromtimestamp(math.floor(collected_at), tz=UTC)


def clock_problem(report: Report, received_at: float) -> str | None:
    """Why a report's stamp cannot be trusted (too far from our clock), or None."""
    skew = report.collected_at - received_at
    limit = settings.TELEMETRY_MAX_CLOCK_SKEW_S
    if abs(skew) <= limit:
        return None
    stamped = datetime.fromtimestamp(report.collected_at, tz=UTC).isoformat(timespec="seconds")
    return (f"report refused: stamped {stamped}, {abs(skew):.0f} s {'ahead of' if skew > 0 else 'behind'} "
            f"the server's clock (at most {limit:.0f} s allowed); check the clock of {report.hostname or 'the host'} "
            f"(NTP). Nothing of it was stored.")


def store_reports(
    items: Iterable[tuple[Agent, Report]], received_at: datetime | float | None = None, *, check_clock: bool = True,
) -> IngestStats:
    """Store the samples of each (agent, report), discover GPUs, upsert and resolve drift.

    `received_at` (a datetime or Unix seconds; now by default) is when the reports arrived:
    stamps further from it than TELEMETRY_MAX_CLOCK_SKEW_S are refused per agent, unless
    `check_clock` is off (a back-fill of past readings, `telemetry.history`). Everything
    accepted is written in one transaction. An unbound agent that its first report bound to
    a host has that host set on the instance given, once committed.
    """
    if received_at is None:
        received_s = time.time()
    elif isinstance(received_at, datetime):
        received_s = received_at.timestamp()
    else:
        received_s = float(received_at)
    stats = IngestStats()
    accepted = []
    for agent, report in items:
        problem = clock_problem(report, received_s) if check_clock else None
        if problem:
            stats.errors[agent.pk] = problem
        else:
            accepted.append((agent, report))
    if accepted:
        batch = _Batch(accepted, datetime.fromtimestamp(received_s, tz=UTC), stats)
        with transaction.atomic():
            batch.run()
        for agent, host in batch.bound.values():
            agent.host = host
    return stats


def _host_keys(hostname: str) -> set[str]:
    """Lower-case names a host may be listed under: the full name and its first DNS label."""
    name = hostname.strip().lower()
    return {name, name.split(".", 1)[0]} - {""}


def derive_code(name: str, taken: set[str]) -> str:
    """A profile-style board code for a discovered model ("NVIDIA H200" -> "H200"), unique in `taken`."""
    base = re.sub(r"[^A-Za-z0-9-]", "", _BRAND.sub("", " ".join(name.split())))[: _MAX_CODE - 4] or "GPU"
    code, n = base, 2
    while code.lower() in taken:
        code, n = f"{base}-{n}", n + 1
    taken.add(code.lower())
    return code


@lru_cache(maxsize=1 << 16)
def _device_key(mdev_uuid: str | None) -> str:
    """A reported mdev UUID as the hypervisor backends write device ids (lower case, with dashes),
    or "" for none; a value that is no UUID is kept, lower-cased, so a comparison still fails loud."""
    if not mdev_uuid:
        return ""
    parsed = _parse_uuid(mdev_uuid.strip())
    return str(parsed) if parsed is not None else mdev_uuid.strip().lower()


@lru_cache(maxsize=1 << 18)
def _parse_uuid(value: str | None) -> uuid_lib.UUID | None:
    """`value` as a UUID, or None; kept per process, as the fleet's VMs report the same every poll."""
    try:
        return uuid_lib.UUID(value) if value else None
    except ValueError:
        return None


@lru_cache(maxsize=1 << 18)
def _vm_key(value: str | None) -> str | None:
    """A reported VM UUID as the VM maps are keyed: the UUID's canonical text (lower case, with
    dashes, as PostgreSQL writes it), or None for no UUID or a value that is none. Text, not a
    `uuid.UUID`: its hash is a Python call, and a batch looks VMs up ~10,000 times."""
    parsed = _parse_uuid(value)
    return str(parsed) if parsed is not None else None


def _missing_identity(reading: GpuReading) -> list[str]:
    """What a GPU reading lacks to be added to the inventory (product name, PCI bus id, frame buffer)."""
    return [label for label, value in (("product name", reading.name), ("PCI bus id", reading.pci_bus_id),
                                       ("frame buffer size", reading.fb_total_mib)) if not value]


def _introduced(agent: Agent, report: Report) -> str:
    """The name of the host an unbound agent's report introduces: its hostname, else the agent's name."""
    return (report.hostname or agent.name).strip()


def _refusal(reason: str) -> str:
    return f"report refused: {reason}. Nothing of it was stored."


def _identity(report: Report, reading: GpuReading) -> dict:
    return {"hostname": report.hostname, "uuid": reading.uuid, "name": reading.name,
            "pci_bus_id": reading.pci_bus_id, "fb_total_mib": reading.fb_total_mib,
            "virtualization_mode": reading.virtualization_mode}


class _VmRow:
    """The fields of a VM the mapping reads (a model instance costs ~10x more to build); `uuid` as
    `_vm_key` gives it."""

    __slots__ = ("pk", "uuid", "name")

    def __init__(self, pk: int, uuid: str, name: str):
        self.pk, self.uuid, self.name = pk, uuid, name


class _Named:
    """A related row of which the mapping reads only the name (a GPU's host and model, a vGPU's profile)."""

    __slots__ = ("name",)

    def __init__(self, name: str):
        self.name = name


class _VgpuRow:
    """The fields of a declared vGPU the mapping reads; `gpu_uuid` names its GPU in drifts, and
    `host_id` its GPU's host, which decides whose agents may write the VM's series. `device_id` is
    the inventory's device, `reported` the device the agent last reported (`Vgpu.reported_device_id`)."""

    __slots__ = ("pk", "vm_id", "gpu_id", "host_id", "profile", "gpu_uuid", "device_id", "reported")

    def __init__(self, pk: int, vm_id: int, gpu_id: int, host_id: int, profile_name: str, gpu_uuid: str | None,
                 device_id: str = "", reported: str = ""):
        self.pk, self.vm_id, self.gpu_id, self.host_id = pk, vm_id, gpu_id, host_id
        self.profile, self.gpu_uuid = _Named(profile_name), gpu_uuid
        self.device_id, self.reported = device_id.lower(), reported


class _GpuRow:
    """The fields of an inventory GPU the mapping reads, from one joined row (PostgreSQL lookups)."""

    __slots__ = ("pk", "uuid", "host_id", "host", "gpu_model")

    def __init__(self, pk: int, uuid: str, host_id: int, host_name: str, model_name: str):
        self.pk, self.uuid, self.host_id = pk, uuid, host_id
        self.host, self.gpu_model = _Named(host_name), _Named(model_name)


def sample_columns(model: type, keys: tuple[str, ...]) -> tuple[tuple[str, ...], attrgetter]:
    """The columns the ingest writes into a sample table (`model`: GpuSample or VgpuSample), read off
    the model in its field order without the primary key, and a getter of the metric columns off a
    reading: every column after `keys` (the key columns the mapping supplies, which must come
    first) is read from the reading's attribute of that name.

    The one place that knows the sample tables' columns: rows are built and COPied in this order.
    """
    columns = tuple(f.column for f in model._meta.concrete_fields if not f.primary_key)
    if columns[:len(keys)] != keys:
        raise ImproperlyConfigured(f"{model.__name__}'s columns start {columns[:len(keys)]}, the ingest expects {keys}")
    return columns, attrgetter(*columns[len(keys):])


GPU_SAMPLE_COLUMNS, _gpu_metrics = sample_columns(GpuSample, ("gpu_id", "ts"))
VGPU_SAMPLE_COLUMNS, _vgpu_metrics = sample_columns(VgpuSample, ("vm_id", "gpu_id", "vgpu_id", "ts"))


def _whole_positions(model: type, columns: tuple[str, ...]) -> tuple[int, ...]:
    """Positions of `columns` the model keeps as whole numbers (telemetry.models), keys aside."""
    fields = {f.column: f for f in model._meta.concrete_fields}
    return tuple(i for i, column in enumerate(columns)
                 if fields[column].get_internal_type() in ("SmallIntegerField", "IntegerField")
                 and not fields[column].is_relation)


_GPU_WHOLE = _whole_positions(GpuSample, GPU_SAMPLE_COLUMNS)
_VGPU_WHOLE = _whole_positions(VgpuSample, VGPU_SAMPLE_COLUMNS)


def _stored_rows(rows: Iterable[tuple], whole: tuple[int, ...]) -> list[tuple]:
    """Sample rows as their columns keep them: a reading with a fraction (a DCGM ratio, a KiB
    frame buffer) rounds half up to the whole percent, degree, MiB or MHz, as the pages show it."""
    stored = []
    whole_values = itemgetter(*whole) if len(whole) > 1 else lambda row: (row[whole[0]],)
    for row in rows:
        if float in map(type, whole_values(row)):  # most readings arrive whole: kept as they are
            row = list(row)
            for i in whole:
                if row[i] is not None:
                    row[i] = math.floor(row[i] + 0.5)
            row = tuple(row)
        stored.append(row)
    return stored


class _Batch:
    """One store_reports call: bulk lookups, then mapping, then bulk writes."""

    def __init__(self, items: list[tuple[Agent, Report]], now: datetime, stats: IngestStats):
        self.items = items
        self.now = now
        self.stats = stats
        self.gpus: dict[str, Gpu | _GpuRow] = {}
        self.hosts_by_id: dict[int, Host] = {}
        self.hosts_by_key: dict[str, Host] = {}
        self.vms_by_uuid: dict[str, _VmRow] = {}  # by `_vm_key`
        self.vms_by_name: dict[str, _VmRow] = {}
        self.vgpus_by_vm: dict[int, list[_VgpuRow]] = defaultdict(list)
        self.found: dict[tuple[str, str], tuple[Agent, str, dict]] = {}
        # Rows as tuples in *_SAMPLE_COLUMNS order, keyed like the unique constraints.
        self.gpu_samples: dict[tuple, tuple] = {}
        self.vgpu_samples: dict[tuple, tuple] = {}
        self.schedulers: dict[int, dict] = {}  # GPU pk -> its scheduler reading in this batch
        self.devices: dict[int, str] = {}  # vGPU pk -> the device its agent reports, where it changed
        # Health (issue 19): the latest reading per GPU, per host-reported vGPU (VM pk, GPU pk) with
        # its vGPU pk and type, and per host; the XID events as (GPU pk, code, time) keys; and the
        # GPUs whose report says which vGPUs run on them with health (their other rows go).
        self.gpu_health: dict[int, GpuHealth] = {}
        self.vgpu_health: dict[tuple[int, int], tuple[int | None, str | None, VgpuHealth]] = {}
        self.vgpu_health_gpus: set[int] = set()
        self.drivers: dict[int, DriverInfo] = {}
        self.state_readings: dict[_StateTable, dict[tuple, tuple]] = {}  # what `_state_changes` compared
        self.xids: set[tuple[int, int, datetime]] = set()
        self.last_xids: dict[int, tuple[int, datetime]] = {}  # GPU pk -> a source's last XID code, when seen
        self.events: list = []  # audit events of the inventory rows discovery created or changed
        self.bound: dict[int, tuple[Agent, Host]] = {}  # agent pk -> the host its first report bound it to
        self.created_hosts: set[str] = set()

    def run(self) -> None:
        self._load()
        self._admit()
        self._bind_first_contacts()
        if not self.items:
            return
        self._discover()
        audit.record_many(self.events)
        for agent, report in self.items:
            self._map(agent, report)
        self._write_samples()
        changes = self._state_changes()
        self._write_schedulers(changes[_SCHEDULER_STATE][0])
        self._write_reported_devices()
        self._write_health(changes)
        self._write_scheduler_write_flags()
        self._write_drifts()

    # -- lookups ------------------------------------------------------------------------------

    def _load(self) -> None:
        uuids = {gpu.uuid for _, report in self.items for gpu in report.gpus}
        host_ids = set()
        for agent, _ in self.items:
            if not agent.host_id:
                continue
            if Agent.host.is_cached(agent):  # read with the agent (the collector's batch): no query
                self._add_host(agent.host)
            else:
                host_ids.add(agent.host_id)
        keys = set().union(*(_host_keys(_introduced(agent, report)) for agent, report in self.items
                             if not agent.host_id and not agent.vm_id))
        if host_ids or keys:
            hosts = Host.objects.annotate(lname=Lower("name")).filter(Q(pk__in=host_ids) | Q(lname__in=keys))
            for host in hosts:
                self._add_host(host)
        vm_uuids, vm_names = set(), set()
        for _, report in self.items:
            for readings in [gpu.vgpus for gpu in report.gpus] + [report.guest_vgpus]:
                for reading in readings:
                    key = _vm_key(reading.vm_uuid)
                    if key is not None:
                        vm_uuids.add(key)
                    if reading.vm_name:
                        vm_names.add(reading.vm_name)
        if connection.vendor == "postgresql":
            self._load_pg(uuids, vm_uuids)
            return
        if uuids:
            rows = Gpu.objects.filter(uuid__in=uuids).select_related("host", "gpu_model")
            self.gpus = {gpu.uuid: gpu for gpu in rows}
        if vm_uuids or vm_names:
            rows = VirtualMachine.objects.filter(Q(uuid__in=vm_uuids) | Q(name__in=vm_names))
            for pk, vm_uuid, name in rows.values_list("id", "uuid", "name"):
                vm = _VmRow(pk, str(vm_uuid), name)
                self.vms_by_uuid[vm.uuid] = vm
                self.vms_by_name[name] = vm
        vm_ids = {vm.pk for vm in self.vms_by_name.values()}
        if vm_ids:
            declared = Vgpu.objects.filter(vm_id__in=vm_ids).values_list(
                "id", "vm_id", "gpu_id", "gpu__host_id", "profile__name", "gpu__uuid", "device_id",
                "reported_device_id")
            for row in declared:
                self.vgpus_by_vm[row[1]].append(_VgpuRow(*row))

    def _load_pg(self, uuids: set[str], vm_uuids: set[str]) -> None:
        """The batch's GPUs, VMs and declared vGPUs as plain rows: from this process's copy of the
        inventory (`telemetry.inventory_cache`, checked against the tables' versions once per
        batch), the rows it lacks in at most four small queries, which fill it.

        Each key list is one array parameter (Django's `__in` writes one placeholder per
        value), and the queries stay simple enough for good plans: a VM is looked up by name
        only for readings that carry no VM UUID or whose UUID found none (the mapping never
        consults the name otherwise), because `uuid = ANY(..) OR name = ANY(..)` makes
        PostgreSQL scan and hash every VM (17 ms a batch with 100,000 VMs).
        """
        kept = inventory_cache.CACHE
        if not kept.validate():
            kept = inventory_cache.InventoryCache()  # this batch's only: nothing outlives it
        missing = kept.missing
        grew = False
        with connection.cursor() as cursor:
            wanted = missing(kept.gpus, uuids)
            if wanted:
                cursor.execute(
                    "SELECT g.id, g.uuid, g.host_id, h.name, m.name FROM fleet_gpu g "
                    "JOIN fleet_host h ON h.id = g.host_id JOIN fleet_gpumodel m ON m.id = g.gpu_model_id "
                    "WHERE g.uuid = ANY(%s::varchar[])", [wanted])
                found = {row[1]: _GpuRow(*row) for row in cursor.fetchall()}
                kept.gpus.update((uuid, found.get(uuid, inventory_cache.ABSENT)) for uuid in wanted)
                grew = True
            self.gpus = {uuid: gpu for uuid in uuids if (gpu := kept.gpus[uuid]) is not None}
            wanted = missing(kept.vms_by_uuid, vm_uuids)
            if wanted:
                cursor.execute("SELECT id, uuid::text, name FROM fleet_virtualmachine WHERE uuid = ANY(%s::uuid[])",
                               [wanted])
                found = {row[1]: _VmRow(*row) for row in cursor.fetchall()}
                kept.vms_by_uuid.update((vm_uuid, found.get(vm_uuid, inventory_cache.ABSENT)) for vm_uuid in wanted)
                grew = True
            vms: dict[int, _VmRow] = {}
            for vm_uuid in vm_uuids:
                vm = kept.vms_by_uuid[vm_uuid]
                if vm is not None:
                    vms[vm.pk] = self.vms_by_uuid[vm_uuid] = self.vms_by_name[vm.name] = vm
            by_name = {reading.vm_name for _, report in self.items
                       for readings in [gpu.vgpus for gpu in report.gpus] + [report.guest_vgpus]
                       for reading in readings
                       if reading.vm_name and _vm_key(reading.vm_uuid) not in self.vms_by_uuid}
            by_name -= self.vms_by_name.keys()
            wanted = missing(kept.vms_by_name, by_name)
            if wanted:
                cursor.execute("SELECT id, uuid::text, name FROM fleet_virtualmachine WHERE name = ANY(%s::varchar[])",
                               [wanted])
                found = {row[2]: _VmRow(*row) for row in cursor.fetchall()}
                kept.vms_by_name.update((name, found.get(name, inventory_cache.ABSENT)) for name in wanted)
                grew = True
            for name in by_name:
                vm = kept.vms_by_name[name]
                if vm is not None:
                    vm = vms.get(vm.pk) or vm
                    vms[vm.pk] = self.vms_by_uuid[vm.uuid] = self.vms_by_name[name] = vm
            if not vms:
                return
            wanted = missing(kept.vgpus, vms)
            if wanted:
                # The GPU's host says whose agents may write the VM's series; its UUID names a GPU
                # this batch did not report in drifts.
                cursor.execute(
                    "SELECT v.id, v.vm_id, v.gpu_id, g.host_id, p.name, g.uuid, v.device_id, v.reported_device_id "
                    "FROM fleet_vgpu v "
                    "JOIN fleet_vgpuprofile p ON p.id = v.profile_id JOIN fleet_gpu g ON g.id = v.gpu_id "
                    "WHERE v.vm_id = ANY(%s::bigint[]) ORDER BY v.gpu_id, v.placement_id", [wanted])
                declared = defaultdict(list)
                for row in cursor.fetchall():
                    declared[row[1]].append(_VgpuRow(*row))
                kept.vgpus.update((vm_id, tuple(declared.get(vm_id, ()))) for vm_id in wanted)
                grew = True
        for vm_id in vms:
            self.vgpus_by_vm[vm_id] = kept.vgpus[vm_id]
        if grew and kept is inventory_cache.CACHE:
            kept.grew()

    def _add_host(self, host: Host) -> None:
        self.hosts_by_id[host.pk] = host
        self.hosts_by_key.setdefault(host.name.lower(), host)

    def _host_id(self, agent: Agent) -> int | None:
        """The host an agent writes for: its own, or the one its first report just bound it to."""
        if agent.pk in self.bound:
            return self.bound[agent.pk][1].pk
        return agent.host_id

    def _known_host(self, name: str) -> Host | None:
        """The inventory host a report's hostname names: by full name or first DNS label, any case."""
        name = name.strip().lower()
        return self.hosts_by_key.get(name) or self.hosts_by_key.get(name.split(".", 1)[0])

    def _vm(self, reading: VgpuReading) -> _VmRow | None:
        """The inventory VM a vGPU reading is for: by its VM UUID when it carries one (and then by
        that alone), by name only when it carries none (see the module docstring)."""
        if reading.vm_uuid:
            key = _vm_key(reading.vm_uuid)
            return self.vms_by_uuid.get(key) if key else None
        return self.vms_by_name.get(reading.vm_name) if reading.vm_name else None

    def _uuid_mismatch(self, agent: Agent, reading: VgpuReading, where: str) -> bool:
        """Whether a reading that matched no VM by its UUID names an inventory VM (then a
        `vm_uuid_mismatch` drift is opened and nothing of the reading is stored)."""
        vm = self.vms_by_name.get(reading.vm_name) if reading.vm_uuid and reading.vm_name else None
        if vm is None:
            return False
        self.drift(agent, DriftKind.VM_UUID_MISMATCH, reading.vm_uuid,
                   f"A {reading.type_name or 'vGPU'} {where} runs for VM UUID {reading.vm_uuid} named "
                   f"{reading.vm_name}; the inventory's VM {vm.name} has UUID {vm.uuid}. Not stored: a name alone "
                   f"does not say it is the same VM (a clone, a rebuilt VM, another VM given that name), and "
                   f"another VM's usage must not feed {vm.name}'s right-sizing. If it is the same VM, correct its "
                   f"UUID in the inventory.", asdict(reading))
        return True

    def drift(self, agent: Agent, kind: str, subject: str, detail: str, reported: dict) -> None:
        self.found[(kind, subject[:MAX_SUBJECT])] = (agent, detail, reported)

    def _audit(self, agent: Agent, action: str, obj, before: dict | None = None, *, after: dict | None = None,
               comment: str = "discovered from the agent's report") -> None:
        """An inventory change by discovery, recorded as made by the agent that reported it."""
        with audit.acting_as(None, AuditSource.AGENT, agent.name):
            self.events.append(audit.event(action, obj, before=before, after=after or audit.snapshot(obj),
                                           comment=comment))

    # -- scope and growth -----------------------------------------------------------------------

    def _admit(self) -> None:
        """Refuse whole, before anything is written, the reports that would add more GPUs than
        TELEMETRY_MAX_NEW_GPUS, and those of unbound agents that may not introduce a host."""
        admitted = []
        for agent, report in self.items:
            problem = self._growth_problem(report)
            if problem is None and not agent.host_id and not agent.vm_id:
                problem = self._unbound_problem(agent, report)
                if problem is not None:
                    self.stats.forbidden.add(agent.pk)
            if problem is None:
                admitted.append((agent, report))
            else:
                self.stats.errors[agent.pk] = problem
        self.items = admitted

    def _growth_problem(self, report: Report) -> str | None:
        limit = settings.TELEMETRY_MAX_NEW_GPUS
        unknown = {reading.uuid for reading in report.gpus} - self.gpus.keys()
        if len(unknown) <= limit:
            return None
        return _refusal(f"it names {len(unknown)} GPUs the inventory does not know, and one report may add at most "
                        f"{limit} (TELEMETRY_MAX_NEW_GPUS); add a larger server's GPUs by hand, or raise the limit")

    def _unbound_problem(self, agent: Agent, report: Report) -> str | None:
        """Why an agent bound to no host or VM may not have this report stored, or None for a first
        contact introducing a new host with GPUs to discover."""
        bind = (f"an admin binds agent {agent.name} to its host (or, for pushes from inside a VM, to its VM) "
                f"before its reports are stored")
        if agent.last_seen is not None:
            return _refusal(f"agent {agent.name} is bound to no host or VM, and only its first report may introduce "
                            f"a new host; {bind}")
        name = _introduced(agent, report)
        known = self._known_host(name)
        if known is not None:
            return _refusal(f"agent {agent.name} is bound to no host, and its report is from host {known.name}, "
                            f"which is in the inventory; {bind} (host: {known.name})")
        if not any(reading.uuid not in self.gpus and not _missing_identity(reading) for reading in report.gpus):
            return _refusal(f"agent {agent.name} is bound to no host or VM, and its report has no new GPU to "
                            f"introduce host {name} by; {bind}")
        return None

    def _bind_first_contacts(self) -> None:
        """Create the host each admitted unbound agent's first report introduces, and bind the agent to it.

        One savepoint each: a host of that name created meanwhile (by another agent's first
        contact, or an admin) or the agent bound meanwhile undoes only this agent's claim, and
        its report is refused like any unbound agent's naming a known host.
        """
        kept = []
        for agent, report in self.items:
            if agent.host_id or agent.vm_id:
                kept.append((agent, report))
                continue
            name = _introduced(agent, report)
            host = None if self._known_host(name) else self._claim_host(agent, name)
            if host is None:
                self.stats.errors[agent.pk] = _refusal(
                    f"host {name} was added to the inventory, or agent {agent.name} bound, while the agent's first "
                    f"report was being stored; an admin binds the agent to its host")
                self.stats.forbidden.add(agent.pk)
                continue
            self._add_host(host)
            self.bound[agent.pk] = (agent, host)
            self.created_hosts.add(host.name)
            before = agent_snapshot(agent)
            after = {**before, "host_id": host.pk}
            self._audit(agent, "host.create", host)
            self._audit(agent, "agent.update", agent, before, after=after,
                        comment="bound to the host its first report introduced")
            kept.append((agent, report))
        self.items = kept

    def _claim_host(self, agent: Agent, name: str) -> Host | None:
        """A new host named `name` with `agent` bound to it, or None if the name or the agent was taken."""
        try:
            with transaction.atomic():
                host = Host.objects.create(name=name, cpu_threads=PLACEHOLDER_CPU_THREADS,
                                           ram_gib=PLACEHOLDER_RAM_GIB)
                if not Agent.objects.filter(pk=agent.pk, host__isnull=True, vm__isnull=True).update(host=host):
                    raise IntegrityError(f"agent {agent.pk} was bound meanwhile")
        except IntegrityError:
            return None
        return host

    # -- discovery ----------------------------------------------------------------------------

    def _discover(self) -> None:
        """Add the GPUs nobody declared (and their models) to the hosts of the agents reporting them."""
        pending: dict[str, tuple[Agent, Report, GpuReading]] = {}
        target: dict[str, int] = {}  # GPU uuid -> id of the host it joins
        for agent, report in self.items:
            host_id = self._host_id(agent)
            if host_id is None:
                continue  # bound to a VM: its physical GPUs are out of scope (see _map_guest_agent)
            for reading in report.gpus:
                if reading.uuid in self.gpus or reading.uuid in pending:
                    continue
                missing = _missing_identity(reading)
                if missing:
                    self.drift(agent, DriftKind.UNKNOWN_GPU, reading.uuid,
                               f"GPU {reading.uuid} reported by {report.hostname or agent.name} is not in the "
                               f"inventory and cannot be added: its {' and '.join(missing)} was not reported. "
                               f"Add it by hand.", _identity(report, reading))
                    continue
                pending[reading.uuid] = (agent, report, reading)
                target[reading.uuid] = host_id
        if not pending:
            return

        # A declared GPU at the same host and PCI bus id: the same board if it has no UUID yet. Bus
        # ids are compared in the inventory's form (`fleet.pci`): lspci's 0000:3b:00.0 is NVML's
        # 00000000:3B:00.0.
        existing = {}
        pcis = {canonical_pci_bus_id(pending[uuid][2].pci_bus_id) for uuid in pending}
        for gpu in Gpu.objects.filter(host_id__in=set(target.values()), pci_bus_id__in=pcis).select_related(
                "host", "gpu_model"):
            existing[(gpu.host_id, gpu.pci_bus_id)] = gpu
        adopted = []
        for uuid in list(pending):
            agent, report, reading = pending[uuid]
            holder = existing.get((target[uuid], canonical_pci_bus_id(reading.pci_bus_id)))
            if holder is None:
                continue
            del pending[uuid]
            if holder.uuid:
                self.drift(agent, DriftKind.UNKNOWN_GPU, uuid,
                           f"GPU {uuid} ({reading.name}) is reported at PCI bus id {reading.pci_bus_id} of host "
                           f"{holder.host.name}, where the inventory has GPU {holder.uuid}; not added. If the board "
                           f"was replaced, change that GPU's UUID.", _identity(report, reading))
            else:
                before = audit.snapshot(holder)
                holder.uuid = uuid
                adopted.append(holder)
                self._audit(agent, "gpu.update", holder, before)
                self.gpus[uuid] = holder
        if adopted:
            # In the fleet's lock order (fleet.locks), so a placement holding some of these GPUs
            # makes this batch wait instead of closing a circle with it.
            lock_rows(Gpu.objects.filter(pk__in=[gpu.pk for gpu in adopted]))
            Gpu.objects.bulk_update(adopted, ["uuid"])
        if not pending:
            return

        # Models: by product name without vendor prefixes, else a new one.
        models_by_key, codes = {}, set()
        for model in GpuModel.objects.all():
            models_by_key.setdefault(model_key(model.name), model)
            codes.add(model.code.lower())
        new_models: dict[str, GpuModel] = {}
        model_agent: dict[str, Agent] = {}
        for agent, _, reading in pending.values():
            key = model_key(reading.name)
            if key not in models_by_key and key not in new_models:
                model_agent[key] = agent
                new_models[key] = GpuModel(name=" ".join(reading.name.split()), code=derive_code(reading.name, codes),
                                           fb_mib=max(1, round(reading.fb_total_mib)))
        if new_models:
            GpuModel.objects.bulk_create(new_models.values(), ignore_conflicts=True)
            for model in GpuModel.objects.filter(name__in=[m.name for m in new_models.values()]):
                models_by_key[model_key(model.name)] = model
                if model_key(model.name) in model_agent:
                    self._audit(model_agent[model_key(model.name)], "gpu_model.create", model)

        rows = []
        for uuid, (_, _, reading) in pending.items():
            host = self.hosts_by_id.get(target[uuid])
            model = models_by_key.get(model_key(reading.name))
            if host is None or model is None:
                continue
            mode = GpuMode.VGPU if reading.virtualization_mode in ("vgpu_host", None) else GpuMode.PASSTHROUGH
            rows.append(Gpu(host=host, gpu_model=model, uuid=uuid, pci_bus_id=canonical_pci_bus_id(reading.pci_bus_id),
                            mode=mode))
        Gpu.objects.bulk_create(rows, ignore_conflicts=True)
        for gpu in Gpu.objects.filter(uuid__in=list(pending)).select_related("host", "gpu_model"):
            self.gpus[gpu.uuid] = gpu
        for uuid, (agent, report, reading) in pending.items():
            gpu = self.gpus.get(uuid)
            if gpu is None:
                self.drift(agent, DriftKind.UNKNOWN_GPU, uuid,
                           f"GPU {uuid} ({reading.name}) reported by {report.hostname or agent.name} is not in the "
                           f"inventory and could not be added: the inventory changed meanwhile (another GPU took PCI "
                           f"bus id {reading.pci_bus_id} on that host, or its host was deleted or its model could not "
                           f"be created). "
                           f"No samples are stored for it; the next report tries again.", _identity(report, reading))
                continue
            self.stats.discovered_gpus += 1
            self._audit(agent, "gpu.create", gpu)
            notes = []
            if gpu.host.name in self.created_hosts:
                notes.append(f"host {gpu.host.name} was created for it with placeholder capacity "
                             f"({PLACEHOLDER_CPU_THREADS} CPU thread, {PLACEHOLDER_RAM_GIB} GiB RAM, so no VM fits): "
                             f"enter its real CPU threads and RAM")
            if model_key(gpu.gpu_model.name) in new_models:
                notes.append(f"GPU model {gpu.gpu_model.name} (code {gpu.gpu_model.code}, "
                             f"{gpu.gpu_model.fb_mib} MiB) was created without vGPU profiles")
            self.drift(agent, DriftKind.UNKNOWN_GPU, uuid,
                       f"GPU {uuid} ({gpu.gpu_model.name}, PCI bus id {gpu.pci_bus_id}) reported by "
                       f"{report.hostname or agent.name} was not in the inventory: added to host {gpu.host.name} "
                       f"in {gpu.get_mode_display()} mode." + "".join(f" Note: {n}." for n in notes)
                       + " Review it, then resolve this.", _identity(report, reading))

    # -- mapping ------------------------------------------------------------------------------

    def _map(self, agent: Agent, report: Report) -> None:
        ts = sample_time(report.collected_at)
        if agent.vm_id:
            self._map_guest_agent(agent, report, ts)
            return
        host = self.hosts_by_id.get(self._host_id(agent))
        # dcgm-exporter shows no vGPUs: its GPU readings say nothing of which run (see _write_vgpu_health).
        lists_vgpus = report.backend != DCGM_BACKEND
        if host is not None and report.driver is not None and report.gpus:
            # A report of physical GPUs: one of guest vGPUs only names a VM's driver.
            self.drivers[host.pk] = report.driver
        for reading in report.gpus:
            gpu = self.gpus.get(reading.uuid)
            if gpu is None:
                continue  # not discoverable; its drift says why
            if host is None or gpu.host_id != host.pk:
                # Its samples, its vGPUs' and its scheduler state alike: the token is not this host's.
                self.stats.out_of_scope += 1 + len(reading.vgpus)
                self.drift(agent, DriftKind.GPU_ELSEWHERE, gpu.uuid,
                           f"GPU {gpu.uuid} ({gpu.gpu_model.name}) is on host {gpu.host.name} in the inventory "
                           f"but is reported by agent {agent.name} of "
                           f"{f'host {host.name}' if host else 'no host'}. Nothing of it is stored (an agent writes "
                           f"only its own host's series); the inventory is unchanged. If the board moved, change "
                           f"its host.", _identity(report, reading))
                continue
            if reading.name and _model_key(reading.name) != _model_key(gpu.gpu_model.name):
                self.drift(agent, DriftKind.GPU_MODEL, gpu.uuid,
                           f"GPU {gpu.uuid} on {gpu.host.name} reports itself as {reading.name}; the inventory "
                           f"says {gpu.gpu_model.name}.", _identity(report, reading))
            self.gpu_samples[(gpu.pk, ts)] = (gpu.pk, ts, *_gpu_metrics(reading))
            if reading.scheduler is not None:
                self.schedulers[gpu.pk] = reading.scheduler
            health = reading.health
            if health is not None:
                self.gpu_health[gpu.pk] = health
                for event in health.xid_events:
                    if event.last_seen:
                        self.last_xids[gpu.pk] = (event.code, sample_time(event.at))
                    else:
                        self.xids.add((gpu.pk, event.code, sample_time(event.at)))
            if (health is not None and lists_vgpus) or any(v.health is not None for v in reading.vgpus):
                self.vgpu_health_gpus.add(gpu.pk)
            for vgpu_reading in reading.vgpus:
                self._host_vgpu(agent, gpu, vgpu_reading, ts)
        for vgpu_reading in report.guest_vgpus:
            self._guest_vgpu(agent, report, vgpu_reading, ts)

    def _map_guest_agent(self, agent: Agent, report: Report, ts: datetime) -> None:
        """An agent bound to a VM: that VM's own vGPU readings are stored, nothing else."""
        if report.gpus:
            uuids = [reading.uuid for reading in report.gpus]
            self.stats.out_of_scope += len(uuids) + sum(len(reading.vgpus) for reading in report.gpus)
            # One row per agent, not per GPU: the UUIDs are the sender's to choose.
            self.drift(agent, DriftKind.OUT_OF_SCOPE, f"GPUs from {agent.name}",
                       f"Agent {agent.name} is bound to VM {agent.vm.name}: it may write that VM's vGPU readings "
                       f"only, never a GPU's. Its report named {len(uuids)} physical GPU(s) "
                       f"({', '.join(uuids[:3])}{', ...' if len(uuids) > 3 else ''}); nothing of them is stored.",
                       {"hostname": report.hostname, "uuids": uuids[:16]})
        for reading in report.guest_vgpus:
            vm = self._vm(reading)
            if vm is None and self._uuid_mismatch(agent, reading, f"reported by {agent.name}"):
                continue
            if vm is None or vm.pk != agent.vm_id:
                self.stats.out_of_scope += 1
                named = f"VM {vm.name}" if vm else f"{reading.vm_name or 'no VM'} (not in the inventory)"
                self.drift(agent, DriftKind.OUT_OF_SCOPE, f"{vm.name if vm else reading.vm_name} from {agent.name}",
                           f"Agent {agent.name} is bound to VM {agent.vm.name}: it may write that VM's readings "
                           f"only, but its report is for {named}; not stored.", asdict(reading))
                continue
            self._guest_vgpu(agent, report, reading, ts)

    def _placed_elsewhere(self, agent: Agent, host_name: str, vm: _VmRow, reading: VgpuReading, where: str) -> None:
        """Drop a vGPU reading of a VM that the inventory places on another host's GPUs."""
        self.stats.out_of_scope += 1
        self.drift(agent, DriftKind.OUT_OF_SCOPE, f"{vm.name} from {agent.name}",
                   f"Agent {agent.name} of host {host_name} reports VM {vm.name} {where}, but the inventory places "
                   f"that VM on another host (GPU {self.vgpus_by_vm[vm.pk][0].gpu_uuid}); not stored: an agent "
                   f"writes only the series of VMs placed on its host's GPUs.", asdict(reading))

    def _host_vgpu(self, agent: Agent, gpu: Gpu, reading: VgpuReading, ts: datetime) -> None:
        vm = self._vm(reading)
        if vm is None:
            if self._uuid_mismatch(agent, reading, f"on GPU {gpu.uuid} ({gpu.host.name})"):
                return
            who = reading.vm_name or reading.vm_uuid or "with no name or UUID reported"
            self.drift(agent, DriftKind.UNKNOWN_VM, reading.vm_uuid or reading.vm_name or reading.vgpu_uuid
                       or f"{reading.type_name} on {gpu.uuid}",
                       f"A {reading.type_name or 'vGPU'} on GPU {gpu.uuid} ({gpu.host.name}) runs for VM {who}, "
                       f"which the inventory does not know; no samples are stored for it.", asdict(reading))
            return
        placed = self.vgpus_by_vm[vm.pk]
        if not placed:
            self.stats.out_of_scope += 1
            self.drift(agent, DriftKind.VGPU_MISSING, f"{vm.name} on {gpu.uuid}",
                       f"VM {vm.name} runs a {reading.type_name or 'vGPU'} on GPU {gpu.uuid} ({gpu.host.name}) "
                       f"that the inventory does not declare, and the inventory places the VM on no GPU: its "
                       f"samples are not stored until an admin places it (an agent writes only the series of VMs "
                       f"placed on its host's GPUs).", asdict(reading))
            return
        gpu_pk = gpu.pk
        declared = [v for v in placed if v.gpu_id == gpu_pk]  # on this GPU, so on this host
        if not declared:
            if not any(v.host_id == gpu.host_id for v in placed):
                self._placed_elsewhere(agent, gpu.host.name, vm, reading, f"on GPU {gpu.uuid}")
                return
            self.drift(agent, DriftKind.VGPU_MISSING, f"{vm.name} on {gpu.uuid}",
                       f"VM {vm.name} runs a {reading.type_name or 'vGPU'} on GPU {gpu.uuid} ({gpu.host.name}) "
                       f"that the inventory does not declare; its samples are stored without a vGPU.",
                       asdict(reading))
            vgpu = None
        else:
            device = _device_key(reading.mdev_uuid)
            # The agent names the device: that picks the vGPU among several of one profile on the GPU.
            same = [v for v in declared if v.device_id == device or v.reported == device] if device else None
            vgpu = self._declared(agent, vm, same or declared, reading, gpu.uuid)
            if device and device != vgpu.reported:
                self.devices[vgpu.pk] = device
        self._vgpu_sample(vm, gpu.pk, vgpu, reading, ts)
        if reading.health is not None:
            self.vgpu_health[(vm.pk, gpu.pk)] = (vgpu.pk if vgpu is not None else None, reading.type_name,
                                                 reading.health)

    def _guest_vgpu(self, agent: Agent, report: Report, reading: VgpuReading, ts: datetime) -> None:
        vm = self._vm(reading)
        if vm is None:
            if self._uuid_mismatch(agent, reading, f"reported by {report.hostname or agent.name}"):
                return
            self.drift(agent, DriftKind.UNKNOWN_VM, reading.vm_name or reading.vgpu_uuid or agent.name,
                       f"Guest {reading.vm_name or agent.name} reports a {reading.type_name or 'vGPU'}, but the "
                       f"inventory has no VM of that name; no samples are stored for it.", asdict(reading))
            return
        declared = self.vgpus_by_vm[vm.pk]
        if not declared:
            self.drift(agent, DriftKind.VGPU_MISSING, f"{vm.name} (guest)",
                       f"VM {vm.name} reports a {reading.type_name or 'vGPU'} from inside, but the inventory "
                       f"declares no vGPU for it, so its GPU is unknown; no samples are stored for it.",
                       asdict(reading))
            return
        if not agent.vm_id:  # the host's agent: only the VM's vGPUs on that host
            host_id = self._host_id(agent)
            declared = [v for v in declared if v.host_id == host_id]
            if not declared:
                host = self.hosts_by_id.get(host_id)
                self._placed_elsewhere(agent, host.name if host else "(none)", vm, reading, "from inside")
                return
        vgpu = self._declared(agent, vm, declared, reading, declared[0].gpu_uuid)
        self._vgpu_sample(vm, vgpu.gpu_id, vgpu, reading, ts)

    def _declared(self, agent: Agent, vm: _VmRow, declared: list[_VgpuRow], reading: VgpuReading,
                  gpu_uuid: str | None) -> _VgpuRow:
        """The declared vGPU a reading belongs to: the one of its type, else the first (a profile drift
        about the VM on `gpu_uuid`)."""
        if reading.type_name is None:
            return declared[0]
        key = _profile_key(reading.type_name)
        for vgpu in declared:
            if _profile_key(vgpu.profile.name) == key:
                return vgpu
        vgpu = declared[0]
        self.drift(agent, DriftKind.PROFILE, f"{vm.name} on {gpu_uuid}",
                   f"VM {vm.name} runs a {reading.type_name} on GPU {vgpu.gpu_uuid}, but the inventory declares "
                   f"{', '.join(v.profile.name for v in declared)}.", asdict(reading))
        return vgpu

    def _vgpu_sample(self, vm: _VmRow, gpu_id: int, vgpu: _VgpuRow | None, reading: VgpuReading,
                     ts: datetime) -> None:
        self.vgpu_samples[(vm.pk, gpu_id, ts)] = (vm.pk, gpu_id, vgpu.pk if vgpu is not None else None, ts,
                                                  *_vgpu_metrics(reading))

    # -- writes -------------------------------------------------------------------------------

    def _state_changes(self) -> dict[_StateTable, tuple[set[tuple], set[int]]]:
        """Which stored state differs from this batch's readings: each GPU's scheduler reading
        (`Gpu.scheduler_reported`) and the health state tables, as `_state_changes` describes. On
        PostgreSQL one statement for them all, answering only what differs (nothing while the
        fleet holds still); elsewhere each table is read and compared here."""
        # Each reading as its row: key columns, then fields.
        gpu_values, driver_values = _getter(GPU_HEALTH_FIELDS), _getter(_DRIVER_STATE.fields)
        readings = {
            _SCHEDULER_STATE: {(gpu_id,): (gpu_id, reading) for gpu_id, reading in self.schedulers.items()},
            _GPU_STATE: {(gpu_id,): (gpu_id, *gpu_values(health)) for gpu_id, health in self.gpu_health.items()},
            _VGPU_STATE: {key: (*key, vgpu_id, type_name, *_vgpu_health_values(health))
                          for key, (vgpu_id, type_name, health) in self.vgpu_health.items()},
            _DRIVER_STATE: {(host_id,): (host_id, *driver_values(driver)) for host_id, driver in self.drivers.items()},
        }
        self.state_readings = readings
        # The vGPU rows of a GPU whose report lists its vGPUs (with health) are those running now:
        # a row of one of those GPUs that the readings do not name is gone.
        scopes = {_VGPU_STATE: self.vgpu_health_gpus}
        wanted = [table for table in readings if readings[table] or scopes.get(table)]
        changes = {table: (set(), set()) for table in readings}
        if connection.vendor == "postgresql":
            if wanted:
                changes.update(_state_changes_pg([(table, readings[table], scopes.get(table)) for table in wanted]))
        else:
            changes.update({table: _state_changes(table, readings[table], scopes.get(table)) for table in wanted})
        return changes

    def _write_schedulers(self, changed: set[tuple]) -> None:
        """Store each GPU's scheduler reading where it differs from the stored one (`changed`, from
        `_state_changes`): at most one bulk update per batch, so the hot ingest path writes nothing
        while the scheduler is unchanged. `scheduler_reported_at` is therefore when the reading last
        changed."""
        if not changed:
            return
        gpus = [Gpu(pk=pk, scheduler_reported=self.schedulers[pk], scheduler_reported_at=self.now)
                for (pk,) in sorted(changed)]
        lock_rows(Gpu.objects.filter(pk__in=[gpu.pk for gpu in gpus]))  # fleet.locks' order, as above
        Gpu.objects.bulk_update(gpus, ["scheduler_reported", "scheduler_reported_at"])

    def _write_reported_devices(self) -> None:
        """Store the device each agent reports for a vGPU where it differs from the stored one (found
        against the rows `_load` read): no query while nothing changes, so the time series does not
        grow a column and the hot path pays nothing. After the GPUs (fleet.locks' order)."""
        if not self.devices:
            return
        locked = lock_rows(Vgpu.objects.filter(pk__in=self.devices).only("pk"))
        changed = [Vgpu(pk=row.pk, reported_device_id=self.devices[row.pk], reported_device_at=self.now)
                   for row in locked]
        Vgpu.objects.bulk_update(changed, ["reported_device_id", "reported_device_at"])

    def _write_health(self, changes: dict[_StateTable, tuple[set[tuple], set[int]]]) -> None:
        """Store the health readings: state rows where they changed (`changes`, from
        `_state_changes`), XID events once each.

        The state tables hold the latest reading (`changed_at`: when it last changed), so only the
        rows that differ from the batch's readings are written: a fleet whose health does not
        change writes nothing. The rows hang off the fleet's and lock nothing after themselves
        (fleet.locks' last group): they are written after the GPUs and vGPUs, each table in
        ascending key, so two batches reporting the same GPUs queue behind each other rather
        than deadlock.
        """
        for table in (_GPU_STATE, _VGPU_STATE, _DRIVER_STATE):
            changed, gone = changes[table]
            if gone:
                table.model.objects.filter(pk__in=sorted(gone)).delete()
            if changed:
                rows = []
                for key in sorted(changed):
                    row = self.state_readings[table][key]
                    rows.append(table.model(changed_at=self.now, **dict(zip(table.keys, key, strict=True)),
                                            **_state_fields(table.fields, row[len(table.keys):])))
                table.model.objects.bulk_create(
                    rows, update_conflicts=True, unique_fields=[k.removesuffix("_id") for k in table.keys],
                    update_fields=[*table.fields, "changed_at"])
        if self.last_xids:
            # A source that shows only the last XID code (dcgm-exporter): an event only when the
            # code differs from the GPU's newest stored one, so a held value is stored once.
            newest = XidError.objects.filter(gpu_id=OuterRef("pk")).order_by("-at", "-pk").values("code")[:1]
            stored = dict(Gpu.objects.filter(pk__in=self.last_xids).order_by().annotate(
                last=Subquery(newest)).values_list("pk", "last"))
            self.xids.update((gpu_id, code, at) for gpu_id, (code, at) in self.last_xids.items()
                             if stored.get(gpu_id) != code)
        if self.xids:
            # An event re-sent (a retried poll, a re-posted document) is dropped by the unique key.
            XidError.objects.bulk_create(
                [XidError(gpu_id=gpu_id, code=code, at=at, received_at=self.now)
                 for gpu_id, code, at in sorted(self.xids)], ignore_conflicts=True)

    def _write_scheduler_write_flags(self) -> None:
        """Store on each agent whether it accepts scheduler changes, as its report says: no query
        while nothing changes (the Agent rows in hand carry the stored value)."""
        flips: dict[bool, list[Agent]] = defaultdict(list)
        for agent, report in self.items:
            if report.scheduler_write is not None and agent.scheduler_write != report.scheduler_write:
                flips[report.scheduler_write].append(agent)
        for value, agents in flips.items():
            Agent.objects.filter(pk__in=[agent.pk for agent in agents]).update(scheduler_write=value)
            for agent in agents:
                agent.scheduler_write = value

    def _write_samples(self) -> None:
        """Insert the samples not stored yet; a repeated or racing one is dropped by the unique key.

        PostgreSQL: COPY straight into the tables (`_copy_or_insert`), and where a sample is
        stored already, COPY into staging tables, then one INSERT ... ON CONFLICT DO NOTHING per
        table in a single statement (`_insert_staged`), no pre-read. Elsewhere: read the keys
        already stored, bulk_create the rest.
        """
        self.gpu_samples = dict(zip(self.gpu_samples, _stored_rows(self.gpu_samples.values(), _GPU_WHOLE),
                                    strict=True))
        self.vgpu_samples = dict(zip(self.vgpu_samples, _stored_rows(self.vgpu_samples.values(), _VGPU_WHOLE),
                                     strict=True))
        if connection.vendor == "postgresql":
            if self.gpu_samples or self.vgpu_samples:
                self.stats.gpu_samples, self.stats.vgpu_samples = _copy_or_insert([
                    (GpuSample, GPU_SAMPLE_COLUMNS, self.gpu_samples.values()),
                    (VgpuSample, VGPU_SAMPLE_COLUMNS, self.vgpu_samples.values())])
            return
        if self.gpu_samples:
            stored = set(GpuSample.objects.filter(
                gpu_id__in={k[0] for k in self.gpu_samples}, ts__in={k[1] for k in self.gpu_samples},
            ).values_list("gpu_id", "ts"))
            new = [GpuSample(**dict(zip(GPU_SAMPLE_COLUMNS, row, strict=True)))
                   for key, row in self.gpu_samples.items() if key not in stored]
            GpuSample.objects.bulk_create(new, ignore_conflicts=True)
            self.stats.gpu_samples = len(new)
        if self.vgpu_samples:
            stored = set(VgpuSample.objects.filter(
                vm_id__in={k[0] for k in self.vgpu_samples}, ts__in={k[2] for k in self.vgpu_samples},
            ).values_list("vm_id", "gpu_id", "ts"))
            new = [VgpuSample(**dict(zip(VGPU_SAMPLE_COLUMNS, row, strict=True)))
                   for key, row in self.vgpu_samples.items() if key not in stored]
            VgpuSample.objects.bulk_create(new, ignore_conflicts=True)
            self.stats.vgpu_samples = len(new)

    def _write_drifts(self) -> None:
        agent_ids = {agent.pk for agent, _ in self.items}
        subjects = {subject for _, subject in self.found}
        open_rows = list(Drift.objects.filter(resolved_at__isnull=True).filter(
            Q(subject__in=subjects) | Q(agent_id__in=agent_ids)))
        by_key = {(row.kind, row.subject): row for row in open_rows}
        seen, new = [], []
        for (kind, subject), (agent, detail, reported) in self.found.items():
            row = by_key.get((kind, subject))
            if row is None:
                new.append(Drift(agent=agent, kind=kind, subject=subject, detail=detail, reported=reported,
                                 first_seen=self.now, last_seen=self.now))
            else:
                row.agent, row.detail, row.reported, row.last_seen = agent, detail, reported, self.now
                seen.append(row)
        if seen:
            Drift.objects.bulk_update(seen, ["agent", "detail", "reported", "last_seen"])
        if new:
            # Another ingest may open the same drift meanwhile: the partial unique key keeps one.
            Drift.objects.bulk_create(new, ignore_conflicts=True)
        over = [row.pk for row in open_rows if row.agent_id in agent_ids and row.kind in SELF_RESOLVING
                and (row.kind, row.subject) not in self.found]
        if over:
            Drift.objects.filter(pk__in=over).update(resolved_at=self.now)
        self.stats.drifts = len(self.found)
        self.stats.resolved_drifts = len(over)


@lru_cache(maxsize=4096)
def _epoch(seconds: float) -> float:
    """Unix seconds as a time column keeps them (whole microseconds): licence expiries repeat."""
    return datetime.fromtimestamp(seconds, tz=UTC).timestamp()


@lru_cache(maxsize=64)
def _getter(fields: tuple[str, ...]):
    return attrgetter(*fields)


_EXPIRY_AT = VGPU_HEALTH_FIELDS.index("license_expiry")
_vgpu_health_getter = attrgetter(*VGPU_HEALTH_FIELDS)


def _vgpu_health_values(reading: VgpuHealth) -> tuple:
    """A vGPU's health reading (VGPU_HEALTH_FIELDS) as it is compared with the stored row: a licence
    expiry as the Unix seconds its column keeps (whole microseconds), the rest as read."""
    values = _vgpu_health_getter(reading)
    expiry = values[_EXPIRY_AT]
    if expiry is not None and _epoch(expiry) != expiry:  # a fraction finer than the column's
        values = (*values[:_EXPIRY_AT], _epoch(expiry), *values[_EXPIRY_AT + 1:])
    return values


def _state_fields(fields: tuple[str, ...], values: tuple) -> dict:
    """Keyword arguments of a state row from its compared fields (a licence expiry back to a time)."""
    row = dict(zip(fields, values, strict=True))
    if row.get("license_expiry") is not None:
        row["license_expiry"] = datetime.fromtimestamp(row["license_expiry"], tz=UTC)
    return row


@dataclass(frozen=True, eq=False)
class _StateTable:
    """State the ingest keeps as the latest reading and writes only when it differs: `keys` are the
    columns that name a row (its unique key), `fields` the columns holding the reading (model field
    names; a licence expiry compared as Unix seconds, see `_vgpu_health_values`). With `upsert`, a
    reading without a row is a change (the row is created); without, the row must exist (a
    column of an inventory row) and a reading without one is not compared."""

    model: type
    keys: tuple[str, ...]
    fields: tuple[str, ...]
    upsert: bool = True


_SCHEDULER_STATE = _StateTable(Gpu, ("id",), ("scheduler_reported",), upsert=False)
_GPU_STATE = _StateTable(GpuHealthState, ("gpu_id",), GPU_HEALTH_FIELDS)
_VGPU_STATE = _StateTable(VgpuHealthState, ("vm_id", "gpu_id"), ("vgpu_id", "type_name", *VGPU_HEALTH_FIELDS))
_DRIVER_STATE = _StateTable(HostDriverState, ("host_id",), tuple(DriverInfo.__slots__))


def _state_changes(table: _StateTable, readings: dict[tuple, tuple], scope: Collection[int] | None,
                   ) -> tuple[set[tuple], set[int]]:
    """Which rows of `table` differ from `readings` (key -> the row it reads as: key columns, then
    fields, as compared: `_vgpu_health_values`), read and compared here (the ORM: SQLite): the keys to
    write, and with a `scope` (the GPUs whose vGPU rows the readings list in full) the primary
    keys of that scope's rows the readings no longer name."""
    model = table.model
    columns = [*table.keys, *table.fields]
    times = [i for i, name in enumerate(columns) if model._meta.get_field(name).get_internal_type() == "DateTimeField"]
    key_of = slice(0, len(table.keys))
    if scope is None:
        rows = model.objects.filter(pk__in=[key[0] for key in readings]).values_list("pk", *columns)
    else:
        rows = model.objects.filter(gpu_id__in=scope).values_list("pk", *columns)
    stored: dict[tuple, tuple] = {}
    gone: set[int] = set()
    for pk, *row in rows:
        values = tuple(v.timestamp() if i in times and v is not None else v for i, v in enumerate(row))
        key = values[key_of]
        if key in readings:
            stored[key] = values[len(table.keys):]
        else:
            gone.add(pk)
    width = len(table.keys)
    if not table.upsert:
        return {key for key, row in readings.items() if key in stored and stored[key] != row[width:]}, gone
    return {key for key, row in readings.items() if stored.get(key) != row[width:]}, gone


def _state_changes_pg(tables: list[tuple[_StateTable, dict[tuple, tuple], Collection[int] | None]],
                      ) -> dict[_StateTable, tuple[set[tuple], set[int]]]:
    """`_state_changes` of several tables in ONE PostgreSQL statement, compared by the database.

    The readings go as one JSON array per table (orjson: a fraction of a millisecond for a batch),
    are joined to the stored rows on their keys, and only the rows that differ come back: none
    while the fleet's health holds. Reading the stored rows out instead cost the collector
    40 ms a batch of 50 hosts (1,600 vGPU rows turned into Python tuples and compared). The
    comparison is the one `_state_changes` makes: field by field, NULL equal to NULL, JSON by
    value, a time by its Unix seconds (as `_vgpu_health_values` gives them).
    """
    parts, params = [], []
    for n, (table, readings, scope) in enumerate(tables):
        parts.append(_state_compare_sql(table, n, scope is not None))
        params.append(orjson.dumps(list(readings.values())).decode())
        if scope is not None:
            params.append(sorted(scope))
    changes: dict[_StateTable, tuple[set[tuple], set[int]]] = {table: (set(), set()) for table, _, _ in tables}
    with connection.cursor() as cursor:
        # The parts' summed cost makes PostgreSQL plan the statement with parallel workers, whose
        # start took ~50 ms of a ~6 ms statement: this transaction (the batch) plans without them.
        cursor.execute("SET LOCAL max_parallel_workers_per_gather TO 0")
        cursor.execute(" UNION ALL ".join(parts), params)
        for n, gone_pk, *key in cursor.fetchall():
            changed, gone = changes[tables[n][0]]
            if gone_pk is None:
                changed.add(tuple(key[:len(tables[n][0].keys)]))
            else:
                gone.add(gone_pk)
    return changes


#: Key columns every part of `_state_changes_pg`'s statement answers (the vGPU rows' two).
_STATE_KEY_WIDTH = 2
#: How a reading's value is read from its JSON array, by model field type: a cast of the text
#: (->>), or None for JSON (->, a JSON null being the column's SQL NULL, as Django stores None).
_STATE_CASTS = {"JSONField": None, "DateTimeField": "::float8", "FloatField": "::float8", "BooleanField": "::boolean",
                "CharField": "", "TextField": ""}


@lru_cache(maxsize=16)
def _state_compare_sql(table: _StateTable, n: int, scoped: bool) -> str:
    """The SELECT of `_state_changes_pg` for one table (the `n`th), answering (n, NULL, *key) for
    a reading that differs from its stored row or has none, and with `scoped` (one parameter
    more: the GPU ids whose rows the readings list in full) (n, pk, NULL, NULL) for a row of
    those GPUs that no reading names. Each reading is a JSON array: key columns, then fields."""
    model = table.model
    names = (*table.keys, *table.fields)
    read, stored = [], []
    for i, name in enumerate(names):
        field_ = model._meta.get_field(name)
        kind = field_.get_internal_type()
        cast = _STATE_CASTS.get(kind, "::bigint")  # the integer fields and the keys
        read.append(f"nullif(x->{i}, 'null'::jsonb) AS {name}" if cast is None else f"(x->>{i}){cast} AS {name}")
        stored.append(f"extract(epoch from s.{field_.column})::float8" if kind == "DateTimeField"
                      else f"s.{field_.column}")
    readings = f"(SELECT {', '.join(read)} FROM jsonb_array_elements(%s::jsonb) AS x) AS r"
    differs = (f"ROW({', '.join(stored[len(table.keys):])}) IS DISTINCT FROM "
               f"ROW({', '.join(f'r.{name}' for name in table.fields)})")
    on = " AND ".join(f"s.{key} = r.{key}" for key in table.keys)
    keys = ", ".join([*(f"r.{key}" for key in table.keys), *["NULL::bigint"] * (_STATE_KEY_WIDTH - len(table.keys))])
    first = table.keys[0]
    if not scoped and not table.upsert:
        return (f"SELECT {n}, NULL::bigint, {keys} FROM {readings} "
                f"JOIN {model._meta.db_table} AS s ON {on} WHERE {differs}")
    if not scoped:
        return (f"SELECT {n}, NULL::bigint, {keys} FROM {readings} "
                f"LEFT JOIN {model._meta.db_table} AS s ON {on} WHERE s.{first} IS NULL OR {differs}")
    # One pass over the scope's rows (an index scan on gpu_id) joined both ways: readings without
    # a row, rows without a reading (gone), and pairs that differ.
    return (f"SELECT {n}, CASE WHEN r.{first} IS NULL THEN s.id END, {keys} FROM {readings} "
            f"FULL JOIN (SELECT * FROM {model._meta.db_table} WHERE gpu_id = ANY(%s::bigint[])) AS s ON {on} "
            f"WHERE r.{first} IS NULL OR s.id IS NULL OR {differs}")


@cache
def _copy_types(model: type, columns: tuple[str, ...]) -> list[str]:
    """The PostgreSQL type of each of `columns` of `model`'s table, as binary COPY sends it."""
    fields = {field.column: field for field in model._meta.concrete_fields}
    return [fields[column].db_type(connection) for column in columns]


def _copy_rows(cursor, table: str, model: type, columns: tuple[str, ...], rows: Iterable[tuple]) -> None:
    """COPY `rows` into `table` (`model`'s columns) in PostgreSQL's binary format: a third of
    the collector's CPU of the text format, and the server reads numbers without parsing them.

    Binary COPY writes the bytes of each value's type: psycopg packs an int beyond a `smallint`
    or `integer` column's range without an error, as its low bytes (text COPY refuses the row).
    Every sample column is filled from a reading the payload bounds (telemetry.payload), and
    telemetry/tests/test_ingest_copy.py holds each column's type to its bounds, so no reading
    can reach a column that cannot hold it."""
    with cursor.copy(f"COPY {table} ({', '.join(columns)}) FROM STDIN (FORMAT BINARY)") as copy:
        copy.set_types(_copy_types(model, columns))
        for row in rows:
            copy.write_row(row)


def _copy_or_insert(tables: list[tuple[type, tuple[str, ...], Collection[tuple]]]) -> list[int]:
    """PostgreSQL: insert each (model, columns, rows), skipping stored keys; return how many were new, per table.

    Samples are new but for a repeated poll (a retried task, an overlapping beat), so the rows are
    first COPied straight into the tables, under a savepoint: half the cost of staging them.
    Where one is stored already, the unique key refuses the COPY, the savepoint undoes it, and
    `_insert_staged` stores the others. COPY passes no execute wrapper, so the read cache is told
    of the write here.
    """
    from psycopg.errors import UniqueViolation

    counts = []
    try:
        with transaction.atomic(), connection.cursor() as cursor:
            for model, columns, rows in tables:
                _copy_rows(cursor, model._meta.db_table, model, columns, rows)
                counts.append(len(rows))
    except UniqueViolation:
        return _insert_staged(tables)
    read_cache.written(connection, [model._meta.db_table for model, _, rows in tables if rows])
    return counts


def _insert_staged(tables: list[tuple[type, tuple[str, ...], Iterable[tuple]]]) -> list[int]:
    """PostgreSQL: insert each (model, columns, rows) skipping stored keys; return how many were new, per table.

    The rows are COPied into temporary tables of this session, then moved into the models'
    tables by ONE statement (per table a `DELETE ... RETURNING` feeding an `INSERT ... ON
    CONFLICT DO NOTHING`) that counts what was stored. COPY costs a third less than binding
    the rows as parameters (even as one array per column), and ON CONFLICT keeps idempotency
    without a pre-read. The staging tables are created once per session, empty themselves at
    commit, and vanish with the transaction that created them if it is rolled back.
    """
    moves, counts = [], []
    with connection.cursor() as cursor:
        # Every call, in one round trip: a flag kept beside the session could outlive the tables
        # (created in a transaction or savepoint that was rolled back).
        cursor.execute("; ".join(
            f"CREATE TEMPORARY TABLE IF NOT EXISTS ingest_{model._meta.db_table} ON COMMIT DELETE ROWS AS "
            f"SELECT {', '.join(columns)} FROM {model._meta.db_table} WITH NO DATA"
            for model, columns, _ in tables))
        for n, (model, columns, rows) in enumerate(tables):
            table, names = model._meta.db_table, ", ".join(columns)
            _copy_rows(cursor, f"ingest_{table}", model, columns, rows)
            moves.append(f"staged_{n} AS (DELETE FROM ingest_{table} RETURNING {names}), stored_{n} AS ("
                         f"INSERT INTO {table} ({names}) SELECT {names} FROM staged_{n} ON CONFLICT DO NOTHING "
                         f"RETURNING 1)")
            counts.append(f"(SELECT count(*) FROM stored_{n})")
        cursor.execute(f"WITH {', '.join(moves)} SELECT {', '.join(counts)}")
        return list(cursor.fetchone())
