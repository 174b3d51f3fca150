"""The list pages' common machinery: a FilterSet, a search box, sortable columns, pages of 50 and
a CSV export of the same rows, for the fleet's lists and the agents page alike.

The FilterSet is the API's own (DESIGN.md: "the same FilterSet serves the HTML list and the
API"), bound with `request=` so its choices are what the user may see; a value it refuses is
shown on the page with status 400 rather than quietly widening or emptying the list. Search is
the FilterSet's `q`. Ordering keys are whitelisted per page and always end with an id tiebreak,
so a page never repeats or skips a row. The CSV is streamed in chunks of rows, each chunk
decorated the way a page is (`decorate`), so neither the page nor the export issues a query per
row.
"""

from __future__ import annotations

from collections.abc import Callable, Iterable, Iterator
from dataclasses import dataclass
from typing import Any

from django import forms
from django.core.paginator import Paginator
from django.db.models import QuerySet
from django.http import HttpRequest, HttpResponse, QueryDict, StreamingHttpResponse
from django.shortcuts import render
from django.utils import timezone
from django.utils.cache import patch_vary_headers
from django.views import View

from config import parsing
from config.csv_export import chunked, csv_response
from dashboard.access import StaffRequiredMixin

PAGE_SIZE = 50
#: Rows fetched (and decorated) at a time while streaming a CSV export.
CSV_CHUNK_ROWS = 500
#: Parameters that steer the page rather than filter its rows.
CONTROL_PARAMS = ("page", "ordering", "format")


@dataclass(frozen=True)
class Column:
    """One column of a list table: its header, the `?ordering=` key that sorts by it (None: not
    sortable), whether it holds numbers (right-aligned) and a tooltip (e.g. its unit)."""

    label: str
    key: str | None = None
    num: bool = False
    title: str = ""


@dataclass(frozen=True)
class Header:
    """A column header as the template draws it: a link that sorts by the column (or reverses
    the current sort) and the `aria-sort` state."""

    label: str
    url: str | None
    sort: str | None
    num: bool
    title: str


@dataclass(frozen=True)
class CsvColumn:
    """One column of a CSV export: its header (units in the name) and the value of a row."""

    header: str
    value: Callable[[Any], Any]


def url_with(path: str, params: QueryDict, drop: Iterable[str] = (), **values: str) -> str:
    """`path` with the query `params` minus `drop` and empty values, plus `values`: links that
    keep the filters (pager, sortable headers, CSV export) without carrying `?q=&host=` clutter."""
    query = QueryDict(mutable=True)
    for key, items in params.lists():
        kept = [item for item in items if item != ""]
        if key not in drop and key not in values and kept:
            query.setlist(key, kept)
    for key, value in values.items():
        query[key] = value
    encoded = query.urlencode()
    return f"{path}?{encoded}" if encoded else path


def _any_choice(form: forms.Form) -> None:
    """Let the empty choice of each select read "Any" (not "---------" or "Unknown") and leave
    its parameter out of the URL: the API's filters are unchanged, only their page form reads better."""
    for field in form.fields.values():
        if getattr(field, "empty_label", None) is not None:
            field.empty_label = "Any"
            if not isinstance(field, forms.ModelChoiceField):
                # The widget kept a shallow copy of the class-level choices; give it this field's.
                field.widget.choices = list(field.choices)
        if isinstance(field.widget, forms.NullBooleanSelect):
            field.widget.choices = [("", "Any"), ("true", "Yes"), ("false", "No")]


