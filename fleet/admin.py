"""Admin site of the fleet inventory.

Writes that the placement rules govern go through `fleet.forms` and `fleet.services`, exactly
as the API's do: a vGPU is added by `services.place_vgpu` and removed by
`services.remove_vgpu`, GPUs, hosts and VMs are saved by `update_gpu`, `update_host` and
`update_vm`. A refusal is shown on the form as the rule's own sentence. vGPUs cannot be
edited once placed (a resize is its own workflow). Changelists load what their columns show
with a fixed number of queries, however many rows they list. API tokens are issued and revoked
through `fleet.api_tokens`; a new token's key is shown once.
"""

from __future__ import annotations

from axes import admin as _axes_admin  # noqa: F401 - registers axes' admins first
from axes.models import AccessAttempt, AccessFailureLog, AccessLog
from django.contrib import admin, messages
from django.db import transaction
from django.db.models import Count, IntegerField, OuterRef, Prefetch, Subquery, Sum
from django.db.models.functions import Coalesce
from django.template.defaultfilters import pluralize
from django.template.response import TemplateResponse
from django.urls import reverse
from django.utils.cache import add_never_cache_headers
from django.utils.html import format_html

from config.admin_input import SafeInputAdminMixin, guard_registered
from fleet import api_tokens, placement, services
from fleet.admin_audit import AuditedAdmin
from fleet.choices import TokenState
from fleet.forms import (
    ApiTokenForm,
    GpuForm,
    GpuModelForm,
    HostForm,
    VgpuPlacementForm,
    VgpuProfileForm,
    VirtualMachineForm,
)
from fleet.models import ApiToken, Artist, Gpu, GpuModel, Host, Vgpu, VgpuProfile, VirtualMachine

REFUSAL_ATTR = "_fleet_save_refusal"
ISSUED_KEY_ATTR = "_fleet_issued_api_key"


def per_parent(model, fk: str, aggregate) -> Coalesce:
    """A correlated subquery aggregating `model` rows per parent row, 0 when there are none.

    Subqueries rather than joins: two joined aggregates (a host's GPUs and its VMs) would
    multiply each other's rows.
    """
    rows = model.objects.filter(**{fk: OuterRef("pk")}).order_by().values(fk).annotate(value=aggregate)
    return Coalesce(Subquery(rows.values("value")), 0, output_field=IntegerField())


class SaveRefused(Exception):
    """A service refused a save that the form had accepted: the fleet changed in between."""

    def __init__(self, messages: list[str]):
        self.messages = messages
        super().__init__("; ".join(messages))


class RuleGovernedAdmin(SafeInputAdminMixin, admin.ModelAdmin):
    """An admin whose form saves through a service (the form's `save()` returns None when refused).

    The service records the save; hosts, GPUs and VMs are deleted (and the deletion recorded) by
    `services.delete_inventory`, vGPUs by `services.remove_vgpus`, each locking the rows in
    `fleet.locks`' order first.

    A refusal at save time rolls back the admin's transaction and renders the form again with
    the rule's message, as a refusal at validation time does.
    """

    def save_model(self, request, obj, form, change):
        if form.save() is None:
            raise SaveRefused([str(error) for error in form.non_field_errors()])

    def delete_model(self, request, obj):
        services.delete_inventory([obj])

    def delete_queryset(self, request, queryset):
        services.delete_inventory(queryset)

    def get_form(self, request, obj=None, change=False, **kwargs):
        form_class = super().get_form(request, obj, change, **kwargs)
        refusal = getattr(request, REFUSAL_ATTR, None)
        if not refusal:
            return form_class

        class RefusedForm(form_class):
            def clean(self):
                cleaned = super().clean()
                shown = set(self.non_field_errors())
                for message in refusal:
                    if message not in shown:
                        self.add_error(None, message)
                return cleaned

        RefusedForm.__name__ = form_class.__name__
        return RefusedForm

    def changeform_view(self, request, object_id=None, form_url="", extra_context=None):
        try:
            return super().changeform_view(request, object_id, form_url, extra_context)
        except SaveRefused as refused:
            # The first attempt's transaction has rolled back; this one only renders the form.
            setattr(request, REFUSAL_ATTR, refused.messages)
            return super().changeform_view(request, object_id, form_url, extra_context)


class CatalogAdmin(AuditedAdmin):
    """NVIDIA's tables ship with the product (migration fleet 0002); only superusers edit them."""

    change_list_template = "admin/fleet/catalog_change_list.html"
    change_form_template = "admin/fleet/catalog_change_form.html"

    def has_add_permission(self, request):
        return request.user.is_superuser

    def has_change_permission(self, request, obj=None):
        return request.user.is_superuser

    def has_delete_permission(self, request, obj=None):
        return request.user.is_superuser


