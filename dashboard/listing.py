"""The list pages' view: a django-filter FilterView showing a django-tables2 table
(`dashboard.tables`), 50 rows a page, and the CSV export of the same rows.

The FilterSet is the API's own (DESIGN.md: "the same FilterSet serves the HTML list and the
API"), bound with `request=` so its choices are what the user may see; a value it refuses is
shown on the page with status 400 rather than quietly widening or emptying the list. The page
controls (`?page=`, `?format=`) go through `ListControlsForm`, so a bad one is named too.
Ordering is the table's (`?ordering=`). The CSV is streamed in chunks of rows, each chunk
decorated the way a page is (`decorate`) and written by `config.csv_export`, the one CSV writer,
so neither the page nor the export issues a query per row and no cell is a live formula.
"""

from __future__ import annotations

from collections.abc import Iterable, Iterator
from dataclasses import dataclass
from typing import Any

from django import forms
from django.core.paginator import Paginator
from django.db.models import QuerySet
from django.http import HttpResponse, QueryDict, StreamingHttpResponse
from django.shortcuts import render
from django.utils import timezone
from django.utils.cache import patch_vary_headers
from django_filters.views import FilterView

from config import parsing
from config.csv_export import chunked, csv_response
from dashboard.access import StaffRequiredMixin
from dashboard.tables import ListTable

PAGE_SIZE = 50
#: Rows fetched (and decorated) at a time while streaming a CSV export.
CSV_CHUNK_ROWS = 500


class PageField(forms.Field):
    """A list's `?page=`: empty is the first page, `last` the last, else a whole number from 1
    (`config.parsing.parse_page`); past the last page shows the last page."""

    def to_python(self, value):
        try:
            return parsing.parse_page(value)
        except parsing.ParseError as exc:
            raise forms.ValidationError(str(exc), code="invalid") from None


class ListControlsForm(forms.Form):
    """The parameters of a list page that steer it rather than filter its rows."""

    page = PageField(required=False)
    format = forms.ChoiceField(choices=[("", "page"), ("csv", "CSV")], required=False)


@dataclass(frozen=True)
class Header:
    """A column header as the template draws it: a link that sorts by the column (or reverses
    the current sort) and the `aria-sort` state."""

    label: str
    url: str | None
    sort: str | None
    num: bool
    title: str


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


def headers(table: ListTable, path: str, params: QueryDict) -> list[Header]:
    """The visible columns' headers of `table`; a sortable one links to the list sorted by it."""
    current = table.order_by[0] if table.order_by else None
    found = []
    for column in table.columns:
        th = column.column.attrs.get("th", {})
        url = sort = None
        if column.orderable:
            ordered = current is not None and current.bare == column.name
            descending = ordered and current.is_descending
            url = url_with(path, params, drop=("page", "format"),
                           ordering=f"-{column.name}" if ordered and not descending else column.name)
            if ordered:
                sort = "descending" if descending else "ascending"
        found.append(Header(str(column.header), url, sort, "num" in th.get("class", "").split(), th.get("title", "")))
    return found


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


