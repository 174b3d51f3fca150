"""FilterSets of the fleet inventory, one per model, shared by the REST API and the HTML lists.

Query parameters are the model's field names (`?host=3&mode=vgpu`); foreign keys take an id or
a name (`?host=gpu-node-01`, `?gpu_model=L40S`, `?profile=L40S-12Q`, `?artist=Ana Artist`: see
`IdOrNameFilter`), and an unknown id, name or choice is a 400 naming the value, not an empty list.
`name` filters match a part of the name, case-insensitively; `q` (NetBox's search parameter)
matches a part of any of a few names of the row at once, as the search box of a list page does.
Ordering is not here: the API's OrderingFilter takes `?ordering=`.

The choices of a filter on a host, GPU, VM, artist or user are what the requesting user may
see (`fleet.queries.visible_*`): an artist's filter form never lists other artists' VMs, and
naming an object outside their scope is the same 400 as naming one that does not exist. Pass
`request=` when building a FilterSet for a page; without a request those choices are empty.
"""

import django_filters
from django import forms
from django.db.models import Q, QuerySet
from django.utils import timezone

from config import parsing
from fleet import api_tokens, queries
from fleet.choices import AuditSource, GpuMode, Hypervisor, Series, SizeMode, TokenScope, TokenState, UserType, Workflow
from fleet.models import ApiToken, Artist, AuditEvent, Gpu, GpuModel, Host, Vgpu, VgpuProfile, VirtualMachine
from fleet.pci import InvalidPciBusId, normalize_pci_bus_id


def visible_to_requester(visible):
    """A ModelChoiceFilter `queryset` callable: the rows `visible(user)` gives the requesting user."""

    def queryset(request):
        return visible(getattr(request, "user", None))

    return queryset


def literal_error(message: str, code: str) -> forms.ValidationError:
    """A form error whose message quotes what the user typed, kept as typed: the text travels as a
    parameter, because django-filter's API answer and Django's form both %-format an error's
    message (a `%` typed into a filter would otherwise be read as a format and fail)."""
    return forms.ValidationError("%(message)s", params={"message": message}, code=code)


class IdOrNameField(django_filters.fields.ModelChoiceField):
    """A choice of one row by its id or by one of its names (`name_fields`, tried in order).

    ASCII digits are an id first (a host named "3" is still reached by its id when no row has
    id 3). A name two visible rows share is a 400 asking for the id; nothing matching is the
    form's `invalid_choice`, with the value and the kind of row it was looked up as."""

    def __init__(self, *args, name_fields: tuple[str, ...] = ("name",), **kwargs):
        self.name_fields = name_fields
        super().__init__(*args, **kwargs)

    def to_python(self, value):
        if value in self.empty_values:
            return None
        text = str(value).strip()
        self.validate_no_null_characters(text)
        if text.isascii() and text.isdigit():
            try:
                return super().to_python(text)
            except forms.ValidationError:
                pass  # perhaps a name made of digits
        noun = self.queryset.model._meta.verbose_name
        fields = {field.name for field in self.queryset.model._meta.get_fields()}
        for field in (name for name in self.name_fields if name in fields):
            matches = list(self.queryset.filter(**{field: text})[:2])
            if len(matches) == 1:
                return matches[0]
            if matches:
                raise literal_error(
                    f"Several {self.queryset.model._meta.verbose_name_plural} have the {field} {text!r}: use the id.",
                    code="ambiguous")
        raise literal_error(
            f"{self.error_messages['invalid_choice']} No {noun} has the id or name {text!r} (or you may not see it).",
            code="invalid_choice")


class IdOrNameFilter(django_filters.ModelChoiceFilter):
    """`?host=3` or `?host=gpu-node-01`: a foreign key by id or name (`IdOrNameField`)."""

    field_class = IdOrNameField


def _choice_of(visible, **kwargs) -> IdOrNameFilter:
    return IdOrNameFilter(queryset=visible_to_requester(visible), **kwargs)


class PciBusIdField(forms.CharField):
    """A PCI bus id in any spelling, read in NVML's (`fleet.pci`); anything else is the form's error."""

    def to_python(self, value):
        text = super().to_python(value)
        if not text:
            return None
        try:
            return normalize_pci_bus_id(text)
        except InvalidPciBusId as exc:
            raise literal_error(str(exc), code="invalid") from None


class PciBusIdFilter(django_filters.CharFilter):
    field_class = PciBusIdField


#: GPU models are named as nvidia-smi names them ("NVIDIA L40S") or by their code ("L40S").
GPU_MODEL_NAMES = ("name", "code")


def search_filter(*fields: str, placeholder: str) -> django_filters.CharFilter:
    """A `q` filter: rows where any of `fields` contains the text, case-insensitively. Only
    single-valued relations belong in `fields`, so a match never repeats a row."""

    def search(queryset: QuerySet, name: str, value: str) -> QuerySet:
        text = value.strip()
        if not text:
            return queryset
        condition = Q()
        for field in fields:
            condition |= Q(**{f"{field}__icontains": text})
        return queryset.filter(condition)

    return django_filters.CharFilter(
        method=search, label="Search",
        widget=forms.TextInput(attrs={"type": "search", "placeholder": placeholder}),
    )


class GpuModelFilterSet(django_filters.FilterSet):
    name = django_filters.CharFilter(lookup_expr="icontains")

    class Meta:
        model = GpuModel
        fields = ["name", "code", "mixed_size_capable", "gpus_per_board"]


