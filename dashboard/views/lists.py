"""List pages of the inventory (hosts, GPUs, VMs, artists): staff only, filtered by the API's
FilterSets, searchable, sortable, 50 rows a page and exportable as CSV (`dashboard.listing`); the
columns, their orderings and the export are each page's table in `dashboard.tables`.

Rows come from `fleet.queries.*_for(user)`, which load every column's figures (allocated vCPUs
and RAM, frame buffer taken by vGPUs, vGPUs with their profiles) in a fixed number of queries;
the GPU list adds the latest utilization and temperature of the page's GPUs in one more.
"""

from __future__ import annotations

from datetime import timedelta

from django.conf import settings
from django.db.models import Count, QuerySet
from django.urls import reverse
from django.utils import timezone

from dashboard import tables
from dashboard.listing import TableListView
from fleet import filtersets, queries
from telemetry.queries import latest_gpu_samples

#: A GPU's frame buffer share from which its bar turns to the "high" colour.
FB_HIGH_PCT = 90



class FleetListView(TableListView):
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

    table_class = tables.HostTable
    filterset_class = filtersets.HostFilterSet
    template_name = "fleet/host_list.html"
    title = "Hosts"
    noun = "hosts"
    csv_name = "hosts"
    empty_title = "No hosts yet"
    add_url_name = "admin:fleet_host_add"
    add_label = "Add host"
    filter_fields = ("q", "hypervisor")

    def get_queryset(self) -> QuerySet:
        # Agents come by their reverse relation: one query a page, ordered by their Meta (name).
        return queries.hosts_for(self.request.user).prefetch_related("agents")


class GpuListView(FleetListView):
    """GPUs with the frame buffer their vGPUs take and their latest utilization and temperature."""

    table_class = tables.GpuTable
    filterset_class = filtersets.GpuFilterSet
    template_name = "fleet/gpu_list.html"
    title = "GPUs"
    noun = "GPUs"
    csv_name = "gpus"
    empty_title = "No GPUs yet"
    add_url_name = "admin:fleet_gpu_add"
    add_label = "Add GPU"
    filter_fields = ("q", "host", "gpu_model", "mode", "size_mode")

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

    table_class = tables.VirtualMachineTable
    filterset_class = filtersets.VirtualMachineFilterSet
    template_name = "fleet/vm_list.html"
    title = "VMs"
    noun = "VMs"
    csv_name = "vms"
    empty_title = "No VMs yet"
    add_url_name = "admin:fleet_virtualmachine_add"
    add_label = "Add VM"
    filter_fields = ("q", "host", "artist", "unplaced")

    def get_queryset(self) -> QuerySet:
        return queries.vms_for(self.request.user)

    def decorate(self, rows: list) -> None:
        for vm in rows:
            vm.vgpu_fb_mib = sum(vgpu.profile.fb_mib for vgpu in vm.vgpus.all())


class ArtistListView(FleetListView):
    """Artists with their user account, workflow, load class and number of VMs."""

    table_class = tables.ArtistTable
    filterset_class = filtersets.ArtistFilterSet
    template_name = "fleet/artist_list.html"
    title = "Artists"
    noun = "artists"
    csv_name = "artists"
    empty_title = "No artists yet"
    add_url_name = "admin:fleet_artist_add"
    add_label = "Add artist"
    filter_fields = ("q", "workflow", "user_type")

    def get_queryset(self) -> QuerySet:
        # One multi-valued join only, so the count is not multiplied by another.
        return queries.artists_for(self.request.user).annotate(vm_count=Count("vms"))
