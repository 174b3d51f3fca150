"""Viewsets of the v1 inventory API: thin layers over `fleet.queries` (what a user may see),
`fleet.filtersets` (filters) and the serializers (which hand rule-governed writes to
`fleet.services`)."""

from collections.abc import Callable

from django.db import IntegrityError, transaction
from django.db.models import ProtectedError, QuerySet
from drf_spectacular.utils import OpenApiResponse, extend_schema, extend_schema_view
from rest_framework import mixins, status, viewsets
from rest_framework.exceptions import ValidationError
from rest_framework.response import Response

from config.api.caching import CachedListMixin
from config.api.exceptions import Conflict, in_use_message, refusal_body
from config.api.permissions import IsFleetAdminOrReadOnly
from config.api.serializers import DetailSerializer, InvalidOrRefusedSerializer, PlacementErrorSerializer
from config.errors import ConflictRefusal, Refusal
from fleet import audit, filtersets, queries, services
from fleet.api import serializers

RULE_REFUSED = OpenApiResponse(
    InvalidOrRefusedSerializer,
    description="Invalid input (field messages), or a placement rule refused the change (`detail` and "
                "`violations`, each naming its `rule`)",
)
FLEET_CHANGED = OpenApiResponse(
    PlacementErrorSerializer,
    description="The fleet changed under the request (e.g. another request took the last slot); try again",
)
IN_USE = OpenApiResponse(
    DetailSerializer, description="Still referred to by other objects (e.g. a host that has GPUs)",
)


class FleetViewSetMixin(CachedListMixin):
    """Common behaviour: role-scoped querysets, staff-only writes, filters, stable ordering, and
    responses to writes rendered from a fresh read (so annotated figures are current)."""

    permission_classes = [IsFleetAdminOrReadOnly]
    #: `fleet.queries` function returning the rows a user may see.
    scoped_queryset: Callable[..., QuerySet]

    def get_queryset(self) -> QuerySet:
        if getattr(self, "swagger_fake_view", False):  # schema generation: no real user
            return self.serializer_class.Meta.model.objects.none()
        # Looked up on the class: a plain function stored there, not a method of the viewset.
        return type(self).scoped_queryset(self.request.user)

    #: A POST of a JSON list creates every object or none (`create`); off unless a resource says so.
    bulk_create = False

    def create(self, request, *args, **kwargs):
        if self.bulk_create and isinstance(request.data, list):
            return self._create_many(request.data)
        return super().create(request, *args, **kwargs)

    def _create_many(self, items: list) -> Response:
        """Create each item as a single POST would (its serializer, `perform_create`, so
        `fleet.services` and the audit log), in one transaction. On any error nothing is written:
        400 (409 where the fleet changed under one) with a list of the items' errors by position,
        `{}` for an item that was fine."""
        if not items or len(items) > MAX_BULK_ITEMS:
            raise ValidationError({"non_field_errors": [
                f"A list body creates 1 to {MAX_BULK_ITEMS} objects; this one has {len(items)}."]})
        errors: list[dict] = [{} for _ in items]
        created, conflict = [], False
        with transaction.atomic():
            for index, item in enumerate(items):
                serializer = self.get_serializer(data=item)
                if not serializer.is_valid():
                    errors[index] = serializer.errors
                    continue
                try:
                    # A savepoint per item: a refused one leaves the transaction usable for the rest.
                    with transaction.atomic():
                        self.perform_create(serializer)
                except Refusal as exc:
                    errors[index] = refusal_body(exc)
                    conflict = conflict or isinstance(exc, ConflictRefusal)
                    continue
                except IntegrityError:
                    errors[index] = {"non_field_errors": [
                        "Conflicts with another object of this list or of the inventory (a name or PCI bus id "
                        "given twice)."]}
                    continue
                created.append(serializer.data)
            if any(errors):
                transaction.set_rollback(True)
        if any(errors):
            return Response(errors, status=status.HTTP_409_CONFLICT if conflict else status.HTTP_400_BAD_REQUEST)
        return Response(created, status=status.HTTP_201_CREATED)

    def _reload(self, serializer) -> None:
        serializer.instance = self.get_queryset().get(pk=serializer.instance.pk)

    # Rows saved through fleet.services are saved outside any transaction of the view's: the
    # service reads what the change rests on before its own transaction and its row locks, so
    # what changed while it waited for them is told apart (409) from a refused change (400).

    def perform_create(self, serializer) -> None:
        if audit.object_type_of(serializer.Meta.model) in CREATED_BY_SERVICES:
            serializer.save()
        else:
            with transaction.atomic():
                serializer.save()
                kind = audit.object_type_of(serializer.instance)
                audit.record(f"{kind}.create", serializer.instance, after=audit.snapshot(serializer.instance),
                             object_type=kind)
        self._reload(serializer)

    def perform_update(self, serializer) -> None:
        if audit.object_type_of(serializer.instance) in UPDATED_BY_SERVICES:
            serializer.save()
        else:
            with transaction.atomic():
                before = audit.snapshot(serializer.instance)
                serializer.save()
                after = audit.snapshot(serializer.instance)
                if audit.changed(before, after):
                    kind = audit.object_type_of(serializer.instance)
                    audit.record(f"{kind}.update", serializer.instance, before=before, after=after, object_type=kind)
        self._reload(serializer)

    def perform_destroy(self, instance) -> None:
        before, pk, name = audit.snapshot(instance), instance.pk, str(instance)
        kind = audit.object_type_of(instance)
        try:
            if kind in DELETED_BY_SERVICES:
                services.delete_inventory([instance])
            else:
                with transaction.atomic():
                    instance.delete()
                    audit.record(f"{kind}.delete", before=before, object_type=kind, object_id=pk, object_repr=name)
        except ProtectedError as exc:
            raise Conflict(in_use_message(exc, instance)) from exc


