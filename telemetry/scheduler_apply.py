"""Applying a GPU's scheduler policy through its host's agent.

An inline HTTP PUT with the agent's short timeout, offered only where the agent's last report
said it holds a write token (`Agent.scheduler_write`); the answer lands in the policy row's
apply_state / apply_detail / applied_at with a "scheduler_policy.apply" audit event. What the
policy is, and staging, are the fleet's (`fleet.scheduler_policies`).

The agent's write token is derived like its read token (HMAC of AGENT_TOKEN_KEY and the agent's
salt, with another label), so nothing new is stored: `python manage.py scheduler_write_token
<agent>` prints it for the agent's --write-token-file.
"""

from __future__ import annotations

import hashlib
import hmac
import json
import urllib.error
import urllib.request
from dataclasses import dataclass

from django.conf import settings as django_settings
from django.db import transaction
from django.utils import timezone

from fleet import audit, locks
from fleet.choices import SchedulerApplyState, SchedulerScope
from fleet.models import Gpu, SchedulerPolicy
from fleet.scheduler import SchedulerSettings
from fleet.scheduler_policies import gpu_scheduler, set_gpu_policy, settings_of
from telemetry.models import Agent, AgentKind


def agent_write_token(agent) -> str:
    """The token an agent needs in --write-token-file to accept scheduler changes; derived from
    AGENT_TOKEN_KEY and the agent's salt (rotating the agent's token revokes it too)."""
    key = (django_settings.AGENT_TOKEN_KEY or django_settings.SECRET_KEY).encode()
    return hmac.new(key, f"agent-write:{agent.token_salt}".encode(), hashlib.sha256).hexdigest()


def agent_for(gpu: Gpu):
    """The enabled fleet agent (kind nvml, polled) of the GPU's host, or None; one that said it
    holds a write token (Agent.scheduler_write) comes first."""
    return (Agent.objects.filter(host_id=gpu.host_id, enabled=True, kind=AgentKind.NVML).exclude(url="")
            .order_by("-scheduler_write", "name").first())


def read_only_message(agent, host_name: str) -> str:
    """Why an agent cannot apply a policy: it reports no write token. Names the command whose
    output goes into the agent's --write-token-file."""
    return (f"The agent of {host_name} runs without a write token: apply the commands by hand, or restart "
            f"{agent.name} with --write-token-file holding the output of "
            f"`python manage.py scheduler_write_token {agent.name}`.")


def agent_can_apply(gpu: Gpu, agent) -> bool:
    """Whether "Apply through the agent" can work for `gpu`: its host's agent holds a write token
    (as of its last report) and the GPU has a UUID to address it by."""
    return bool(gpu.uuid) and agent is not None and agent.scheduler_write


@dataclass
class AgentAnswer:
    status: int
    document: dict


def put_scheduler(agent, gpu_uuid: str, values: SchedulerSettings) -> AgentAnswer:
    """PUT the settings to the agent; status 0 when it could not be reached."""
    url = f"{agent.url.rstrip('/')}/v1/gpus/{gpu_uuid}/scheduler"
    body = json.dumps(values.as_dict()).encode()
    request = urllib.request.Request(url, data=body, method="PUT", headers={
        "Authorization": f"Bearer {agent_write_token(agent)}", "Content-Type": "application/json"})
    try:
        with urllib.request.urlopen(request, timeout=agent.timeout_s) as response:  # noqa: S310 (http(s) only)
            return AgentAnswer(response.status, json.loads(response.read() or b"{}"))
    except urllib.error.HTTPError as exc:
        try:
            document = json.loads(exc.read() or b"{}")
        except ValueError:
            document = {"error": f"HTTP {exc.code}"}
        return AgentAnswer(exc.code, document)
    except (urllib.error.URLError, TimeoutError, OSError, ValueError) as exc:
        reason = getattr(exc, "reason", exc)
        return AgentAnswer(0, {"error": f"the agent at {agent.url} could not be reached: {reason}"})


class AgentUnavailable(Exception):
    """No agent can apply the policy (none on the host, it runs without a write token, or the GPU
    has no UUID)."""


def apply_through_agent(gpu: Gpu, user=None) -> SchedulerPolicy:
    """Apply the GPU's effective policy through its host's agent and record the outcome.

    Only an agent whose last report said it holds a write token is asked (AgentUnavailable
    otherwise, with nothing written). An inherited policy is first copied into the GPU's own row,
    which keeps the outcome. 200 ->
    applied (and the reading the agent returns becomes the reported state); 409 (vGPUs on the GPU)
    -> staged with the agent's reason; anything else -> failed with what the agent said.
    """
    agent = agent_for(gpu)
    if agent is None:
        raise AgentUnavailable(f"No enabled fleet agent polls host {gpu.host.name}; apply the commands by hand.")
    if not agent.scheduler_write:
        raise AgentUnavailable(read_only_message(agent, gpu.host.name))
    if not gpu.uuid:
        raise AgentUnavailable("The GPU has no UUID yet (no agent reading); apply the commands by hand.")
    view = gpu_scheduler(gpu)
    if view.source != SchedulerScope.GPU:
        set_gpu_policy(gpu, view.desired, user)
    with transaction.atomic():
        row = locks.lock_rows(SchedulerPolicy.objects.filter(gpu=gpu))[0]
        row.apply_state, row.apply_detail = SchedulerApplyState.APPLYING, f"sent to agent {agent.name}"
        row.save(update_fields=["apply_state", "apply_detail", "updated_at"])
    before = audit.snapshot(row)
    answer = put_scheduler(agent, gpu.uuid, settings_of(row))
    message = answer.document.get("error", "")
    with transaction.atomic():
        # The GPU row before its policy (fleet.locks' order): a reading the agent returns is written to it.
        row = locks.lock_for_change(gpus=[gpu], then=[SchedulerPolicy.objects.filter(pk=row.pk)]).then[0][0]
        if answer.status == 200:
            row.apply_state, row.applied_at = SchedulerApplyState.APPLIED, timezone.now()
            row.apply_detail = f"applied by agent {agent.name}"
            reading = answer.document.get("scheduler")
            if isinstance(reading, dict):
                Gpu.objects.filter(pk=gpu.pk).update(scheduler_reported=reading, scheduler_reported_at=row.applied_at)
        elif answer.status == 409:
            row.apply_state = SchedulerApplyState.STAGED
            row.apply_detail = f"agent {agent.name} refused (HTTP 409): {message}"
        else:
            row.apply_state = SchedulerApplyState.FAILED
            status = f"HTTP {answer.status}" if answer.status else "no answer"
            row.apply_detail = f"agent {agent.name} failed ({status}): {message}"
        row.save(update_fields=["apply_state", "apply_detail", "applied_at", "updated_at"])
        audit.record("scheduler_policy.apply", row, before=before, after=audit.snapshot(row),
                     comment=row.apply_detail)
    return row