@admin.register(GpuModel)
class GpuModelAdmin(CatalogAdmin):
    form = GpuModelForm
    list_display = ["name", "code", "fb_mib", "gpus_per_board", "mixed_size_capable", "multi_vgpu_full_only",
                    "profile_count", "gpu_count"]
    list_filter = ["mixed_size_capable", "multi_vgpu_full_only", "gpus_per_board"]
    search_fields = ["name", "code"]

    def get_queryset(self, request):
        return super().get_queryset(request).annotate(
            profile_count=per_parent(VgpuProfile, "gpu_model", Count("pk")),
            gpu_count=per_parent(Gpu, "gpu_model", Count("pk")),
        )

    @admin.display(description="profiles", ordering="profile_count")
    def profile_count(self, obj):
        return obj.profile_count

    @admin.display(description="GPUs in fleet", ordering="gpu_count")
    def gpu_count(self, obj):
        return obj.gpu_count


@admin.register(VgpuProfile)
class VgpuProfileAdmin(CatalogAdmin):
    form = VgpuProfileForm
    list_display = ["name", "gpu_model", "series", "fb_mib", "max_per_gpu", "max_per_gpu_mixed", "max_per_vm",
                    "vgpu_count"]
    list_filter = ["gpu_model", "series"]
    list_select_related = ["gpu_model"]
    search_fields = ["name", "gpu_model__name", "gpu_model__code"]

    def get_queryset(self, request):
        return super().get_queryset(request).annotate(vgpu_count=per_parent(Vgpu, "profile", Count("pk")))

    @admin.display(description="vGPUs placed", ordering="vgpu_count")
    def vgpu_count(self, obj):
        return obj.vgpu_count


class ReadOnlyInline(admin.TabularInline):
    """Shows related rows; they are changed through their own pages and services, not here."""

    extra = 0
    can_delete = False
    show_change_link = True

    def has_add_permission(self, request, obj=None):
        return False

    def has_change_permission(self, request, obj=None):
        return False


class VgpuOnGpuInline(ReadOnlyInline):
    model = Vgpu
    fk_name = "gpu"
    verbose_name_plural = "vGPUs on this GPU"
    fields = ["placement_id", "profile", "fb_mib", "vm", "artist"]
    readonly_fields = fields

    def get_queryset(self, request):
        return super().get_queryset(request).select_related("profile", "vm__artist")

    @admin.display(description="frame buffer, MiB")
    def fb_mib(self, obj):
        return obj.profile.fb_mib

    @admin.display(description="artist")
    def artist(self, obj):
        return obj.vm.artist or "-"


class VgpuOnVmInline(ReadOnlyInline):
    model = Vgpu
    fk_name = "vm"
    verbose_name_plural = "vGPUs of this VM"
    fields = ["profile", "gpu", "placement_id"]
    readonly_fields = fields

    def get_queryset(self, request):
        return super().get_queryset(request).select_related("profile", "gpu__host", "gpu__gpu_model")


class GpuOnHostInline(ReadOnlyInline):
    model = Gpu
    fields = ["pci_bus_id", "gpu_model", "mode", "size_mode", "uuid"]
    readonly_fields = fields
    verbose_name_plural = "GPUs in this host"

    def get_queryset(self, request):
        return super().get_queryset(request).select_related("gpu_model", "host")


@admin.register(Host)
class HostAdmin(RuleGovernedAdmin):
    form = HostForm
    inlines = [GpuOnHostInline]
    list_display = ["name", "hypervisor", "cpu_model", "cpu_threads", "ram_gib", "vcpus_allocated",
                    "ram_allocated", "gpu_count", "vm_count", "multi_vgpu_same_gpu"]
    list_filter = ["hypervisor", "multi_vgpu_same_gpu"]
    search_fields = ["name", "cpu_model"]

    def get_queryset(self, request):
        return super().get_queryset(request).annotate(
            allocated_vcpus=per_parent(VirtualMachine, "host", Sum("vcpus")),
            allocated_ram_gib=per_parent(VirtualMachine, "host", Sum("ram_gib")),
            gpu_count=per_parent(Gpu, "host", Count("pk")),
            vm_count=per_parent(VirtualMachine, "host", Count("pk")),
        )

    def get_readonly_fields(self, request, obj=None):
        return ["vcpus_allocated", "ram_allocated"] if obj else []

    @staticmethod
    def _capacity(obj) -> placement.HostState:
        return placement.HostState(
            id=obj.pk, name=obj.name, cpu_threads=obj.cpu_threads, ram_gib=obj.ram_gib,
            vcpu_overcommit=obj.vcpu_overcommit, ram_overcommit=obj.ram_overcommit,
        )

    @admin.display(description="vCPUs allocated / capacity", ordering="allocated_vcpus")
    def vcpus_allocated(self, obj):
        return f"{obj.allocated_vcpus} / {self._capacity(obj).vcpu_capacity}"

    @admin.display(description="RAM allocated / capacity, GiB", ordering="allocated_ram_gib")
    def ram_allocated(self, obj):
        return f"{obj.allocated_ram_gib} / {self._capacity(obj).ram_capacity_gib}"

    @admin.display(description="GPUs", ordering="gpu_count")
    def gpu_count(self, obj):
        return obj.gpu_count

    @admin.display(description="VMs", ordering="vm_count")
    def vm_count(self, obj):
        return obj.vm_count


