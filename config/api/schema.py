"""The schema class of every API view (REST_FRAMEWORK["DEFAULT_SCHEMA_CLASS"]): drf-spectacular's,
documenting `?expand=` on the reads of resources that have related objects (`config.api.filters`),
and `text/csv` (`?format=csv`) on lists only: elsewhere CSV is a fallback of `field,value` rows."""

from __future__ import annotations

from drf_spectacular.openapi import AutoSchema as SpectacularAutoSchema
from drf_spectacular.types import OpenApiTypes
from drf_spectacular.utils import OpenApiParameter

from config.api.filters import EXPAND_PARAM, expandable_fields


class AutoSchema(SpectacularAutoSchema):
    def map_renderers(self, attribute):
        media_types = super().map_renderers(attribute)
        if self._is_list_view():
            return media_types
        return [media_type for media_type in media_types if not str(media_type).startswith("text/csv")]

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
