"""Request body size limit: a body larger than DATA_UPLOAD_MAX_MEMORY_SIZE is refused with 413
and a message saying the limit, before any of it is read.

Django alone refuses an oversize form or JSON body only when a view reads it, with a bare
"Bad Request (400)" page, and never counts file parts of multipart bodies (which the API's
parsers accept) against the limit. Here the declared Content-Length is checked first for
every request; under WSGI a body without Content-Length reads as empty, so none slips past.
Paths in REQUEST_BODY_LIMIT_EXEMPT enforce their own limit (the nvidia-smi push takes larger
documents, up to TELEMETRY_MAX_RESPONSE_BYTES, and records a refusal on its agent).
"""

from __future__ import annotations

from django.conf import settings
from django.http import HttpResponse, JsonResponse

from config.api import is_api


def too_large_message(limit_bytes: int) -> str:
    return (f"The request body is larger than {limit_bytes} bytes, the most this server accepts "
            f"(DATA_UPLOAD_MAX_MEMORY_SIZE).")


def too_large(request, limit_bytes: int) -> HttpResponse:
    """413 in the caller's language: JSON `{"detail"}` for the API, plain text for pages."""
    message = too_large_message(limit_bytes)
    if is_api(request):
        return JsonResponse({"detail": message}, status=413)
    return HttpResponse(message + "\n", status=413, content_type="text/plain; charset=utf-8")


class RequestBodyLimitMiddleware:
    def __init__(self, get_response):
        self.get_response = get_response

    def __call__(self, request):
        limit_bytes = settings.DATA_UPLOAD_MAX_MEMORY_SIZE
        exempt = any(request.path.startswith(prefix) for prefix in settings.REQUEST_BODY_LIMIT_EXEMPT)
        if limit_bytes is not None and not exempt:
            try:
                declared_bytes = int(request.META.get("CONTENT_LENGTH") or 0)
            except ValueError:
                declared_bytes = 0
            if declared_bytes > limit_bytes:
                return too_large(request, limit_bytes)
        return self.get_response(request)
