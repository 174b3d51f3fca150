"""Reads of the hypervisors app shared by the API and the pages."""

from __future__ import annotations

from django.db.models import Prefetch, QuerySet

from fleet.queries import visible_vms
from hypervisors.models import ACTIVE, Operation, OperationStep


def operations_for(user) -> QuerySet[Operation]:
    """Operations `user` may see: all for staff, those of their own VMs for an artist; with what
    a list shows, in a fixed number of queries."""
    return (Operation.objects.filter(vm__in=visible_vms(user))
            .select_related("vm", "host", "target_host", "created_by", "request")
            .prefetch_related(Prefetch("steps", queryset=OperationStep.objects.order_by("index"))))


def active_operation_of(vm_id: int) -> Operation | None:
    """The VM's operation under way (pending or running), if any."""
    return Operation.objects.filter(vm_id=vm_id, status__in=ACTIVE).order_by("-pk").first()
