"""The root of the v1 API (`GET /api/v1/`): every resource of every app's router, and the
endpoints routed by hand (time series, heatmap, planner, ingest), each with its address.

Each app keeps its own router (STYLE.md); DRF's DefaultRouter would list only its own app's
resources, and the first one mounted would hide the others.
"""

from __future__ import annotations

from collections.abc import Iterable

from django.urls import NoReverseMatch
from rest_framework import routers
from rest_framework.response import Response
from rest_framework.reverse import reverse


class ApiRootView(routers.APIRootView):
    """The v1 API's resources: list addresses, and the endpoints that take an object's id."""

    #: name -> URL name of the resource's list (or of a view without arguments).
    api_root_dict: dict[str, str] = {}
    #: name -> address template of an endpoint that needs an id, e.g. "/api/v1/gpus/{id}/metrics/".
    templates: dict[str, str] = {}

    def get(self, request, *args, **kwargs):
        answer = {}
        for name, url_name in sorted(self.api_root_dict.items()):
            try:
                answer[name] = reverse(url_name, request=request, format=kwargs.get("format"))
            except NoReverseMatch:  # pragma: no cover - every registered route reverses
                continue
        # `{id}` as written: build_absolute_uri would quote it as %7Bid%7D, which no script fills in.
        origin = request.build_absolute_uri("/").rstrip("/")
        for name, template in sorted(self.templates.items()):
            answer[name] = origin + template
        return Response(answer)


def root_view(app_routers: Iterable[routers.BaseRouter], views: dict[str, str], templates: dict[str, str]):
    """The root view over the routers' registries plus `views` (name -> URL name)."""
    listed = {prefix: f"{basename}-list" for router in app_routers for prefix, _, basename in router.registry}
    return ApiRootView.as_view(api_root_dict={**listed, **views}, templates=templates)
