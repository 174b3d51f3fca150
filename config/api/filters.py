"""Filter backends every app's API uses."""

from rest_framework.filters import OrderingFilter


class StableOrderingFilter(OrderingFilter):
    """`?ordering=` with `id` appended as a tiebreak, so limit/offset pages never repeat or skip
    rows that share a value (e.g. many hosts with the same `cpu_threads`)."""

    def get_ordering(self, request, queryset, view):
        ordering = super().get_ordering(request, queryset, view)
        if ordering and not {"id", "-id", "pk", "-pk"} & set(ordering):
            ordering = [*ordering, "id"]
        return ordering
