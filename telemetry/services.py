"""Writes to agents and drift made by people (the API and the admin site), with their audit events.

The collector's own writes (last seen, errors, clock skew) are not changes anyone made and
are not logged. An agent's token never enters the log: snapshots keep its configuration
only, and a rotation says that it happened, not what the token became.
"""

from __future__ import annotations

from django.db import transaction
from django.db.models import QuerySet
from django.utils import timezone

from fleet import audit, locks
from telemetry.models import Agent, Drift

#: An agent's configuration as events show it (what an admin sets, nothing the collector writes).
AGENT_FIELDS = ["name", "kind", "url", "host", "vm", "enabled", "timeout_s"]


def agent_snapshot(agent: Agent | None) -> dict | None:
    return audit.snapshot(agent, AGENT_FIELDS)


def save_agent(agent: Agent, **fields) -> Agent:
    """Create or change an agent (with `fields` applied) and record "agent.create" or
    "agent.update"; an update that changed no configuration field records nothing."""
    with transaction.atomic():
        before = None
        if agent.pk is not None:
            stored = locks.lock_rows(Agent.objects.filter(pk=agent.pk))
            before = agent_snapshot(stored[0] if stored else None)
        for name, value in fields.items():
            setattr(agent, name, value)
        agent.save()
        after = agent_snapshot(agent)
        if before is None:
            audit.record("agent.create", agent, after=after)
        elif audit.changed(before, after):
            audit.record("agent.update", agent, before=before, after=after)
    return agent


def delete_agent(agent: Agent) -> None:
    """Delete an agent (its drift rows go with it) and record "agent.delete"."""
    with transaction.atomic():
        event = audit.event("agent.delete", agent, before=agent_snapshot(agent))
        agent.delete()
        audit.record_many([event])


def rotate_token(agent: Agent) -> str:
    """Give the agent a new token, record "agent.rotate_token" (without the token), and return
    the token: the caller shows it once."""
    with transaction.atomic():
        token = agent.rotate_token()
        agent.save(update_fields=["token_salt", "token_sha256"])
        audit.record("agent.rotate_token", agent, after=agent_snapshot(agent),
                     comment="new token issued; the previous one stopped working")
    return token


def set_enabled(agents: QuerySet[Agent], enabled: bool) -> int:
    """Enable or disable polling of `agents`; one "agent.update" event per agent that changed.
    Returns how many changed."""
    with transaction.atomic():
        # A fresh queryset: the changelist's joins its nullable host, which FOR UPDATE refuses.
        rows = Agent.objects.filter(pk__in=list(agents.values_list("pk", flat=True)))
        changing = locks.lock_rows(rows.exclude(enabled=enabled))
        events = []
        for agent in changing:
            before = agent_snapshot(agent)
            agent.enabled = enabled
            events.append(audit.event("agent.update", agent, before=before, after=agent_snapshot(agent)))
        Agent.objects.filter(pk__in=[agent.pk for agent in changing]).update(enabled=enabled)
        audit.record_many(events)
    return len(changing)


def resolve_drifts(drifts: QuerySet[Drift]) -> int:
    """Mark open drift rows resolved (an admin reviewed them); one "drift.resolve" event each.
    Returns how many were open."""
    now = timezone.now()
    with transaction.atomic():
        rows = Drift.objects.filter(pk__in=list(drifts.values_list("pk", flat=True)))
        open_rows = locks.lock_rows(rows.filter(resolved_at__isnull=True))
        events = []
        for drift in open_rows:
            before = audit.snapshot(drift, ["agent", "kind", "subject", "resolved_at"])
            drift.resolved_at = now
            events.append(audit.event("drift.resolve", drift, before=before,
                                      after=audit.snapshot(drift, ["agent", "kind", "subject", "resolved_at"])))
        Drift.objects.filter(pk__in=[drift.pk for drift in open_rows]).update(resolved_at=now)
        audit.record_many(events)
    return len(open_rows)
