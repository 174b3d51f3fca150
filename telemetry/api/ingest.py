"""`POST /api/v1/ingest/nvidia-smi/`: hosts where no agent runs push `nvidia-smi -q -x` documents.

Authentication is the pushing Agent's bearer token (`Authorization: Bearer <token>`), found
by its SHA-256 (`Agent.token_sha256`): the lookup compares hashes, so response time reveals
nothing about the token, and the token is then checked, in constant time, against the one
derived from the current AGENT_TOKEN_KEY (a new key revokes every token; rotate each push
agent's token afterwards). Agent tokens authenticate here and nowhere else: the other API
views accept user tokens (`Token <key>`) and sessions only; `request.user` stays anonymous,
so no user permission can ever pass on an agent token.

A fleet admin's API token (`Token <key>`) of scope `ingest` (the scope made for this: it
opens nothing else) or `write` may push too, for the agent it names with `?agent=<name>`: one
key for a cron job that pushes for several hosts. The document is then stored exactly as if
that agent had pushed it (its scope, its bookkeeping). Sessions are not accepted here.

A token writes only within its agent's scope (`telemetry.ingest`, "Scope"): a push agent bound
to a host stores that host's GPUs and the VMs placed on them; one bound to a VM (in-guest
pushes, `?hostname=` defaults to that VM) stores that VM's vGPU readings only. The parts of a
document outside the scope are dropped and recorded as drift on the agent, and the answer
counts them (`out_of_scope`); the rest is stored. A document the agent may not send at all
(its agent bound to nothing and the host it names already in the inventory) is refused with
403, one naming more unknown GPUs than TELEMETRY_MAX_NEW_GPUS with 400, nothing of either
stored.

The push path does the agent bookkeeping the collector does for polled agents: success sets
`last_seen` (and `clock_skew_s`, the document's resolved stamp minus our clock); a refused
document (malformed, an XML bomb, too large, stamped too far off) sets `last_error` and
`last_error_at`, so the agent shows as failing in the admin.
"""

from __future__ import annotations

import hashlib
import hmac
import time
from datetime import UTC, datetime

from django.conf import settings
from django.db.models import F
from drf_spectacular.extensions import OpenApiAuthenticationExtension
from drf_spectacular.plumbing import build_bearer_security_scheme_object
from drf_spectacular.types import OpenApiTypes
from drf_spectacular.utils import OpenApiParameter, OpenApiResponse, extend_schema
from rest_framework import exceptions, serializers, status
from rest_framework.authentication import BaseAuthentication, get_authorization_header
from rest_framework.parsers import BaseParser
from rest_framework.permissions import BasePermission
from rest_framework.response import Response
from rest_framework.views import APIView

from config.api.serializers import InvalidOrRefusedSerializer
from config.roles import is_fleet_admin
from fleet.api.authentication import ApiTokenAuthentication
from fleet.models import ApiToken
from telemetry.ingest import store_reports
from telemetry.models import Agent, AgentKind
from telemetry.payload import MAX_HOSTNAME, PayloadError
from telemetry.sources.nvidia_smi import parse_nvidia_smi

REALM = "vgpu-fleet-ingest"
XML_MEDIA_TYPES = ("application/xml", "text/xml")


class _AgentPrincipal:
    """request.user of an agent request: not a user, never authenticated as one."""

    is_authenticated = False
    is_active = False
    is_staff = False
    is_superuser = False
    pk = id = None


class AgentTokenAuthentication(BaseAuthentication):
    """`Authorization: Bearer <agent token>` -> (anonymous principal, Agent)."""

    keyword = "Bearer"

    def authenticate(self, request):
        header = get_authorization_header(request).split()
        if not header or header[0].lower() != self.keyword.lower().encode():
            return None
        if len(header) != 2:
            raise exceptions.AuthenticationFailed("Invalid bearer header: expected 'Bearer <agent token>'.")
        digest = hashlib.sha256(header[1]).hexdigest()
        agent = Agent.objects.filter(token_sha256=digest).select_related("host", "vm").first()
        # The stored hash finds the agent; the token must also be the one derived from today's
        # AGENT_TOKEN_KEY, so changing the key revokes pushed tokens as it does polled ones.
        if agent is None or not hmac.compare_digest(header[1], agent.token.encode()):
            raise exceptions.AuthenticationFailed("Invalid agent token.")
        return _AgentPrincipal(), agent

    def authenticate_header(self, request):
        return f'Bearer realm="{REALM}"'


class AgentTokenScheme(OpenApiAuthenticationExtension):
    target_class = AgentTokenAuthentication
    name = "agentToken"

    def get_security_definition(self, auto_schema):
        return build_bearer_security_scheme_object(header_name="Authorization", token_prefix="Bearer")


