"""Admin site of telemetry: agents (status, last error, token rotation), drift, raw samples.

An agent's bearer token is shown once, on the page that follows its creation or the "Issue
new tokens" action, and never stored (it is derived: `Agent.token`); the page is not cached
and the token never goes into a flash message, which would travel in a cookie. Samples are
read-only: they are what the agents reported, and retention prunes them.
"""

from __future__ import annotations

import logging

from celery.schedules import ParseException
from django.contrib import admin, messages
from django.db import models, transaction
from django.template.response import TemplateResponse
from django.utils.cache import add_never_cache_headers
from django.utils.html import format_html
from django.utils.text import Truncator
from django_celery_beat.admin import CrontabScheduleAdmin as BeatCrontabScheduleAdmin
from django_celery_beat.admin import PeriodicTaskAdmin as BeatPeriodicTaskAdmin
from django_celery_beat.admin import PeriodicTaskForm as BeatPeriodicTaskForm
from django_celery_beat.models import ClockedSchedule, CrontabSchedule, IntervalSchedule, PeriodicTask, SolarSchedule

from config.admin_input import SafeInputAdminMixin, guard_registered
from config.celery import BROKER_UNREACHABLE
from fleet.admin_audit import AuditedAdmin
from telemetry import services
from telemetry.models import Agent, AgentStatus, Drift, GpuSample, VgpuSample

logger = logging.getLogger(__name__)

STATUS_COLOURS = {
    AgentStatus.OK: "#2e7d32",
    AgentStatus.STALE: "#b26a00",
    AgentStatus.ERROR: "#c62828",
    AgentStatus.NEW: "#546e7a",
    AgentStatus.DISABLED: "#757575",
}


def token_page(request, agents: list[Agent], tokens: dict[int, str], title: str) -> TemplateResponse:
    """The one page that shows agents' tokens; not cached by the browser or any proxy."""
    response = TemplateResponse(request, "admin/telemetry/agent/tokens.html", {
        **admin.site.each_context(request),
        "title": title,
        "rows": [(agent, tokens[agent.pk]) for agent in agents],
        "opts": Agent._meta,
    })
    add_never_cache_headers(response)
    return response


@admin.register(Agent)
class AgentAdmin(AuditedAdmin):
    """Agents are saved, deleted and given tokens through `telemetry.services`, which records
    each change in the audit log (never the token)."""

    list_display = ["name", "kind", "host", "vm", "url", "enabled", "status_badge", "last_seen",
                    "consecutive_failures", "short_error"]
    list_filter = ["kind", "enabled"]
    list_select_related = ["host", "vm"]
    search_fields = ["name", "url", "host__name", "vm__name"]
    autocomplete_fields = ["host", "vm"]
    readonly_fields = ["status_badge", "last_seen", "last_attempt", "last_error", "last_error_at",
                       "consecutive_failures", "clock_skew_s", "created_at"]
    fieldsets = [
        (None, {"fields": ["name", "kind", "url", "host", "vm", "enabled", "timeout_s"]}),
        ("Collection", {"fields": ["status_badge", "last_seen", "last_attempt", "clock_skew_s",
                                   "consecutive_failures", "last_error", "last_error_at", "created_at"]}),
    ]
    actions = ["issue_new_tokens", "enable", "disable"]
    # Agents answer plain HTTP on the studio network (Django 6 would assume https).
    formfield_overrides = {models.URLField: {"assume_scheme": "http"}}

    @admin.display(description="status")
    def status_badge(self, agent: Agent) -> str:
        status = AgentStatus(agent.status)
        return format_html('<strong style="color: {}">{}</strong>', STATUS_COLOURS[status], status.label)

    @admin.display(description="last error")
    def short_error(self, agent: Agent) -> str:
        return Truncator(agent.last_error).chars(90) if agent.last_error else "-"

    def save_model(self, request, obj, form, change):
        services.save_agent(obj)

    def delete_model(self, request, obj):
        services.delete_agent(obj)

    def delete_queryset(self, request, queryset):
        with transaction.atomic():
            for agent in queryset.order_by("pk"):
                services.delete_agent(agent)

    def response_add(self, request, obj, post_url_continue=None):
        # The token exists from creation on: show it now, the only time it can be read.
        return token_page(request, [obj], {obj.pk: obj.token}, f"Agent {obj.name} added: its token")

    @admin.action(description="Issue new tokens (the old ones stop working)", permissions=["change"])
    def issue_new_tokens(self, request, queryset):
        agents = list(queryset.order_by("name"))
        tokens = {}
        with transaction.atomic():
            for agent in agents:
                tokens[agent.pk] = services.rotate_token(agent)
        return token_page(request, agents, tokens, "New agent tokens")

    @admin.action(description="Enable polling", permissions=["change"])
    def enable(self, request, queryset):
        count = services.set_enabled(queryset, True)
        self.message_user(request, f"{count} agent(s) enabled.", messages.SUCCESS)

    @admin.action(description="Disable polling", permissions=["change"])
    def disable(self, request, queryset):
        count = services.set_enabled(queryset, False)
        self.message_user(request, f"{count} agent(s) disabled.", messages.SUCCESS)


