"""Hypervisor endpoints of the v1 API, on hosts the inventory owns (fleet.api) but which only
this app may read: hosts/{id}/hypervisor/ (link and last check), its check/ action, and
hosts/{id}/sync/ (read the hypervisor, answer the diff, apply what the admin chose).

Staff only, reading included: a hypervisor's address and credentials' name are
infrastructure, and sync changes the inventory. Network calls happen only in POSTs.
"""

from __future__ import annotations

from django.shortcuts import get_object_or_404
from drf_spectacular.utils import OpenApiResponse, extend_schema
from rest_framework import status
from rest_framework.exceptions import ValidationError
from rest_framework.response import Response
from rest_framework.views import APIView

from config.api.permissions import IsFleetAdmin
from config.api.serializers import DetailSerializer
from fleet.models import Host
from hypervisors import queries, services
from hypervisors.api.serializers import (
    HostHypervisorSerializer,
    SyncAnswerSerializer,
    SyncReportSerializer,
    SyncRequestSerializer,
)
from hypervisors.models import HypervisorStatus, SyncTrigger


class IsHypervisorAdmin(IsFleetAdmin):
    message = "Only fleet admins (staff) may see or use hosts' hypervisor links."


def host_hypervisor_data(host: Host) -> dict:
    status_row = HypervisorStatus.objects.filter(host=host).first()
    return {
        "host": host.pk, "linked": bool(host.hypervisor_uri), "uri": host.hypervisor_uri,
        "secret_ref": host.hypervisor_secret_ref,
        "status": None if status_row is None else {
            "checked_at": status_row.checked_at, "ok": status_row.ok, "message": status_row.message,
            "hypervisor_version": status_row.hypervisor_version, "hostname": status_row.hostname,
            "uri": status_row.uri,
        },
    }


class HostHypervisorView(APIView):
    """A host's hypervisor link (URI, the secret's reference name) and its last connection check."""

    permission_classes = [IsHypervisorAdmin]

    @extend_schema(responses=HostHypervisorSerializer)
    def get(self, request, pk: int):
        return Response(host_hypervisor_data(get_object_or_404(Host, pk=pk)))


class HostHypervisorCheckView(APIView):
    """Reach the host's hypervisor now and keep the answer."""

    permission_classes = [IsHypervisorAdmin]

    @extend_schema(request=None, responses=HostHypervisorSerializer)
    def post(self, request, pk: int):
        host = get_object_or_404(Host, pk=pk)
        services.check_host(host)
        return Response(host_hypervisor_data(host))


class HostSyncView(APIView):
    """GET: the last diff of the host's hypervisor against the inventory. POST: read the
    hypervisor now and answer the diff; with {"apply": "all"} or {"apply": [uuid, ...]} also
    apply those entries (new VMs created, vCPUs, RAM and device ids updated; never deletes)."""

    permission_classes = [IsHypervisorAdmin]

    @extend_schema(responses={200: SyncReportSerializer,
                              404: OpenApiResponse(DetailSerializer, description="never synced")})
    def get(self, request, pk: int):
        host = get_object_or_404(Host, pk=pk)
        report = queries.last_report(host)
        if report is None:
            return Response({"detail": f"{host.name} was never synced with its hypervisor: POST to this address."},
                            status=status.HTTP_404_NOT_FOUND)
        return Response(SyncReportSerializer(report).data)

    @extend_schema(request=SyncRequestSerializer, responses={
        200: SyncAnswerSerializer, 400: OpenApiResponse(description="field messages (apply)"),
        409: OpenApiResponse(DetailSerializer, description="the host is not linked to a hypervisor"),
        502: OpenApiResponse(SyncAnswerSerializer, description="the hypervisor could not be read")})
    def post(self, request, pk: int):
        host = get_object_or_404(Host, pk=pk)
        parsed = SyncRequestSerializer(data=request.data if isinstance(request.data, dict) else {"apply": None})
        parsed.is_valid(raise_exception=True)
        choice = parsed.validated_data["apply"]
        if not host.hypervisor_uri:
            return Response({"detail": f"{host.name} has no hypervisor URI: link it first."},
                            status=status.HTTP_409_CONFLICT)
        try:
            report, applied = services.sync_and_apply(host, choice, user=request.user, trigger=SyncTrigger.API)
        except services.UnknownEntries as exc:
            raise ValidationError({"apply": [str(exc)]}) from exc
        code = status.HTTP_200_OK if report.ok else status.HTTP_502_BAD_GATEWAY
        return Response({"report": SyncReportSerializer(report).data, "applied": applied}, status=code)