def push_refusal(agent: Agent) -> str | None:
    """Why `agent` may not push documents (None: it may): it must be enabled and of kind nvidia-smi."""
    if not agent.enabled:
        return f"Agent {agent.name} is disabled; an admin must enable it before it can push."
    if agent.kind != AgentKind.NVIDIA_SMI:
        return (f"Agent {agent.name} is of kind {agent.kind}; only nvidia-smi agents push documents "
                f"(the others are polled).")
    return None


class MayPush(BasePermission):
    """The token of an enabled nvidia-smi agent, or a fleet admin's API token (whose scope,
    ingest or write, its authentication checked; the agent it names is checked by the view)."""

    def has_permission(self, request, view) -> bool:
        if isinstance(request.auth, Agent):
            refusal = push_refusal(request.auth)
            if refusal is not None:
                self.message = refusal
            return refusal is None
        if isinstance(request.auth, ApiToken):
            if is_fleet_admin(request.user):
                return True
            self.message = "Only a fleet admin's API token may push documents for an agent."
        return False


def pushing_agent(request) -> Agent:
    """The agent a push is stored for: the agent whose token signs it, or, for an API token, the
    enabled nvidia-smi agent named by `?agent=` (400 without one or for an unknown name, 403 for
    one that may not push). An agent token may name only itself."""
    name = request.query_params.get("agent", "").strip()
    if isinstance(request.auth, Agent):
        if name and name != request.auth.name:
            raise exceptions.ValidationError({"agent": [
                f"This agent token pushes for agent {request.auth.name} only; leave ?agent= out."]})
        return request.auth
    if not name:
        raise exceptions.ValidationError({"agent": [
            "Required with an API token: the name of the nvidia-smi agent this document is pushed for."]})
    found = None
    if "\x00" not in name and len(name) <= Agent._meta.get_field("name").max_length:  # PostgreSQL refuses NUL
        found = Agent.objects.filter(name=name).select_related("host", "vm").first()
    if found is None:
        raise exceptions.ValidationError({"agent": [f"No agent is named {name[:100]!r}."]})
    refusal = push_refusal(found)
    if refusal is not None:
        raise exceptions.PermissionDenied(refusal)
    return found


class PayloadTooLarge(exceptions.APIException):
    status_code = status.HTTP_413_REQUEST_ENTITY_TOO_LARGE
    default_code = "payload_too_large"


class XmlDocumentParser(BaseParser):
    """The raw body as bytes, at most TELEMETRY_MAX_RESPONSE_BYTES (larger: 413, unread)."""

    media_type = "application/xml"

    def parse(self, stream, media_type=None, parser_context=None) -> bytes:
        limit = settings.TELEMETRY_MAX_RESPONSE_BYTES
        too_large = PayloadTooLarge(f"The document exceeds {limit} bytes (TELEMETRY_MAX_RESPONSE_BYTES).")
        request = (parser_context or {}).get("request")
        try:
            declared = int(request.META.get("CONTENT_LENGTH") or 0) if request is not None else 0
        except ValueError:
            declared = 0
        if declared > limit:
            raise too_large
        body = stream.read(limit + 1) if stream is not None else b""
        if len(body) > limit:
            raise too_large
        return body


class TextXmlDocumentParser(XmlDocumentParser):
    media_type = "text/xml"


class IngestResultSerializer(serializers.Serializer):
    gpu_samples = serializers.IntegerField(help_text="GPU samples stored (0 when this document was stored before)")
    vgpu_samples = serializers.IntegerField(help_text="vGPU samples stored")
    drifts = serializers.IntegerField(help_text="Differences from the inventory found (see the admin's Drift list)")
    discovered_gpus = serializers.IntegerField(help_text="GPUs added to the inventory from this document")
    out_of_scope = serializers.IntegerField(
        help_text="Readings not stored because they name a GPU or VM outside the agent's host (or VM); each is "
                  "recorded as drift on the agent",
    )


class IngestErrorSerializer(serializers.Serializer):
    detail = serializers.CharField()


def _error(description: str) -> OpenApiResponse:
    return OpenApiResponse(IngestErrorSerializer, description=description)