class TableListView(StaffRequiredMixin, FilterView):
    """A staff-only list page: subclasses name the FilterSet, the table, the rows
    (`get_queryset`) and the template; `decorate` attaches what a row shows beyond its queryset
    (e.g. the latest samples of a page's GPUs) in a fixed number of queries."""

    table_class: type[ListTable]
    template_name: str
    #: Rendered alone for an htmx request (a live refresh of the table); None: no live refresh.
    partial_template_name: str | None = None
    #: FilterSet fields shown in the form, in order; any other one given in the URL shows too.
    filter_fields: tuple[str, ...] = ("q",)
    #: CSV file name stem: `hosts` gives hosts-2026-11-22.csv; None: the page has no export.
    csv_name: str | None = "rows"
    #: Plural noun of a row, for "1–50 of 120 hosts" and the empty states.
    noun = "rows"
    paginate_by = PAGE_SIZE

    def get_queryset(self) -> QuerySet:
        raise NotImplementedError

    def decorate(self, rows: list) -> None:
        """Attach what the rows show beyond their queryset; called once a page or CSV chunk."""

    def get_extra_context(self) -> dict:
        return {}

    def get_filterset_kwargs(self, filterset_class) -> dict:
        # Always bound (an empty query is valid), so a bad value is refused rather than ignored.
        return {"data": self.request.GET, "queryset": self.get_queryset(), "request": self.request}

    def get(self, request, *args, **kwargs) -> HttpResponse:
        self.filterset = self.get_filterset(self.get_filterset_class())
        _any_choice(self.filterset.form)
        controls = ListControlsForm(request.GET)
        if not (self.filterset.is_valid() & controls.is_valid()):
            return self._render(controls, table=None, status=400)
        self.object_list = self.filterset.qs
        if controls.cleaned_data["format"] == "csv" and self.csv_name:
            return self.csv_response(self.object_list)
        table = self.get_table()
        # Past the last page: the last one (rows may have gone since the link was made).
        table.paginator = Paginator(table.rows, self.paginate_by)
        number = controls.cleaned_data["page"]
        table.page = table.paginator.get_page(table.paginator.num_pages if number == "last" else number)
        self.decorate(list(table.page.object_list.data))
        return self._render(controls, table=table)

    def get_table(self, **kwargs) -> ListTable:
        table = self.table_class(self.object_list, **kwargs)
        table.order_by = self.request.GET.get(table.order_by_field) or None
        return table

    # Rendering -----------------------------------------------------------------------------

    def errors(self, controls: forms.Form) -> list[str]:
        """Every refused parameter as "Label: why", filters first."""
        found = []
        for form in (self.filterset.form, controls):
            for field in form:
                found += [f"{field.label}: {error}" for error in field.errors]
            found += list(form.non_field_errors())
        return found

    def _render(self, controls: forms.Form, table: ListTable | None, status: int = 200) -> HttpResponse:
        request, path = self.request, self.request.path
        form = self.filterset.form
        shown = [form[name] for name in self.filter_fields if name in form.fields]
        shown += [field for field in form if field.name not in self.filter_fields and field.value() not in (None, "")]
        page = table.page if table is not None else None
        context = {
            "view": self,
            "filterset": self.filterset,
            "form": form,
            "controls": controls,
            "errors": self.errors(controls) if table is None else [],
            "filter_fields": shown,
            "ordering": request.GET.get("ordering", ""),
            "table": table,
            "headers": headers(table, path, request.GET) if table is not None else [],
            "rows": list(page.object_list.data) if page is not None else [],
            "page": page,
            "noun": self.noun,
            "filtered": any(request.GET.get(name) for name in self.filterset.filters),
            "reset_url": path,
            "csv_url": self.csv_url(),
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

    def csv_url(self) -> str | None:
        if not self.csv_name:
            return None
        return url_with(self.request.path, self.request.GET, drop=("page",), format="csv")

    # CSV -----------------------------------------------------------------------------------

    def csv_response(self, queryset: QuerySet) -> StreamingHttpResponse:
        """Every filtered row (not one page) as CSV, in the table's order, streamed a chunk of
        rows at a time; each cell is made safe for a spreadsheet by `config.csv_export`."""
        ordered = self.get_table().data.data
        header = self.table_class([]).export_header()
        return csv_response(f"{self.csv_name}-{timezone.now():%Y-%m-%d}.csv", header, self._csv_chunks(ordered))

    def _csv_chunks(self, queryset: QuerySet) -> Iterator[list[list[Any]]]:
        for chunk in chunked(queryset.iterator(chunk_size=CSV_CHUNK_ROWS), CSV_CHUNK_ROWS):
            self.decorate(chunk)
            yield self.table_class(chunk, order_by=()).export_rows()
