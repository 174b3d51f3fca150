"""`api-tokens/`: the API tokens scripts sign in with, listed, issued and revoked over the API.

- Every signed-in user manages their own tokens (artists included); fleet admins see everyone's
  (`?user=<id or user name>` narrows the list) and may issue one for another user (`user`).
- `POST` answers 201 with the token and its `key`, shown this once: only its digest is kept.
  `expires_at` (a time) or `expires_in` (a lifetime: `90d`, `12h`, `2w`) sets an expiry;
  without either the token never expires. `scope` is read, write (the default) or ingest.
- `POST {id}/revoke/` with an optional `reason` revokes a token and keeps it listed (state
  `revoked`, with when, why and by whom); its key is answered 401 "Token revoked on ...
  (reason)" from the next request on. There is no DELETE: a revoked token's row is what tells
  a script why its key stopped working. Revoking it again is a 409.
- A request signed with an API token creates tokens no broader than that token: a scope it
  covers (`fleet.token_rules.covers`) and an expiry no later than its own, where it has one.
  A read token cannot create at all (a POST is a write) and an ingest token cannot reach
  this endpoint (`fleet.api.authentication`).
"""

from __future__ import annotations

from datetime import UTC

from django.db.models import QuerySet
from django.utils import timezone
from drf_spectacular.utils import OpenApiResponse, extend_schema
from rest_framework import mixins, serializers, status, viewsets
from rest_framework.decorators import action
from rest_framework.permissions import IsAuthenticated
from rest_framework.response import Response

from config.api.exceptions import Conflict
from config.api.serializers import DetailSerializer
from config.parsing import ParseError
from config.roles import is_fleet_admin
from fleet import api_tokens, queries, token_rules
from fleet.choices import TokenScope, TokenState
from fleet.filtersets import ApiTokenFilterSet
from fleet.models import ApiToken


class UserOfRequesterField(serializers.PrimaryKeyRelatedField):
    """A user id among those the requester may see (`fleet.queries.visible_users`): an artist
    can name only themselves, and another id is "does not exist" whether it exists or not."""

    def get_queryset(self):
        request = self.context.get("request")
        return queries.visible_users(getattr(request, "user", None))


class ApiTokenSerializer(serializers.ModelSerializer):
    """An API token as lists show it: never its key, nor the key's digest."""

    user = UserOfRequesterField(
        required=False,
        help_text="The user the token acts as (id). Default: the requester; only fleet admins name another user",
    )
    # `ApiToken.state()`, called by DRF with no argument: the state now.
    state = serializers.ChoiceField(choices=TokenState.choices, read_only=True,
                                    help_text="active, expired or revoked, now")
    expires_at = serializers.DateTimeField(
        required=False, allow_null=True,
        help_text="When the token stops working (ISO 8601; without an offset: the server's time zone). Null: never. "
                  "On create, give this or `expires_in`, not both",
    )
    expires_in = serializers.CharField(
        write_only=True, required=False, allow_blank=True, max_length=20,
        help_text=f"On create, instead of `expires_at`: {token_rules.LIFETIME_HELP}, counted from now",
    )

    class Meta:
        model = ApiToken
        fields = ["id", "user", "name", "prefix", "scope", "created_at", "expires_at", "expires_in", "last_used_at",
                  "state", "revoked_at", "revoked_reason", "revoked_by"]
        read_only_fields = ["prefix", "created_at", "last_used_at", "revoked_at", "revoked_reason", "revoked_by"]
        extra_kwargs = {
            "name": {"help_text": "What the token is for, e.g. 'render farm sync'"},
            "scope": {"help_text": "read: GET only; write: reads and writes (default); ingest: only pushing samples "
                                   "to /api/v1/ingest/ endpoints, nothing else (reads included)"},
            "prefix": {"help_text": "The key's first 8 characters: tells tokens apart, names one to revoke"},
            "last_used_at": {"help_text": "Last request signed with the token (written at most once a minute); null: "
                                          "never used"},
            "revoked_at": {"help_text": "When it was revoked; null while not revoked"},
            "revoked_reason": {"help_text": "Why it was revoked, as its key's 401 says"},
            "revoked_by": {"help_text": "Who revoked it (user id); null for a command or a deleted user"},
        }

    def validate_expires_at(self, value):
        if value is not None:
            try:
                value.astimezone(UTC)
            except (OverflowError, ValueError):  # year 1 or 9999 shifted past what a datetime holds
                raise serializers.ValidationError("Out of range: use a time from 1970 up to 9000.") from None
        return value

    def validate(self, attrs):
        request = self.context["request"]
        signed_with = request.auth if isinstance(request.auth, ApiToken) else None
        now = timezone.now()
        lifetime = (attrs.pop("expires_in", "") or "").strip()
        if lifetime and attrs.get("expires_at") is not None:
            raise serializers.ValidationError({"expires_in": ["Give expires_at or expires_in, not both."]})
        field = "expires_in" if lifetime else "expires_at"
        try:
            if lifetime:
                attrs["expires_at"] = now + token_rules.parse_lifetime(lifetime)
            token_rules.check_expiry(attrs.get("expires_at"), now=now, tz=timezone.get_current_timezone(),
                                     ceiling=signed_with.expires_at if signed_with else None)
        except ParseError as exc:
            raise serializers.ValidationError({field: [str(exc)]}) from None
        scope = attrs.setdefault("scope", TokenScope.WRITE)
        if signed_with is not None and not token_rules.covers(signed_with.scope, scope):
            raise serializers.ValidationError({"scope": [
                f"The API token this request is signed with has scope {signed_with.scope}: it may create tokens of "
                f"scope {signed_with.scope} only."]})
        user = attrs.setdefault("user", request.user)
        if not user.is_active:
            raise serializers.ValidationError({"user": [f"{user.get_username()} is inactive: a token of theirs "
                                                        f"would be refused."]})
        return attrs


