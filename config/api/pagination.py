from rest_framework.exceptions import ValidationError
from rest_framework.pagination import LimitOffsetPagination

from config import parsing


class FleetPagination(LimitOffsetPagination):
    """limit/offset pages of `{count, next, previous, results}`, at most 500 rows a page.

    A `limit` or `offset` that is not a whole number (`abc`, `1e400`, `²`), a limit below 1 or a
    negative offset is a 400 naming it; DRF would quietly serve the default page instead, and a
    script would take the wrong rows for the ones it asked for. A limit above the most is served
    as the most (documented in the schema). `?format=csv` is not paginated: the export holds every
    row the filters match."""

    default_limit = 50
    max_limit = 500

    def _number(self, request, name: str, minimum: int) -> int | None:
        raw = request.query_params.get(name, "")
        if not raw.strip():
            return None
        try:
            return parsing.parse_int(raw, minimum=minimum)
        except parsing.ParseError as exc:
            raise ValidationError({name: [str(exc)]}) from None

    def paginate_queryset(self, queryset, request, view=None):
        # `?format=csv` is an export: every matching row, one table (the CsvRenderer of the CSV module).
        if getattr(getattr(request, "accepted_renderer", None), "format", None) == "csv":
            return None
        return super().paginate_queryset(queryset, request, view)

    def get_limit(self, request):
        limit = self._number(request, self.limit_query_param, 1)
        return self.default_limit if limit is None else min(limit, self.max_limit)

    def get_offset(self, request):
        return self._number(request, self.offset_query_param, 0) or 0