#: Objects one POST of a list body may create.
MAX_BULK_ITEMS = 500
#: Saved through fleet.services, which records the change itself (the serializers' create/update).
CREATED_BY_SERVICES = frozenset({"host", "gpu", "vgpu"})
UPDATED_BY_SERVICES = frozenset({"host", "gpu", "vm"})
#: Deleted through `services.delete_inventory`, which locks them in lock order first.
DELETED_BY_SERVICES = frozenset({"host", "gpu", "vm"})


class FleetViewSet(FleetViewSetMixin, viewsets.ModelViewSet):
    """A full read-write resource (writes for staff only)."""


@extend_schema_view(destroy=extend_schema(responses={204: None, 409: IN_USE}))
class GpuModelViewSet(FleetViewSet):
    """GPU models (boards) and their frame buffer; readable by everyone signed in."""

    scoped_queryset = queries.gpu_models_for
    serializer_class = serializers.GpuModelSerializer
    filterset_class = filtersets.GpuModelFilterSet
    ordering_fields = ["id", "name", "code", "fb_mib"]


@extend_schema_view(destroy=extend_schema(responses={204: None, 409: IN_USE}))
class VgpuProfileViewSet(FleetViewSet):
    """vGPU profiles of each GPU model with their maximum counts; readable by everyone signed in."""

    scoped_queryset = queries.vgpu_profiles_for
    serializer_class = serializers.VgpuProfileSerializer
    filterset_class = filtersets.VgpuProfileFilterSet
    ordering_fields = ["id", "name", "gpu_model", "series", "fb_mib", "max_per_gpu"]


_capacity_refused = {400: RULE_REFUSED}
#: An update re-checks under the row's lock: what changed while it waited for it is a 409.
_capacity_refused_or_changed = {400: RULE_REFUSED, 409: FLEET_CHANGED}


@extend_schema_view(
    create=extend_schema(responses={201: serializers.HostSerializer, **_capacity_refused}),
    update=extend_schema(responses={200: serializers.HostSerializer, **_capacity_refused_or_changed}),
    partial_update=extend_schema(responses={200: serializers.HostSerializer, **_capacity_refused_or_changed}),
    destroy=extend_schema(responses={204: None, 409: IN_USE}),
)
class HostViewSet(FleetViewSet):
    """Hosts with the vCPUs and RAM their VMs claim; an artist sees the hosts of their own VMs."""

    scoped_queryset = queries.hosts_for
    serializer_class = serializers.HostSerializer
    filterset_class = filtersets.HostFilterSet
    ordering_fields = ["id", "name", "hypervisor", "cpu_threads", "ram_gib", "allocated_vcpus",
                       "allocated_ram_gib", "gpu_count"]


