"""Turns the domain's refusals into API responses (REST_FRAMEWORK["EXCEPTION_HANDLER"]).

- a `config.errors.Refusal` (a rule refused the change; the fleet's `PlacementError`): 400 with
  `detail` and `violations`, each `{"rule", "message"}`, so a script can match the rule and a
  person can read the numbers.
- a `ConflictRefusal` (the data changed between the check and the write; the fleet's
  `FleetConflict`): 409, same shape.
- deleting a row that others still refer to (Django's `ProtectedError`; the viewsets raise
  `Conflict` with the object's name): 409 naming what refers to it.
- an `IntegrityError` that validation could not foresee (two requests racing for one unique
  value): 409 instead of a 500.
Everything else goes to DRF's own handler.
"""

import re
from collections import Counter

from django.db import IntegrityError
from django.db.models import ProtectedError, RestrictedError
from rest_framework import status
from rest_framework.exceptions import APIException
from rest_framework.response import Response
from rest_framework.views import exception_handler as drf_exception_handler
from rest_framework.views import set_rollback

from config.errors import ConflictRefusal, Refusal


class Conflict(APIException):
    status_code = status.HTTP_409_CONFLICT
    default_detail = "The request conflicts with the current state of the fleet."
    default_code = "conflict"


def refusal_body(exc: Refusal) -> dict:
    return {"detail": str(exc), "violations": exc.violation_dicts()}


def _spell(noun: str) -> str:
    """Model verbose names with NVIDIA's spelling: "vgpu profiles" -> "vGPU profiles", "gpu" -> "GPU"."""
    return re.sub(r"\b(v?)gpu", lambda m: f"{m.group(1)}GPU", str(noun))


def in_use_message(exc: ProtectedError | RestrictedError, instance=None) -> str:
    """E.g. "Cannot delete host render-01: 1 GPU and 1 virtual machine still refer to it. ..."."""
    blockers = getattr(exc, "protected_objects", None) or getattr(exc, "restricted_objects", ())
    counts = Counter(obj._meta for obj in blockers)
    parts = sorted(
        f"{n} {_spell(meta.verbose_name_plural if n > 1 else meta.verbose_name)}" for meta, n in counts.items()
    )
    what = f"{_spell(instance._meta.verbose_name)} {instance}" if instance is not None else "this object"
    return (f"Cannot delete {what}: {' and '.join(parts) or 'other objects'} still refer to it. "
            f"Remove or move them first.")


def exception_handler(exc, context):
    if isinstance(exc, Refusal):
        set_rollback()
        code = status.HTTP_409_CONFLICT if isinstance(exc, ConflictRefusal) else status.HTTP_400_BAD_REQUEST
        return Response(refusal_body(exc), status=code)
    if isinstance(exc, (ProtectedError, RestrictedError)):
        exc = Conflict(in_use_message(exc))
    elif isinstance(exc, IntegrityError):
        exc = Conflict(
            "The change conflicts with the current inventory (another request changed it meanwhile); "
            "reload and try again.",
        )
    return drf_exception_handler(exc, context)