@admin.register(Drift)
class DriftAdmin(AuditedAdmin):
    """Differences between what sources report and the inventory; admins resolve them by hand."""

    list_display = ["kind", "subject", "agent", "first_seen", "last_seen", "resolved_at"]
    list_filter = ["kind", ("resolved_at", admin.EmptyFieldListFilter)]
    list_select_related = ["agent"]
    search_fields = ["subject", "detail"]
    readonly_fields = ["agent", "kind", "subject", "detail", "reported", "first_seen", "last_seen", "resolved_at"]
    actions = ["mark_resolved"]

    def has_add_permission(self, request):
        return False

    @admin.action(description="Mark resolved", permissions=["change"])
    def mark_resolved(self, request, queryset):
        count = services.resolve_drifts(queryset)
        self.message_user(request, f"{count} drift(s) marked resolved.", messages.SUCCESS)


class ReadOnlySampleAdmin(admin.ModelAdmin):
    """Samples as the agents reported them: viewable, never edited. Newest first; no full
    count under filters (a COUNT over millions of rows would make every page slow)."""

    show_full_result_count = False
    ordering = ["-ts"]

    def has_add_permission(self, request):
        return False

    def has_change_permission(self, request, obj=None):
        return False

    def has_delete_permission(self, request, obj=None):
        return False


@admin.register(GpuSample)
class GpuSampleAdmin(ReadOnlySampleAdmin):
    list_display = ["ts", "gpu", "util_gpu", "util_mem", "fb_used_mib", "fb_total_mib", "enc_util", "dec_util",
                    "temp_c", "power_w", "sm_clock_mhz"]
    list_select_related = ["gpu__host", "gpu__gpu_model"]
    search_fields = ["gpu__uuid", "gpu__host__name"]


@admin.register(VgpuSample)
class VgpuSampleAdmin(ReadOnlySampleAdmin):
    list_display = ["ts", "vm", "gpu", "vgpu", "fb_used_mib", "util_gpu", "util_mem", "enc_util", "dec_util"]
    list_select_related = ["vm", "gpu__host", "gpu__gpu_model", "vgpu__profile", "vgpu__vm"]
    search_fields = ["vm__name", "gpu__uuid"]


class PeriodicTaskForm(BeatPeriodicTaskForm):
    """django-celery-beat's, whose clean() read the custom task name even when its field had refused
    it (a NUL, more than 200 characters): a KeyError, a 500 instead of the field's message."""

    def clean(self):
        if "task" not in self.cleaned_data and not self.cleaned_data.get("regtask"):
            return self.cleaned_data
        return super().clean()


class PeriodicTaskAdmin(SafeInputAdminMixin, BeatPeriodicTaskAdmin):
    """django-celery-beat's admin of the periodic tasks, whose "Run selected tasks" answered 500
    while Redis was down: now it says the tasks could not be queued, as the dashboard's own
    buttons do (config.celery.send_from_request). Its date hierarchy refuses impossible dates
    (config.admin_input)."""

    form = PeriodicTaskForm

    @admin.action(description="Run selected tasks")
    def run_tasks(self, request, queryset):
        try:
            return super().run_tasks(request, queryset)
        except BROKER_UNREACHABLE as exc:
            logger.warning("could not queue the selected periodic tasks: the task queue is unreachable (%s: %s)",
                           type(exc).__name__, exc)
            self.message_user(request, "Could not queue the selected tasks: the task queue (Redis) is unreachable. "
                              "Run them again once it is back.", level=messages.ERROR)
            return None


admin.site.unregister(PeriodicTask)
admin.site.register(PeriodicTask, PeriodicTaskAdmin)


def crontab_in_words(schedule: CrontabSchedule) -> str:
    """The schedule as django-celery-beat words it, or a note when celery cannot read it: a refused
    form is shown again with the values typed, and the property raised celery's ParseException."""
    try:
        return schedule.human_readable
    except (ValueError, ParseException):
        return "(celery cannot read this schedule)"


class CrontabScheduleAdmin(SafeInputAdminMixin, BeatCrontabScheduleAdmin):
    """django-celery-beat's admin of crontab schedules, whose form, refused for a value celery
    cannot read (`-1` as an hour), was shown again with a 500 instead of the field's message."""

    list_display = ("__str__", "schedule_in_words")
    fields = ("schedule_in_words", *BeatCrontabScheduleAdmin.fields[1:])
    readonly_fields = ("schedule_in_words",)

    @admin.display(description="Human readable")
    def schedule_in_words(self, schedule: CrontabSchedule) -> str:
        return crontab_in_words(schedule)


admin.site.unregister(CrontabSchedule)
admin.site.register(CrontabSchedule, CrontabScheduleAdmin)
# django-celery-beat's other schedules, as it registers them, with their inline of tasks capped
# and their filters guarded (config.admin_input).
guard_registered(admin.site, [IntervalSchedule, SolarSchedule, ClockedSchedule])
