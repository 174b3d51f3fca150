from rest_framework.pagination import LimitOffsetPagination


class FleetPagination(LimitOffsetPagination):
    """limit/offset pages of `{count, next, previous, results}`, at most 500 rows a page."""

    default_limit = 50
    max_limit = 500
