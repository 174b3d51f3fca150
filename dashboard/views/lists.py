"""List pages of the inventory (hosts, GPUs, VMs, artists): staff only, filtered by the API's
FilterSets, searchable, sortable, 50 rows a page and exportable as CSV (`dashboard.listing`).

Rows come from `fleet.queries.*_for(user)`, which load every column's figures (allocated vCPUs
and RAM, frame buffer taken by vGPUs, vGPUs with their profiles) in a fixed number of queries;
the GPU list adds the latest utilization and temperature of the page's GPUs in one more.
"""

from __future__ import annotations

from datetime import UTC, timedelta

from django.conf import settings
from django.db.models import Count, QuerySet
from django.urls import reverse
from django.utils import timezone

from dashboard.listing import Column, CsvColumn, FilteredListView
from fleet import filtersets, queries
from telemetry.queries import latest_gpu_samples

#: A GPU's frame buffer share from which its bar turns to the "high" colour.
FB_HIGH_PCT = 90


def _iso(moment) -> str | None:
    return moment.astimezone(UTC).isoformat() if moment else None


class FleetListView(FilteredListView):
    """A fleet list: its empty state points to where the first row of its kind comes from."""

    title = ""
    empty_title = "Nothing here yet"
    #: Admin site URL name of the "add" form of the listed model.
    add_url_name = ""
    add_label = ""

    def get_extra_context(self) -> dict:
        return {
            "title": self.title,
            "empty_title": self.empty_title,
            "empty_message": "Add the first one on the admin site, or run `manage.py seed_demo` to load the demo "
                             "studio's fleet.",
            "empty_action_url": reverse(self.add_url_name),
            "empty_action_label": self.add_label,
        }


class HostListView(FleetListView):
    """Hosts with the vCPUs and RAM their VMs claim, their GPUs and the status of their agents."""

    filterset_class = filtersets.HostFilterSet
    template_name = "fleet/host_list.html"
    title = "Hosts"
    noun = "hosts"
    csv_name = "hosts"
    empty_title = "No hosts yet"
    add_url_name = "admin:fleet_host_add"
    add_label = "Add host"
    filter_fields = ("q", "hypervisor")
    columns = (
        Column("Host", "name"),
        Column("Hypervisor", "hypervisor"),
        Column("GPUs", "gpu_count", num=True),
        Column("vCPUs allocated / threads", "allocated_vcpus", num=True,
               title="vCPUs the host's VMs claim, against its hardware threads"),
        Column("RAM allocated / total", "allocated_ram_gib", num=True,
               title="GiB the host's VMs claim, against the RAM available to VMs"),
        Column("Agents", title="Sources of the host's samples and their status"),
    )
    orderings = {
        "name": ("name",),
        "hypervisor": ("hypervisor", "name"),
        "gpu_count": ("gpu_count",),
        "allocated_vcpus": ("allocated_vcpus",),
        "cpu_threads": ("cpu_threads",),
        "allocated_ram_gib": ("allocated_ram_gib",),
        "ram_gib": ("ram_gib",),
    }
    csv_columns = (
        CsvColumn("name", lambda host: host.name),
        CsvColumn("hypervisor", lambda host: host.hypervisor),
        CsvColumn("gpus", lambda host: host.gpu_count),
        CsvColumn("vcpus_allocated", lambda host: host.allocated_vcpus),
        CsvColumn("cpu_threads", lambda host: host.cpu_threads),
        CsvColumn("ram_allocated_gib", lambda host: host.allocated_ram_gib),
        CsvColumn("ram_gib", lambda host: host.ram_gib),
        CsvColumn("agents", lambda host: "; ".join(f"{agent.name} ({agent.status})" for agent in host.agents.all())),
    )

    def get_queryset(self) -> QuerySet:
        # Agents come by their reverse relation: one query a page, ordered by their Meta (name).
        return queries.hosts_for(self.request.user).prefetch_related("agents")


