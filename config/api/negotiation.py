"""DRF's choice of renderer, remembered per process.

Every API request asks which renderer answers it (JSON, the browsable API, CSV), from its format
suffix, its `?format=` and its Accept header: DRF parses the header into media types and matches
them against each renderer, about 5 % of a cached list request's CPU under load (bench/load.py).
Scripts send the same few headers again and again, so the answer for each (renderers, format,
Accept) is kept and reused. What is kept is bounded (MAX_KEPT): once full, other headers are
negotiated each time, so headers sent at random cost memory once and never change an answer.
Refusals (406, an unknown format's 404) are not kept: they raise as before.
The query string is parsed for `?format=` only when it may hold it.
"""

from __future__ import annotations

from rest_framework.negotiation import DefaultContentNegotiation

MAX_KEPT = 256

#: (renderer classes, format, Accept) -> (index of the renderer in the view's list, media type).
_chosen: dict[tuple, tuple[int, str]] = {}


class KeptContentNegotiation(DefaultContentNegotiation):
    def select_renderer(self, request, renderers, format_suffix=None):
        format = format_suffix or self._format_asked(request)
        key = (tuple(type(renderer) for renderer in renderers), format, request.META.get("HTTP_ACCEPT"))
        kept = _chosen.get(key)
        if kept is not None:
            index, media_type = kept
            return renderers[index], media_type
        renderer, media_type = super().select_renderer(request, renderers, format_suffix)
        if len(_chosen) < MAX_KEPT:
            _chosen[key] = (next(i for i, candidate in enumerate(renderers) if candidate is renderer), media_type)
        return renderer, media_type

    def _format_asked(self, request) -> str | None:
        """`?format=`, without parsing the query string when it cannot hold one (most requests:
        the list's own parameters are parsed later, from the query string as it is)."""
        name = self.settings.URL_FORMAT_OVERRIDE
        query = request.META.get("QUERY_STRING", "")
        if not name or (name not in query and "%" not in query):
            return None
        return request.query_params.get(name)