@admin.register(Gpu)
class GpuAdmin(RuleGovernedAdmin):
    form = GpuForm
    inlines = [VgpuOnGpuInline]
    list_display = ["pci_bus_id", "host", "gpu_model", "mode", "size_mode", "vgpu_count", "fb_used"]
    list_filter = ["gpu_model", "mode", "size_mode", "host"]
    list_select_related = ["host", "gpu_model"]
    search_fields = ["pci_bus_id", "uuid", "host__name", "gpu_model__name"]

    def get_queryset(self, request):
        return super().get_queryset(request).annotate(
            used_fb_mib=per_parent(Vgpu, "gpu", Sum("profile__fb_mib")),
            vgpu_count=per_parent(Vgpu, "gpu", Count("pk")),
        )

    def get_readonly_fields(self, request, obj=None):
        return ["fb_used", "place_vgpu_link"] if obj else []

    @admin.display(description="vGPUs", ordering="vgpu_count")
    def vgpu_count(self, obj):
        return obj.vgpu_count

    @admin.display(description="frame buffer used / total, MiB", ordering="used_fb_mib")
    def fb_used(self, obj):
        return f"{obj.used_fb_mib} / {obj.gpu_model.fb_mib}"

    @admin.display(description="placement")
    def place_vgpu_link(self, obj):
        return format_html('<a href="{}?gpu={}">Place a vGPU on this GPU</a>', reverse("admin:fleet_vgpu_add"), obj.pk)


@admin.register(Artist)
class ArtistAdmin(AuditedAdmin):
    list_display = ["name", "user", "workflow", "user_type", "vm_count"]
    list_filter = ["workflow", "user_type"]
    list_select_related = ["user"]
    search_fields = ["name", "user__username", "user__email"]
    autocomplete_fields = ["user"]

    def get_queryset(self, request):
        return super().get_queryset(request).annotate(vm_count=per_parent(VirtualMachine, "artist", Count("pk")))

    @admin.display(description="VMs", ordering="vm_count")
    def vm_count(self, obj):
        return obj.vm_count


@admin.register(VirtualMachine)
class VirtualMachineAdmin(RuleGovernedAdmin):
    form = VirtualMachineForm
    inlines = [VgpuOnVmInline]
    list_display = ["name", "artist", "workflow", "host", "vcpus", "ram_gib", "vgpu_profiles"]
    list_filter = ["host", "artist__workflow", "artist__user_type"]
    list_select_related = ["artist", "host"]
    search_fields = ["name", "uuid", "artist__name", "host__name"]
    autocomplete_fields = ["artist"]
    readonly_fields = ["host"]

    def get_queryset(self, request):
        vgpus = Vgpu.objects.select_related("profile").order_by("profile__name", "pk")
        return super().get_queryset(request).prefetch_related(Prefetch("vgpus", queryset=vgpus))

    @admin.display(description="workflow", ordering="artist__workflow")
    def workflow(self, obj):
        return obj.artist.get_workflow_display() if obj.artist else "-"

    @admin.display(description="vGPU profiles")
    def vgpu_profiles(self, obj):
        return ", ".join(v.profile.name for v in obj.vgpus.all()) or "-"