class GpuListView(FleetListView):
    """GPUs with the frame buffer their vGPUs take and their latest utilization and temperature."""

    filterset_class = filtersets.GpuFilterSet
    template_name = "fleet/gpu_list.html"
    title = "GPUs"
    noun = "GPUs"
    csv_name = "gpus"
    empty_title = "No GPUs yet"
    add_url_name = "admin:fleet_gpu_add"
    add_label = "Add GPU"
    filter_fields = ("q", "host", "gpu_model", "mode", "size_mode")
    columns = (
        Column("Host", "host"),
        Column("PCI bus id", "pci_bus_id"),
        Column("Model", "gpu_model"),
        Column("Mode", "mode"),
        Column("Size mode", "size_mode"),
        Column("Frame buffer allocated / physical", "used_fb_mib", num=True,
               title="MiB of the vGPUs' profiles, against the GPU's frame buffer"),
        Column("vGPUs", "vgpu_count", num=True),
        Column("Utilization", num=True, title="GPU utilization, %, of the newest sample"),
        Column("Temperature", num=True, title="°C, of the newest sample"),
    )
    orderings = {
        "host": ("host__name", "pci_bus_id"),
        "pci_bus_id": ("pci_bus_id", "host__name"),
        "gpu_model": ("gpu_model__name", "host__name", "pci_bus_id"),
        "mode": ("mode", "host__name", "pci_bus_id"),
        "size_mode": ("size_mode", "host__name", "pci_bus_id"),
        "used_fb_mib": ("used_fb_mib",),
        "vgpu_count": ("vgpu_count",),
    }
    default_ordering = "host"
    csv_columns = (
        CsvColumn("host", lambda gpu: gpu.host.name),
        CsvColumn("pci_bus_id", lambda gpu: gpu.pci_bus_id),
        CsvColumn("uuid", lambda gpu: gpu.uuid),
        CsvColumn("model", lambda gpu: gpu.gpu_model.name),
        CsvColumn("mode", lambda gpu: gpu.mode),
        CsvColumn("size_mode", lambda gpu: gpu.size_mode),
        CsvColumn("fb_allocated_mib", lambda gpu: gpu.used_fb_mib),
        CsvColumn("fb_physical_mib", lambda gpu: gpu.gpu_model.fb_mib),
        CsvColumn("vgpus", lambda gpu: gpu.vgpu_count),
        CsvColumn("util_gpu_pct", lambda gpu: (gpu.latest or {}).get("util_gpu")),
        CsvColumn("temp_c", lambda gpu: (gpu.latest or {}).get("temp_c")),
        CsvColumn("sampled_at_utc", lambda gpu: _iso((gpu.latest or {}).get("ts"))),
    )

    def get_queryset(self) -> QuerySet:
        return queries.gpus_for(self.request.user)

    def decorate(self, rows: list) -> None:
        """The newest sample of each GPU (one query), and the frame buffer share for the bar. A
        sample older than TELEMETRY_STALE_AFTER_S is shown, but marked as old."""
        samples = latest_gpu_samples([gpu.pk for gpu in rows]) if rows else {}
        fresh_since = timezone.now() - timedelta(seconds=settings.TELEMETRY_STALE_AFTER_S)
        for gpu in rows:
            gpu.latest = samples.get(gpu.pk)
            gpu.latest_is_old = bool(gpu.latest) and gpu.latest["ts"] < fresh_since
            physical_mib = gpu.gpu_model.fb_mib
            gpu.fb_pct = min(100, round(100 * gpu.used_fb_mib / physical_mib)) if physical_mib else 0
            gpu.fb_high = gpu.fb_pct >= FB_HIGH_PCT


class VmListView(FleetListView):
    """VMs with their artist, host, vGPU profiles, vCPUs and RAM."""

    filterset_class = filtersets.VirtualMachineFilterSet
    template_name = "fleet/vm_list.html"
    title = "VMs"
    noun = "VMs"
    csv_name = "vms"
    empty_title = "No VMs yet"
    add_url_name = "admin:fleet_virtualmachine_add"
    add_label = "Add VM"
    filter_fields = ("q", "host", "artist", "unplaced")
    columns = (
        Column("VM", "name"),
        Column("Artist", "artist"),
        Column("Host", "host"),
        Column("vGPU profiles", title="Profiles of the VM's vGPUs, with their frame buffer"),
        Column("vCPUs", "vcpus", num=True),
        Column("RAM", "ram_gib", num=True, title="GiB"),
    )
    orderings = {
        "name": ("name",),
        "artist": ("artist__name", "name"),
        "host": ("host__name", "name"),
        "vcpus": ("vcpus",),
        "ram_gib": ("ram_gib",),
    }
    csv_columns = (
        CsvColumn("name", lambda vm: vm.name),
        CsvColumn("uuid", lambda vm: str(vm.uuid)),
        CsvColumn("artist", lambda vm: vm.artist.name if vm.artist else None),
        CsvColumn("host", lambda vm: vm.host.name if vm.host else None),
        CsvColumn("profiles", lambda vm: "; ".join(vgpu.profile.name for vgpu in vm.vgpus.all())),
        CsvColumn("vgpu_fb_mib", lambda vm: vm.vgpu_fb_mib),
        CsvColumn("vcpus", lambda vm: vm.vcpus),
        CsvColumn("ram_gib", lambda vm: vm.ram_gib),
    )

    def get_queryset(self) -> QuerySet:
        return queries.vms_for(self.request.user)

    def decorate(self, rows: list) -> None:
        for vm in rows:
            vm.vgpu_fb_mib = sum(vgpu.profile.fb_mib for vgpu in vm.vgpus.all())


class ArtistListView(FleetListView):
    """Artists with their user account, workflow, load class and number of VMs."""

    filterset_class = filtersets.ArtistFilterSet
    template_name = "fleet/artist_list.html"
    title = "Artists"
    noun = "artists"
    csv_name = "artists"
    empty_title = "No artists yet"
    add_url_name = "admin:fleet_artist_add"
    add_label = "Add artist"
    filter_fields = ("q", "workflow", "user_type")
    columns = (
        Column("Artist", "name"),
        Column("User", "user"),
        Column("Workflow", "workflow"),
        Column("User type", "user_type"),
        Column("VMs", "vm_count", num=True),
    )
    orderings = {
        "name": ("name",),
        "user": ("user__username", "name"),
        "workflow": ("workflow", "name"),
        "user_type": ("user_type", "name"),
        "vm_count": ("vm_count", "name"),
    }
    csv_columns = (
        CsvColumn("name", lambda artist: artist.name),
        CsvColumn("username", lambda artist: artist.user.username if artist.user else None),
        CsvColumn("workflow", lambda artist: artist.workflow),
        CsvColumn("user_type", lambda artist: artist.user_type),
        CsvColumn("vms", lambda artist: artist.vm_count),
    )

    def get_queryset(self) -> QuerySet:
        # One multi-valued join only, so the count is not multiplied by another.
        return queries.artists_for(self.request.user).annotate(vm_count=Count("vms"))
