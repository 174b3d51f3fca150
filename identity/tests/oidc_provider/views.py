"""The test provider's user management: what a studio's IT does in its directory's console."""

import hmac
import json

from django.conf import settings
from django.contrib.auth.models import Group, User
from django.http import HttpResponseForbidden, JsonResponse
from django.views.decorators.csrf import csrf_exempt
from django.views.decorators.http import require_http_methods


@csrf_exempt
@require_http_methods(["PUT"])
def put_user(request, username: str):
    """Create or update the user `username` from a JSON body {password, email, first_name,
    last_name, groups: [names]} (groups replaced, created as needed); answers their `sub`."""
    expected = f"Bearer {settings.ADMIN_TOKEN}"
    if not hmac.compare_digest(request.headers.get("Authorization", ""), expected):
        return HttpResponseForbidden("token required")
    body = json.loads(request.body)
    user, _ = User.objects.get_or_create(username=username)
    user.email = body.get("email", "")
    user.first_name = body.get("first_name", "")
    user.last_name = body.get("last_name", "")
    # A new password ends the user's sessions here (Django's session hash): only when it changes.
    if "password" in body and not user.check_password(body["password"]):
        user.set_password(body["password"])
    user.save()
    user.groups.set([Group.objects.get_or_create(name=name)[0] for name in body.get("groups", [])])
    return JsonResponse({"sub": str(user.pk)})