class ApiTokenIssuedSerializer(ApiTokenSerializer):
    """A token just issued, with its key: the only answer that ever carries it."""

    key = serializers.SerializerMethodField(
        help_text="The key, shown this once (only its digest is stored): send it as `Authorization: Token <key>`")

    class Meta(ApiTokenSerializer.Meta):
        fields = [*ApiTokenSerializer.Meta.fields, "key"]

    def get_key(self, token: ApiToken) -> str:
        return self.context["key"]


class RevokeSerializer(serializers.Serializer):
    reason = serializers.CharField(
        required=False, allow_blank=True, default="", max_length=api_tokens.MAX_REASON,
        help_text="Why: shown to whoever presents the key afterwards (\"Token revoked on ... (reason)\")")


class ApiTokenViewSet(mixins.ListModelMixin, mixins.RetrieveModelMixin, mixins.CreateModelMixin,
                      viewsets.GenericViewSet):
    """API tokens: your own (fleet admins: everyone's), newest first; another user's is 404."""

    serializer_class = ApiTokenSerializer
    permission_classes = [IsAuthenticated]
    filterset_class = ApiTokenFilterSet
    ordering_fields = ["created_at", "expires_at", "last_used_at", "id"]

    def get_queryset(self) -> QuerySet[ApiToken]:
        if getattr(self, "swagger_fake_view", False):
            return ApiToken.objects.none()
        tokens = ApiToken.objects.select_related("user").order_by("-created_at", "-id")
        user = self.request.user
        return tokens if is_fleet_admin(user) else tokens.filter(user=user)

    @extend_schema(responses={201: ApiTokenIssuedSerializer})
    def create(self, request, *args, **kwargs):
        """Issue a token; the answer carries its `key`, this once."""
        serializer = self.get_serializer(data=request.data)
        serializer.is_valid(raise_exception=True)
        data = serializer.validated_data
        token, key = api_tokens.issue_token(data["user"], data.get("name", ""), scope=data["scope"],
                                            expires_at=data.get("expires_at"))
        body = ApiTokenIssuedSerializer(token, context={**self.get_serializer_context(), "key": key}).data
        return Response(body, status=status.HTTP_201_CREATED)

    @extend_schema(request=RevokeSerializer, responses={
        200: ApiTokenSerializer, 409: OpenApiResponse(DetailSerializer, description="Already revoked (when, why)")})
    @action(detail=True, methods=["post"])
    def revoke(self, request, pk=None, format=None):
        """Revoke the token: its key is refused from the next request on, with when and why; the
        token stays listed (state `revoked`)."""
        body = RevokeSerializer(data=request.data)
        body.is_valid(raise_exception=True)
        token = self.get_object()
        try:
            api_tokens.revoke_token(token, reason=body.validated_data["reason"], by=request.user)
        except api_tokens.AlreadyRevoked as exc:
            raise Conflict(str(exc)) from None
        return Response(self.get_serializer(token).data)
