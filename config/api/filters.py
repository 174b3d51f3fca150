"""Filter backends every app's API uses (REST_FRAMEWORK["DEFAULT_FILTER_BACKENDS"], in this order):

- `KnownParametersFilter`: a list answers 400 naming a query parameter it does not know
  (`?hots=1` -> `{"hots": ["Unknown filter ..."]}`), instead of ignoring it and listing everything:
  a script with a typo in a filter would otherwise act on the whole fleet.
- `ExpandFilter`: `?expand=host,gpu_model` (or `?expand=all`) reads the named related objects of
  each row as `{id, url, display}` (`config.api.serializers.ExpandableMixin`), joined in the same
  query; without it ids stay ids, as v1 has always answered.
- django-filter's backend (the app's FilterSet), then `StableOrderingFilter` (`?ordering=`).
"""

from __future__ import annotations

from django.core.exceptions import FieldDoesNotExist
from django.db.models import ForeignKey, OneToOneField
from rest_framework.exceptions import ValidationError
from rest_framework.filters import BaseFilterBackend, OrderingFilter, SearchFilter
from rest_framework.settings import api_settings

#: The query parameter of the nested representation of related objects.
EXPAND_PARAM = "expand"
#: `?expand=all` (or `true`): every related object the resource has.
EXPAND_ALL = ("all", "true")


class StableOrderingFilter(OrderingFilter):
    """`?ordering=` with `id` appended as a tiebreak, so limit/offset pages never repeat or skip
    rows that share a value (e.g. many hosts with the same `cpu_threads`)."""

    def get_ordering(self, request, queryset, view):
        ordering = super().get_ordering(request, queryset, view)
        if ordering and not {"id", "-id", "pk", "-pk"} & set(ordering):
            ordering = [*ordering, "id"]
        return ordering


def _filterset_parameters(backend, view, queryset) -> set[str]:
    filterset_class = backend.get_filterset_class(view, queryset)
    if filterset_class is None:
        return set()
    names = set()
    for name, declared in filterset_class.base_filters.items():
        names.add(name)
        # A filter of two inputs (a range) reads `<name>_<suffix>` for each (django-filter's MultiWidget).
        widget = declared.field_class.widget if hasattr(declared.field_class, "widget") else None
        for suffix in getattr(widget, "suffixes", ()) or ():
            names.add(f"{name}_{suffix}")
    return names


def expandable_fields(view) -> tuple[str, ...]:
    """Related fields of the view's serializer that `?expand=` may name ((): none; see
    `config.api.serializers.ExpandableMixin`)."""
    try:
        serializer_class = view.get_serializer_class()
    except (AssertionError, AttributeError):
        return ()
    return tuple(getattr(serializer_class, "expandable_fields", ()) or ())


def known_parameters(request, queryset, view) -> set[str]:
    """The query parameters a list of `view` reads: its filters, ordering, search, pagination,
    `format`, `expand` where it has related objects, and the view's own `extra_query_params`."""
    known = {api_settings.URL_FORMAT_OVERRIDE, *getattr(view, "extra_query_params", ())}
    if expandable_fields(view):
        known.add(EXPAND_PARAM)
    for backend_class in getattr(view, "filter_backends", ()):
        backend = backend_class()
        if hasattr(backend, "get_filterset_class"):
            known |= _filterset_parameters(backend, view, queryset)
        if isinstance(backend, OrderingFilter):
            known.add(backend.ordering_param)
        if isinstance(backend, SearchFilter):
            known.add(backend.search_param)
    paginator = getattr(view, "paginator", None)
    for attribute in ("limit_query_param", "offset_query_param", "page_query_param", "page_size_query_param",
                      "cursor_query_param"):
        name = getattr(paginator, attribute, None)
        if name:
            known.add(name)
    known.discard(None)
    return known


class KnownParametersFilter(BaseFilterBackend):
    """A list's unknown query parameters are a 400 naming each one, with the ones it takes."""

    def filter_queryset(self, request, queryset, view):
        if getattr(view, "action", None) != "list":
            return queryset
        known = known_parameters(request, queryset, view)
        unknown = [name for name in request.query_params if name not in known]
        if unknown:
            takes = ", ".join(sorted(known))
            raise ValidationError({name: [f"Unknown filter: this list takes {takes}."] for name in unknown})
        return queryset

    def get_schema_operation_parameters(self, view):
        return []


def requested_expansions(request, expandable: tuple[str, ...]) -> tuple[str, ...]:
    """The related fields `?expand=` names (comma-separated or repeated; `all`: every one), in
    the serializer's order; ValidationError naming `expand` for a name the resource lacks."""
    if request is None or not expandable:
        return ()
    names = {part.strip() for raw in request.query_params.getlist(EXPAND_PARAM) for part in raw.split(",")}
    names.discard("")
    if names & set(EXPAND_ALL):
        return expandable
    unknown = sorted(names - set(expandable))
    if unknown:
        raise ValidationError({EXPAND_PARAM: [
            f"{', '.join(map(repr, unknown))}: not a related field of this resource; use {', '.join(expandable)} "
            f"or all."]})
    return tuple(name for name in expandable if name in names)


def _join_paths(model, name: str) -> list[str]:
    """`name` and what the related row's `display` reads (the model's `display_related`)."""
    try:
        field = model._meta.get_field(name)
    except FieldDoesNotExist:
        return []
    if not isinstance(field, ForeignKey | OneToOneField):
        return []
    return [name, *(f"{name}__{sub}" for sub in getattr(field.related_model, "display_related", ()))]


class ExpandFilter(BaseFilterBackend):
    """Validates `?expand=` and joins the related rows it names, so an expanded list costs the
    same number of queries as a plain one."""

    def filter_queryset(self, request, queryset, view):
        names = requested_expansions(request, expandable_fields(view))
        paths = [path for name in names for path in _join_paths(queryset.model, name)]
        return queryset.select_related(*paths) if paths else queryset

    def get_schema_operation_parameters(self, view):
        return []