class NvidiaSmiIngestView(APIView):
    """Stores one `nvidia-smi -q -x` document pushed by an nvidia-smi agent."""

    authentication_classes = [AgentTokenAuthentication, ApiTokenAuthentication]
    permission_classes = [MayPush]
    parser_classes = [XmlDocumentParser, TextXmlDocumentParser]
    throttle_classes = []
    #: API tokens of scope ingest may reach this view (`fleet.token_rules`).
    api_token_ingest = True

    @extend_schema(
        operation_id="ingest_nvidia_smi",
        summary="Push an nvidia-smi document",
        description=(
            "Body: the output of `nvidia-smi -q -x` (Content-Type application/xml or text/xml), e.g. "
            "`nvidia-smi -q -x | curl --fail -H \"Authorization: Bearer $TOKEN\" -H 'Content-Type: application/xml' "
            "--data-binary @- https://fleet/api/v1/ingest/nvidia-smi/`. Unknown GPUs (and their GPU model) are "
            "added to the agent's host, at most TELEMETRY_MAX_NEW_GPUS per document; differences from the inventory "
            "are recorded as drift. A document sent twice is stored once. The token writes only its agent's scope: "
            "the GPUs of its host and the VMs placed on them, or, for an agent bound to a VM (in-guest pushes), that "
            "VM's vGPU; readings of any other GPU or VM are not stored, counted in `out_of_scope` and recorded as "
            "drift. An agent bound to no host is bound by its first document to the new host that document "
            "introduces. A fleet admin's API token (`Authorization: Token <key>`, scope ingest or write) pushes for "
            "the agent named by `?agent=`, as if that agent had pushed."
        ),
        request={"application/xml": OpenApiTypes.STR, "text/xml": OpenApiTypes.STR},
        parameters=[
            OpenApiParameter(
                "hostname", str, description="Host (or, from inside a VM, the VM) the document is from; default: the "
                                             "agent's VM or host, else the agent's name",
            ),
            OpenApiParameter(
                "agent", str, description="With an API token (required then): the name of the nvidia-smi agent the "
                                          "document is pushed for. With an agent token: its own name, or left out",
            ),
        ],
        responses={
            201: IngestResultSerializer,
            400: OpenApiResponse(InvalidOrRefusedSerializer, description=(
                "Malformed document, refused XML (entities), a stamp too far from the server's clock, or more "
                "unknown GPUs than TELEMETRY_MAX_NEW_GPUS (`detail`); nothing stored, recorded on the agent. With an "
                "API token: `agent` missing or naming no agent (field messages)")),
            401: _error("Missing or invalid agent token or API token (revoked or expired: the message says when)"),
            403: _error("The agent is disabled, is not of kind nvidia-smi, or is bound to no host or VM and may not "
                        "introduce the host its document names (one in the inventory: an admin binds the agent); an "
                        "API token of a user who is not a fleet admin, or of scope read"),
            413: _error("Larger than TELEMETRY_MAX_RESPONSE_BYTES"),
            415: _error("Content-Type is not application/xml or text/xml"),
        },
        tags=["ingest"],
    )
    def post(self, request):
        agent = pushing_agent(request)
        received_at = time.time()
        try:
            document = request.data
            if not isinstance(document, bytes):  # DRF parses no empty body, nor one without Content-Type
                if request.content_type.split(";")[0].strip().lower() not in XML_MEDIA_TYPES:
                    raise exceptions.UnsupportedMediaType(
                        request.content_type or "none", "Content-Type must be application/xml or text/xml.")
                document = b""
        except exceptions.APIException as exc:
            _record_failure(agent, received_at, str(exc.detail))
            raise
        hostname = request.query_params.get("hostname", "").strip()
        if len(hostname) > MAX_HOSTNAME:
            message = f"hostname: at most {MAX_HOSTNAME} characters"
            _record_failure(agent, received_at, message)
            return Response({"detail": message}, status=status.HTTP_400_BAD_REQUEST)
        hostname = hostname or (agent.vm.name if agent.vm else agent.host.name if agent.host else agent.name)
        try:
            if not document:
                raise PayloadError("empty body: expected an nvidia-smi -q -x document")
            report = parse_nvidia_smi(document, hostname=hostname, received_at=received_at)
        except PayloadError as exc:
            _record_failure(agent, received_at, str(exc))
            return Response({"detail": str(exc)}, status=status.HTTP_400_BAD_REQUEST)
        stats = store_reports([(agent, report)], received_at=received_at)
        if agent.pk in stats.errors:
            _record_failure(agent, received_at, stats.errors[agent.pk])
            refused = status.HTTP_403_FORBIDDEN if agent.pk in stats.forbidden else status.HTTP_400_BAD_REQUEST
            return Response({"detail": stats.errors[agent.pk]}, status=refused)
        moment = datetime.fromtimestamp(received_at, tz=UTC)
        Agent.objects.filter(pk=agent.pk).update(
            last_seen=moment, last_attempt=moment, consecutive_failures=0,
            clock_skew_s=round(report.collected_at - received_at, 3),
        )
        body = {"gpu_samples": stats.gpu_samples, "vgpu_samples": stats.vgpu_samples, "drifts": stats.drifts,
                "discovered_gpus": stats.discovered_gpus, "out_of_scope": stats.out_of_scope}
        return Response(body, status=status.HTTP_201_CREATED)


def _record_failure(agent: Agent, received_at: float, message: str) -> None:
    """Show the refusal on the agent (admin list, status "error"); an update, so no save() races."""
    moment = datetime.fromtimestamp(received_at, tz=UTC)
    Agent.objects.filter(pk=agent.pk).update(
        last_error=f"nvidia-smi push refused: {message}", last_error_at=moment, last_attempt=moment,
        consecutive_failures=F("consecutive_failures") + 1,
    )
