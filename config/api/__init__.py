"""Plumbing every app's API shares: how a JSON body is read, how ids appear in paths, and what
an error outside any view looks like under /api/.

- JSON bodies nested deeper than MAX_JSON_DEPTH levels are a 400. Python's decoder recurses
  once per level, so `[` * 100,000 would end in a RecursionError (a 500) before any field is
  validated; no request of the API nests more than a few levels.
- Ids in API paths are ASCII digits (config/routers.py).
- Under /api/, a path no route matches is a JSON 404 (`{"detail": "Not found."}`), and Django's
  own 400 and 500 are JSON too, in the shape of DRF's errors; the pages keep their HTML.
"""

from __future__ import annotations

from typing import Any

from django.http import JsonResponse
from django.views import defaults
from rest_framework import parsers
from rest_framework.exceptions import ParseError

API_PREFIX = "/api/"
#: Deepest nesting of arrays and objects a JSON body may have.
MAX_JSON_DEPTH = 32


def nested_deeper_than(value: Any, limit: int) -> bool:
    """Whether arrays and objects in `value` nest more than `limit` levels (walked without recursion)."""
    stack = [(value, 1)]
    while stack:
        node, depth = stack.pop()
        if isinstance(node, dict):
            children = node.values()
        elif isinstance(node, list):
            children = node
        else:
            continue
        if depth > limit:
            return True
        stack.extend((child, depth + 1) for child in children)
    return False


class JSONParser(parsers.JSONParser):
    """DRF's JSON parser, with a 400 for a body nested deeper than MAX_JSON_DEPTH."""

    def parse(self, stream, media_type=None, parser_context=None):
        too_deep = ParseError(f"JSON parse error - arrays and objects nest deeper than {MAX_JSON_DEPTH} levels.")
        try:
            data = super().parse(stream, media_type, parser_context)
        except RecursionError:
            raise too_deep from None
        if nested_deeper_than(data, MAX_JSON_DEPTH):
            raise too_deep
        return data


def is_api(request) -> bool:
    """Whether `request` is the API's: its errors answer in JSON, the pages' in HTML."""
    return request.path.startswith(API_PREFIX)


def page_not_found(request, exception):
    if is_api(request):
        return JsonResponse({"detail": "Not found."}, status=404)
    return defaults.page_not_found(request, exception)


def bad_request(request, exception):
    if is_api(request):
        return JsonResponse({"detail": "Bad request."}, status=400)
    return defaults.bad_request(request, exception)


def server_error(request):
    if is_api(request):
        return JsonResponse({"detail": "A server error occurred."}, status=500)
    return defaults.server_error(request)


class ApiNotFoundMiddleware:
    """Under /api/, a path no route matches answers the JSON 404 in every mode.

    `handler404` above serves it with DEBUG off; with DEBUG on Django answers its HTML debug page
    instead, and a script run against a development server would get HTML. Innermost, so
    CommonMiddleware still sees the 404 and redirects `/api/v1/hosts` to `/api/v1/hosts/`.
    A route that matched and answered 404 itself (an unknown id) keeps its own answer.
    """

    def __init__(self, get_response):
        self.get_response = get_response

    def __call__(self, request):
        response = self.get_response(request)
        if response.status_code == 404 and is_api(request) and getattr(request, "resolver_match", None) is None:
            return page_not_found(request, None)
        return response