class VgpuProfileFilterSet(django_filters.FilterSet):
    name = django_filters.CharFilter(lookup_expr="icontains")
    gpu_model = IdOrNameFilter(queryset=GpuModel.objects.all(), name_fields=GPU_MODEL_NAMES)
    series = django_filters.ChoiceFilter(choices=Series.choices)
    fb_mib__gte = django_filters.NumberFilter(
        field_name="fb_mib", lookup_expr="gte", label="Frame buffer at least (MiB)",
    )
    fb_mib__lte = django_filters.NumberFilter(
        field_name="fb_mib", lookup_expr="lte", label="Frame buffer at most (MiB)",
    )

    class Meta:
        model = VgpuProfile
        fields = ["name", "gpu_model", "series", "fb_mib"]


class HostFilterSet(django_filters.FilterSet):
    q = search_filter("name", placeholder="Host name")
    name = django_filters.CharFilter(lookup_expr="icontains")
    hypervisor = django_filters.ChoiceFilter(choices=Hypervisor.choices)

    class Meta:
        model = Host
        fields = ["name", "hypervisor"]


class GpuFilterSet(django_filters.FilterSet):
    """`?uuid=` finds the GPU an agent or nvidia-smi reports (exact NVML UUID)."""

    q = search_filter("uuid", "pci_bus_id", "host__name", placeholder="UUID, PCI bus id or host")
    host = _choice_of(queries.visible_hosts)
    gpu_model = IdOrNameFilter(queryset=GpuModel.objects.all(), name_fields=GPU_MODEL_NAMES)
    pci_bus_id = PciBusIdFilter(help_text="Any spelling of the bus id: 0000:3b:00.0 finds 00000000:3B:00.0")
    mode = django_filters.ChoiceFilter(choices=GpuMode.choices)
    size_mode = django_filters.ChoiceFilter(choices=SizeMode.choices)

    class Meta:
        model = Gpu
        fields = ["uuid", "host", "gpu_model", "mode", "size_mode", "pci_bus_id"]


class ArtistFilterSet(django_filters.FilterSet):
    q = search_filter("name", "user__username", placeholder="Name or user name")
    name = django_filters.CharFilter(lookup_expr="icontains")
    user = _choice_of(queries.visible_users, name_fields=("username",))
    workflow = django_filters.ChoiceFilter(choices=Workflow.choices)
    user_type = django_filters.ChoiceFilter(choices=UserType.choices)

    class Meta:
        model = Artist
        fields = ["name", "user", "workflow", "user_type"]


class VirtualMachineFilterSet(django_filters.FilterSet):
    q = search_filter("name", "uuid", "artist__name", placeholder="VM name, UUID or artist")
    name = django_filters.CharFilter(lookup_expr="icontains")
    host = _choice_of(queries.visible_hosts)
    artist = _choice_of(queries.visible_artists)
    unplaced = django_filters.BooleanFilter(
        field_name="host", lookup_expr="isnull", label="Without a host (holds no vGPU)",
    )

    class Meta:
        model = VirtualMachine
        fields = ["name", "uuid", "host", "artist", "unplaced"]


class VgpuFilterSet(django_filters.FilterSet):
    vm = _choice_of(queries.visible_vms)
    gpu = _choice_of(queries.visible_gpus, name_fields=("uuid",))
    profile = IdOrNameFilter(queryset=VgpuProfile.objects.all())
    host = _choice_of(queries.visible_hosts, field_name="gpu__host", label="Host")

    class Meta:
        model = Vgpu
        fields = ["vm", "gpu", "profile", "host"]


# -- audit log (the API's audit-events and the audit page) --------------------------------------

class TimeField(forms.CharField):
    """A time as `config.parsing` reads it: ISO 8601 (a naive time is in the server's zone) or Unix
    seconds, like the rest of the API; anything else is the filter's form error (a 400 naming it)."""

    def to_python(self, value):
        text = super().to_python(value)
        if not text:
            return None
        try:
            return parsing.parse_time(text, default_tz=timezone.get_current_timezone())
        except parsing.ParseError as exc:
            raise literal_error(str(exc), code="invalid") from None


class TimeFilter(django_filters.CharFilter):
    field_class = TimeField


class AuditEventFilter(django_filters.FilterSet):
    action = django_filters.CharFilter()
    object_type = django_filters.CharFilter()
    object_id = django_filters.CharFilter()
    source = django_filters.ChoiceFilter(choices=AuditSource.choices)
    actor = django_filters.CharFilter(method="filter_actor", help_text="user id or username")
    since = TimeFilter(field_name="at", lookup_expr="gte", label="Since", help_text="ISO 8601 or Unix seconds")
    until = TimeFilter(field_name="at", lookup_expr="lt", label="Until", help_text="ISO 8601 or Unix seconds")
    q = django_filters.CharFilter(method="filter_q", label="Search",
                                  help_text="text in the object's name or the comment")

    class Meta:
        model = AuditEvent
        fields = ["action", "object_type", "object_id", "source"]

    def filter_actor(self, qs, name, value):
        try:
            return qs.filter(actor_id=parsing.parse_int(value))
        except parsing.ParseError:  # not an id: a user name
            return qs.filter(Q(actor__username=value) | Q(actor_name=value))

    def filter_q(self, qs, name, value):
        return qs.filter(Q(object_repr__icontains=value) | Q(comment__icontains=value))


# -- API tokens (the API's api-tokens list) ----------------------------------------------------


class ApiTokenFilterSet(django_filters.FilterSet):
    user = _choice_of(queries.visible_users, name_fields=("username",),
                      help_text="Whose tokens: a user id or user name (admins; others see only their own)")
    scope = django_filters.ChoiceFilter(choices=TokenScope.choices)
    state = django_filters.ChoiceFilter(choices=TokenState.choices, method="filter_state",
                                        help_text="active, expired or revoked, now")

    class Meta:
        model = ApiToken
        fields = ["user", "scope", "state"]

    def filter_state(self, queryset, name, value):
        return api_tokens.in_state(queryset, value)