#: A list body: documented in words (the schema shows the single object's body).
BULK_CREATE = (f"A JSON list of such objects (at most {MAX_BULK_ITEMS}) creates them all in one transaction, "
               "or none: 201 with the list created; on any error 400 (409 where the fleet changed under one) "
               "with a list of each item's errors by position, `{}` for an item that was fine.")


@extend_schema_view(
    create=extend_schema(description=f"Add a GPU to a host. {BULK_CREATE}",
                         responses={201: serializers.GpuSerializer, **_capacity_refused}),
    update=extend_schema(responses={200: serializers.GpuSerializer, **_capacity_refused_or_changed}),
    partial_update=extend_schema(responses={200: serializers.GpuSerializer, **_capacity_refused_or_changed}),
    destroy=extend_schema(responses={204: None, 409: IN_USE}),
)
class GpuViewSet(FleetViewSet):
    """Physical GPUs with the frame buffer their vGPUs take; `?uuid=` finds one by NVML UUID. An
    artist sees the GPUs that hold their own VMs' vGPUs. Served at /api/v1/gpus/ by
    `telemetry.api.gpus.GpuViewSet`, whose detail adds the newest reading (`latest`)."""

    scoped_queryset = queries.gpus_for
    serializer_class = serializers.GpuSerializer
    bulk_create = True
    filterset_class = filtersets.GpuFilterSet
    ordering_fields = ["id", "host", "pci_bus_id", "uuid", "gpu_model", "mode", "size_mode", "used_fb_mib",
                       "vgpu_count"]


class ArtistViewSet(FleetViewSet):
    """Artists; an artist sees only their own record."""

    scoped_queryset = queries.artists_for
    serializer_class = serializers.ArtistSerializer
    filterset_class = filtersets.ArtistFilterSet
    ordering_fields = ["id", "name", "workflow", "user_type"]


@extend_schema_view(
    create=extend_schema(description=f"Add a virtual workstation (placed nowhere until its first vGPU). {BULK_CREATE}",
                         responses={201: serializers.VirtualMachineSerializer, 400: RULE_REFUSED}),
    update=extend_schema(responses={200: serializers.VirtualMachineSerializer, **_capacity_refused_or_changed}),
    partial_update=extend_schema(responses={200: serializers.VirtualMachineSerializer,
                                            **_capacity_refused_or_changed}),
    destroy=extend_schema(responses={204: None, 409: FLEET_CHANGED}),
)
class VirtualMachineViewSet(FleetViewSet):
    """Virtual workstations with their vGPUs; an artist sees only their own. A VM's host is set
    by placing its first vGPU."""

    scoped_queryset = queries.vms_for
    serializer_class = serializers.VirtualMachineSerializer
    bulk_create = True
    filterset_class = filtersets.VirtualMachineFilterSet
    ordering_fields = ["id", "name", "vcpus", "ram_gib", "host", "artist"]


@extend_schema_view(
    create=extend_schema(
        summary="Place a vGPU",
        description="Places a vGPU of `profile` on `gpu` for `vm` if the placement rules allow it; the "
                    "VM moves to the GPU's host with its first vGPU.",
        responses={201: serializers.VgpuSerializer, 400: RULE_REFUSED, 409: FLEET_CHANGED},
    ),
    destroy=extend_schema(
        summary="Remove a vGPU",
        description="A VM left without vGPUs leaves its host.",
        responses={204: None, 409: FLEET_CHANGED},
    ),
)
class VgpuViewSet(FleetViewSetMixin, mixins.CreateModelMixin, mixins.RetrieveModelMixin,
                  mixins.DestroyModelMixin, mixins.ListModelMixin, viewsets.GenericViewSet):
    """vGPUs, created and removed only through placement (no PUT or PATCH, 405: remove and place
    again). An artist sees the vGPUs of their own VMs."""

    scoped_queryset = queries.vgpus_for
    serializer_class = serializers.VgpuSerializer
    filterset_class = filtersets.VgpuFilterSet
    ordering_fields = ["id", "vm", "gpu", "profile", "placement_id"]

    def perform_destroy(self, instance) -> None:
        services.remove_vgpu(instance)
