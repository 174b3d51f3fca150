"""The schema class of every API view (REST_FRAMEWORK["DEFAULT_SCHEMA_CLASS"]): drf-spectacular's,
documenting `?expand=` on the reads of resources that have related objects (`config.api.filters`).
Every operation lists the CSV media type (`?format=csv`): a list as a table, anything else (one object, an
error) as `field,value` rows (the one CSV writer, `CsvRenderer`)."""

from __future__ import annotations

from drf_spectacular.openapi import AutoSchema as SpectacularAutoSchema
from drf_spectacular.types import OpenApiTypes
from drf_spectacular.utils import OpenApiParameter

from config.api.filters import EXPAND_PARAM, expandable_fields


class AutoSchema(SpectacularAutoSchema):
    def get_override_parameters(self):
        parameters = list(super().get_override_parameters())
        expandable = expandable_fields(self.view)
        if self.method == "GET" and expandable:
            parameters.append(OpenApiParameter(
                EXPAND_PARAM, OpenApiTypes.STR, explode=False,
                description=(
                    f"Related objects to read as nested `{{id, url, display}}` instead of ids: comma-separated, "
                    f"of {', '.join(expandable)}, or `all`. Without it ids stay ids. An unknown name is a 400."),
            ))
        return parameters
