"""Reads of the hypervisors app for pages and the API: stored rows only, never the network."""

from __future__ import annotations

from dataclasses import dataclass

from django.db.models import Prefetch, QuerySet

from fleet.models import Host
from fleet.queries import visible_vms
from hypervisors.models import ACTIVE, HypervisorStatus, Operation, OperationStep, SyncReport


def operations_for(user) -> QuerySet[Operation]:
    """Operations `user` may see: all for staff, those of their own VMs for an artist; with what
    a list shows, in a fixed number of queries."""
    return (Operation.objects.filter(vm__in=visible_vms(user))
            .select_related("vm", "host", "target_host", "created_by", "request")
            .prefetch_related(Prefetch("steps", queryset=OperationStep.objects.order_by("index"))))


def active_operation_of(vm_id: int) -> Operation | None:
    """The VM's operation under way (pending or running), if any."""
    return Operation.objects.filter(vm_id=vm_id, status__in=ACTIVE).order_by("-pk").first()


@dataclass(frozen=True)
class HostHypervisor:
    """What the host page shows of its hypervisor: the link, the last check and the last diff."""

    uri: str
    secret_ref: str
    status: HypervisorStatus | None
    report: SyncReport | None

    @property
    def linked(self) -> bool:
        return bool(self.uri)


def host_hypervisor(host: Host) -> HostHypervisor:
    """Two queries: the host's status row and its newest sync report."""
    return HostHypervisor(
        uri=host.hypervisor_uri, secret_ref=host.hypervisor_secret_ref,
        status=HypervisorStatus.objects.filter(host=host).first(),
        report=last_report(host),
    )


def last_report(host: Host) -> SyncReport | None:
    """The host's newest sync report, or None when it was never synced."""
    return SyncReport.objects.filter(host=host).select_related("requested_by").order_by("-created_at", "-id").first()