class FilteredListView(StaffRequiredMixin, View):
    """A staff-only list page: subclasses name the FilterSet, the rows (`get_queryset`), the
    columns, the orderings and the CSV columns; `decorate` attaches what a row shows beyond its
    queryset (e.g. the latest samples of a page's GPUs) in a fixed number of queries."""

    filterset_class: type
    template_name: str
    #: Rendered alone for an htmx request (a live refresh of the table); None: no live refresh.
    partial_template_name: str | None = None
    columns: tuple[Column, ...] = ()
    #: `?ordering=` key -> the database ordering; `-key` reverses it. An id tiebreak is added.
    orderings: dict[str, tuple[str, ...]] = {}
    default_ordering = "name"
    #: FilterSet fields shown in the form, in order; any other one given in the URL shows too.
    filter_fields: tuple[str, ...] = ("q",)
    csv_columns: tuple[CsvColumn, ...] = ()
    #: CSV file name stem: `hosts` gives hosts-2026-11-22.csv.
    csv_name = "rows"
    #: Plural noun of a row, for "1–50 of 120 hosts" and the empty states.
    noun = "rows"
    page_size = PAGE_SIZE

    def get_queryset(self) -> QuerySet:
        raise NotImplementedError

    def decorate(self, rows: list) -> None:
        """Attach what the rows show beyond their queryset; called once a page or CSV chunk."""

    def get_extra_context(self) -> dict:
        return {}

    def get(self, request: HttpRequest) -> HttpResponse:
        filterset = self.filterset_class(request.GET, queryset=self.get_queryset(), request=request)
        _any_choice(filterset.form)
        ordering_key = self._ordering_key(request.GET.get("ordering", ""))
        if not filterset.is_valid():
            return self._render(request, filterset, ordering_key, page=None, rows=[], status=400)
        queryset = filterset.qs.order_by(*self._ordering(ordering_key))
        if request.GET.get("format") == "csv":
            return self.csv_response(queryset)
        try:
            number = parsing.parse_page(request.GET.get("page"))
        except parsing.ParseError as exc:
            filterset.form.add_error(None, f"Page: {exc}")
            return self._render(request, filterset, ordering_key, page=None, rows=[], status=400)
        page = Paginator(queryset, self.page_size).get_page(number)
        rows = list(page.object_list)
        self.decorate(rows)
        return self._render(request, filterset, ordering_key, page=page, rows=rows)

    # Ordering ------------------------------------------------------------------------------

    def _ordering_key(self, requested: str) -> str:
        """The requested `?ordering=` if whitelisted, else the default (as the API ignores an
        unknown ordering field rather than failing)."""
        return requested if requested.removeprefix("-") in self.orderings else self.default_ordering

    def _ordering(self, key: str) -> list[str]:
        fields = self.orderings[key.removeprefix("-")]
        if key.startswith("-"):
            fields = tuple(field[1:] if field.startswith("-") else f"-{field}" for field in fields)
        return [*fields, "-id" if key.startswith("-") else "id"]

    def _headers(self, request: HttpRequest, ordering_key: str) -> list[Header]:
        current = ordering_key.removeprefix("-")
        descending = ordering_key.startswith("-")
        headers = []
        for column in self.columns:
            url = sort = None
            if column.key:
                reverse = column.key == current and not descending
                url = url_with(request.path, request.GET, drop=("page", "format"),
                               ordering=f"-{column.key}" if reverse else column.key)
                if column.key == current:
                    sort = "descending" if descending else "ascending"
            headers.append(Header(column.label, url, sort, column.num, column.title))
        return headers

    # Rendering -----------------------------------------------------------------------------

    def _render(self, request: HttpRequest, filterset, ordering_key: str, *, page, rows: list,
                status: int = 200) -> HttpResponse:
        form = filterset.form
        shown = [form[name] for name in self.filter_fields if name in form.fields]
        shown += [field for field in form if field.name not in self.filter_fields and field.value() not in (None, "")]
        filtered = any(request.GET.get(name) for name in filterset.filters)
        path = request.path
        context = {
            "filterset": filterset,
            "form": form,
            "filter_fields": shown,
            "ordering": request.GET.get("ordering", ""),
            "headers": self._headers(request, ordering_key),
            "rows": rows,
            "page": page,
            "noun": self.noun,
            "filtered": filtered,
            "reset_url": path,
            "csv_url": url_with(path, request.GET, drop=("page",), format="csv"),
            "self_url": url_with(path, request.GET, drop=("format",)),
        }
        if page is not None:
            context["prev_url"] = (url_with(path, request.GET, drop=("format",), page=str(page.previous_page_number()))
                                   if page.has_previous() else None)
            context["next_url"] = (url_with(path, request.GET, drop=("format",), page=str(page.next_page_number()))
                                   if page.has_next() else None)
        context.update(self.get_extra_context())
        template = self.template_name
        if self.partial_template_name and getattr(request, "htmx", False):
            template = self.partial_template_name
        response = render(request, template, context, status=status)
        if self.partial_template_name:
            # One URL answers with a page or with its table: caches must keep them apart.
            patch_vary_headers(response, ("HX-Request",))
        return response

    # CSV -----------------------------------------------------------------------------------

    def csv_response(self, queryset: QuerySet) -> StreamingHttpResponse:
        """Every filtered row (not one page) as CSV, streamed a chunk of rows at a time, each cell
        made safe for a spreadsheet by `config.csv_export`."""
        return csv_response(f"{self.csv_name}-{timezone.now():%Y-%m-%d}.csv",
                            [column.header for column in self.csv_columns], self._csv_chunks(queryset))

    def _csv_chunks(self, queryset: QuerySet) -> Iterator[list[list[Any]]]:
        for chunk in chunked(queryset.iterator(chunk_size=CSV_CHUNK_ROWS), CSV_CHUNK_ROWS):
            self.decorate(chunk)
            yield [[column.value(row) for column in self.csv_columns] for row in chunk]