@admin.register(Vgpu)
class VgpuAdmin(RuleGovernedAdmin):
    """vGPUs are placed (added) and removed (deleted) here, through the services; never edited."""

    form = VgpuPlacementForm
    list_display = ["__str__", "profile", "vm", "host", "gpu_label", "placement_id", "fb_mib", "created_at"]
    list_filter = ["gpu__host", "profile__gpu_model", "profile__series"]
    list_select_related = ["vm", "gpu__host", "gpu__gpu_model", "profile"]
    search_fields = ["vm__name", "vm__artist__name", "profile__name", "gpu__pci_bus_id", "gpu__host__name"]
    view_fields = ["vm", "gpu", "profile", "placement_id", "host", "fb_mib", "created_at"]

    def get_fields(self, request, obj=None):
        return ["vm", "gpu", "profile"] if obj is None else self.view_fields

    def get_readonly_fields(self, request, obj=None):
        return [] if obj is None else self.view_fields

    def has_change_permission(self, request, obj=None):
        return False

    def delete_model(self, request, obj):
        services.remove_vgpu(obj)

    def delete_queryset(self, request, queryset):
        services.remove_vgpus(queryset.order_by("pk"))

    @admin.display(description="host", ordering="gpu__host__name")
    def host(self, obj):
        return obj.gpu.host.name

    @admin.display(description="GPU", ordering="gpu__pci_bus_id")
    def gpu_label(self, obj):
        return f"{obj.gpu.pci_bus_id} ({obj.gpu.gpu_model.name})"

    @admin.display(description="frame buffer, MiB", ordering="profile__fb_mib")
    def fb_mib(self, obj):
        return obj.profile.fb_mib


class TokenStateFilter(admin.SimpleListFilter):
    """Active, expired or revoked, as `ApiToken.state` tells it (`fleet.api_tokens.in_state`)."""

    title = "state"
    parameter_name = "state"

    def lookups(self, request, model_admin):
        return TokenState.choices

    def queryset(self, request, queryset):
        return api_tokens.in_state(queryset, self.value()) if self.value() in TokenState.values else queryset


@admin.register(ApiToken)
class ApiTokenAdmin(SafeInputAdminMixin, admin.ModelAdmin):
    """Scripts' API tokens, listed with scope, expiry, last use and state; the digest is never shown.

    Adding one issues a key through `fleet.api_tokens` and shows it on the page that follows,
    once: not cached, and never in a flash message, which would travel in a cookie. The action
    "Revoke selected tokens" revokes and keeps them, so their keys are answered with when they
    were revoked; deleting forgets a token (its key is then "Invalid token." like any unknown
    one). Tokens are not edited: another purpose gets another token.
    """

    form = ApiTokenForm
    list_display = ["prefix", "user", "name", "scope", "created_at", "expires_at", "last_used_at", "state"]
    list_filter = ["scope", TokenStateFilter]
    list_select_related = ["user"]
    search_fields = ["prefix", "name", "user__username"]
    view_fields = ["prefix", "user", "name", "scope", "created_at", "expires_at", "last_used_at", "state",
                   "revoked_at", "revoked_reason", "revoked_by"]
    actions = ["revoke_selected"]

    @admin.display(description="state")
    def state(self, obj: ApiToken) -> str:
        return TokenState(obj.state()).label

    def get_fields(self, request, obj=None):
        return ["user", "name", "scope", "expires_on"] if obj is None else self.view_fields

    def get_readonly_fields(self, request, obj=None):
        return [] if obj is None else self.view_fields

    def has_change_permission(self, request, obj=None):
        return False

    def save_model(self, request, obj, form, change):
        setattr(request, ISSUED_KEY_ATTR, api_tokens.issue_key(obj))

    def response_add(self, request, obj, post_url_continue=None):
        response = TemplateResponse(request, "admin/fleet/apitoken/issued.html", {
            **self.admin_site.each_context(request),
            "title": f"API token {obj.prefix} issued for {obj.user.get_username()}",
            "token": obj,
            "key": getattr(request, ISSUED_KEY_ATTR),
            "opts": self.opts,
        })
        add_never_cache_headers(response)
        return response

    def has_revoke_permission(self, request) -> bool:
        """Whoever may delete tokens may revoke them (revoking keeps the row, so it is the lesser)."""
        return self.has_delete_permission(request)

    @admin.action(description="Revoke selected tokens", permissions=["revoke"])
    def revoke_selected(self, request, queryset):
        revoked, skipped = api_tokens.revoke_tokens(queryset.select_related("user").order_by("pk"), by=request.user)
        message = f"Revoked {revoked} API token{pluralize(revoked)}."
        if skipped:
            message += f" {skipped} {'was' if skipped == 1 else 'were'} already revoked."
        self.message_user(request, message, messages.SUCCESS if revoked else messages.WARNING)

    def delete_model(self, request, obj):
        api_tokens.delete_token(obj)

    def delete_queryset(self, request, queryset):
        with transaction.atomic():
            for token in queryset.select_related("user").order_by("pk"):
                api_tokens.delete_token(token)


# django-axes' records of sign-ins (config/lockout.py), registered by axes itself (importing its
# admin module registers them): their date hierarchy refuses impossible dates (config.admin_input).
guard_registered(admin.site, [AccessAttempt, AccessLog, AccessFailureLog])
