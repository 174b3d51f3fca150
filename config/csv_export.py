"""CSV exports a spreadsheet opens safely: the one writer behind every `?format=csv` of the
dashboard (the list pages of `dashboard.listing`) and of the API (every list, `CsvRenderer`; the
audit log streams its own rows through `csv_response`).

A spreadsheet runs a cell whose text starts with `=`, `+`, `-` or `@` as a formula, and
Excel and LibreOffice also do after a leading tab or carriage return. A VM named
`=HYPERLINK("http://x", "click")`, an agent error echoing a host's answer or an audit comment
would otherwise become a live formula on an admin's machine (CSV injection). Every cell of
every export therefore passes `spreadsheet_cell`, which puts a single quote in front of such
text (OWASP's advice): the spreadsheet shows the text as typed, the quote marks it as text.

Numbers stay numbers: a cell given as an int, float or Decimal (a negative clock skew, GPUs
freed by a move) is written as the number it is, since a negative number is a value to a
spreadsheet, not a formula. Only text is neutralised, including a number that arrives as text
(`"-2"` becomes `'-2`) and JSON dumped into a cell (its first character is checked like any
other text's).
"""

from __future__ import annotations

import csv
import json
from collections.abc import Iterable, Iterator, Sequence
from decimal import Decimal
from itertools import islice
from typing import Any

from django.http import StreamingHttpResponse
from django.utils import timezone
from rest_framework.renderers import BaseRenderer

#: A spreadsheet runs a cell starting with one of these as a formula.
FORMULA_STARTS = ("=", "+", "-", "@", "\t", "\r")
CONTENT_TYPE = "text/csv; charset=utf-8"


def spreadsheet_cell(value: Any) -> Any:
    """`value` as a cell a spreadsheet will not run: None is empty, an int, float or Decimal is
    kept as the number it is, anything else is its text with a leading `'` when that text
    starts with one of FORMULA_STARTS."""
    if value is None:
        return ""
    if isinstance(value, int | float | Decimal):  # bool is an int: True/False stay as they are
        return value
    text = value if isinstance(value, str) else str(value)
    return "'" + text if text.startswith(FORMULA_STARTS) else text


def chunked(rows: Iterable, size: int) -> Iterator[list]:
    """`rows` in lists of at most `size`."""
    iterator = iter(rows)
    while chunk := list(islice(iterator, size)):
        yield chunk


class _Echo:
    """A file-like object whose write() returns the line, so csv.writer can feed a stream."""

    def write(self, value: str) -> str:
        return value


def csv_lines(header: Sequence[str], chunks: Iterable[Iterable[Sequence[Any]]]) -> Iterator[str]:
    """The header line, then the lines of each chunk of rows joined in one string (a stream
    yields per chunk, not per row); every cell goes through `spreadsheet_cell`."""
    writer = csv.writer(_Echo())
    yield writer.writerow([spreadsheet_cell(name) for name in header])
    for chunk in chunks:
        yield "".join(writer.writerow([spreadsheet_cell(cell) for cell in row]) for row in chunk)


def csv_response(filename: str, header: Sequence[str], chunks: Iterable[Iterable[Sequence[Any]]],
                 ) -> StreamingHttpResponse:
    """A streamed CSV download named `filename` (see `csv_lines`)."""
    response = StreamingHttpResponse(csv_lines(header, chunks), content_type=CONTENT_TYPE)
    response["Content-Disposition"] = f'attachment; filename="{filename}"'
    return response


def _field_rows(data: Any, field: str = "") -> Iterator[tuple[str, Any]]:
    """(field, value) rows of an API answer: a dict's keys, one row per item of a list."""
    if isinstance(data, dict):
        for key, value in data.items():
            yield from _field_rows(value, f"{field}.{key}" if field else str(key))
    elif isinstance(data, list | tuple):
        for item in data:
            yield from _field_rows(item, field)
    else:
        yield field, data


def flat_row(row: dict, prefix: str = "") -> dict[str, Any]:
    """One API object as the cells of one CSV row: a nested object's fields as `field.sub`
    columns (`host.display` of `?expand=host`), a list as its JSON text in one cell."""
    cells: dict[str, Any] = {}
    for key, value in row.items():
        name = f"{prefix}{key}"
        if isinstance(value, dict):
            cells.update(flat_row(value, f"{name}."))
        elif isinstance(value, list | tuple):
            cells[name] = json.dumps(value, sort_keys=True, default=str)
        else:
            cells[name] = value
    return cells


def table_lines(rows: Sequence[dict]) -> Iterator[str]:
    """A list of API objects as a table: one column per field (in the order first seen), one
    line per object; a field an object lacks (a null nested object) is an empty cell."""
    flat = [flat_row(row) for row in rows]
    header = list(dict.fromkeys(name for row in flat for name in row))
    return csv_lines(header, [[[row.get(name) for name in header] for row in flat]])


class CsvRenderer(BaseRenderer):
    """`?format=csv` for DRF views. A list (which the API's pagination leaves whole for CSV,
    `config.api.pagination`) is a table of its objects, downloaded as `<resource>-<date>.csv`;
    whatever else reaches the renderer (one object, an error's messages, which may echo what the
    caller typed) is written as `field,value` rows. Every cell goes through `spreadsheet_cell`,
    so no answer served as text/csv carries a live formula. A view may stream its export itself
    (`csv_response`, the audit log)."""

    media_type = "text/csv"
    format = "csv"
    charset = "utf-8"

    def render(self, data, accepted_media_type=None, renderer_context=None) -> bytes:
        if data is None:
            return b""
        if isinstance(data, list) and all(isinstance(row, dict) for row in data):
            response = (renderer_context or {}).get("response")
            view = (renderer_context or {}).get("view")
            if response is not None and response.status_code == 200:
                name = getattr(view, "basename", None) or "export"
                response["Content-Disposition"] = f'attachment; filename="{name}-{timezone.localdate()}.csv"'
            return "".join(table_lines(data)).encode()
        return "".join(csv_lines(("field", "value"), [_field_rows(data)])).encode()
