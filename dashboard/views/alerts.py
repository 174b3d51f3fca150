"""/alerts/: what is wrong in the fleet now and who it hurts; the rules and their thresholds; the
silences; /licences/ and /versions/. Fleet admins only: an artist hears of a problem under their
own VM through an in-app note.

An alert's page says what happened, what to do, which GPU, VMs and artists it touches, and lets
the admin on call take it (acknowledge), keep it quiet for a while (silence, with a reason and
an end), or, for a GPU that is failing, plan moving its VMs away (drain).
"""

from __future__ import annotations

from datetime import timedelta

from django import forms
from django.contrib import messages
from django.core.exceptions import ValidationError
from django.db.models import QuerySet
from django.shortcuts import get_object_or_404, redirect, render
from django.utils import timezone
from django.views.decorators.http import require_POST

from alerts import drain, services, versions
from alerts import licences as licence_queries
from alerts.evaluate import active_silences, ensure_rules
from alerts.filtersets import AlertFilterSet, SilenceFilterSet
from alerts.models import Alert, AlertRule, Edition, LicencePool, Severity, Silence
from alerts.rules import RULES
from config.errors import Refusal
from dashboard import tables
from dashboard.access import staff_required
from dashboard.forms import field_errors
from dashboard.listing import TableListView
from sizing.models import OptimizerStatus

SILENCE_CHOICES = [("1", "1 hour"), ("4", "4 hours"), ("24", "1 day"), ("72", "3 days"), ("168", "1 week")]
#: Rules whose alert is about one GPU that may have to be emptied (the drain action).
DRAIN_RULES = {"xid", "ecc_uncorrectable", "row_remap", "gpu_temperature", "throttling"}


class AlertListView(TableListView):
    """Alerts, open ones first by default, with the API's filters."""

    table_class = tables.AlertTable
    filterset_class = AlertFilterSet
    template_name = "alerts/alert_list.html"
    filter_fields = ("state", "severity", "rule", "host")
    noun = "alerts"
    csv_name = "alerts"

    def get_queryset(self) -> QuerySet:
        return Alert.objects.select_related("rule", "host", "gpu__host", "gpu__gpu_model").prefetch_related("vms")

    def get_extra_context(self) -> dict:
        return {"title": "Alerts", "empty_title": "No alerts",
                "empty_message": "Nothing matches. Rules are evaluated every few seconds from what the agents "
                                 "report; see Alert rules for what is watched."}


class AcknowledgeForm(forms.Form):
    note = forms.CharField(required=False, max_length=2000)


class SilenceForm(forms.Form):
    hours = forms.TypedChoiceField(choices=SILENCE_CHOICES, coerce=int, initial="4")
    scope = forms.ChoiceField(choices=[("alert", "this alert"), ("gpu", "every rule on this GPU"),
                                       ("host", "every rule on this host"), ("rule", "this rule everywhere")],
                              initial="alert")
    reason = forms.CharField(max_length=300)


@staff_required
def alert_detail(request, pk: int):
    alert = get_object_or_404(Alert.objects.select_related("rule", "host", "gpu__host", "gpu__gpu_model",
                                                           "acknowledged_by"), pk=pk)
    vms = list(alert.vms.select_related("artist", "host").order_by("name"))
    silences = [s for s in active_silences(timezone.now())
                if s.matches(alert.rule_id, alert.key, alert.host_id, alert.gpu_id)]
    context = {
        "alert": alert, "vms": vms, "silences": silences, "details": _details(alert.details),
        "ack_form": AcknowledgeForm(), "silence_form": SilenceForm(),
        "can_drain": alert.is_open and alert.gpu_id is not None and alert.rule.kind in DRAIN_RULES,
        "history": Alert.objects.filter(key=alert.key).exclude(pk=alert.pk).order_by("-first_seen")[:10],
    }
    return render(request, "alerts/alert_detail.html", context)


def _details(details: dict) -> list[tuple[str, str]]:
    """The alert's details as label/value rows (nested values flattened to text)."""
    rows = []
    for key, value in (details or {}).items():
        if key in ("first_at", "last_at", "last_seen"):
            continue  # the alert's own first and last seen say it, in the page's format
        if isinstance(value, dict):
            value = "; ".join(f"{k}: {v}" for k, v in value.items())
        elif isinstance(value, list):
            value = ", ".join(str(v) for v in value)
        rows.append((key.replace("_", " "), "" if value is None else str(value)))
    return rows


@require_POST
@staff_required
def alert_acknowledge(request, pk: int):
    alert = get_object_or_404(Alert, pk=pk)
    form = AcknowledgeForm(request.POST)
    if not form.is_valid():
        messages.error(request, f"The alert was not acknowledged: {field_errors(form)}")
        return redirect("alerts:alert", pk=pk)
    try:
        services.acknowledge(alert, request.user, form.cleaned_data["note"])
        messages.success(request, "Acknowledged: the alert is yours; it resolves when its condition ends.")
    except Refusal as exc:
        messages.error(request, str(exc))
    return redirect("alerts:alert", pk=pk)


@require_POST
@staff_required
def alert_silence(request, pk: int):
    alert = get_object_or_404(Alert.objects.select_related("rule"), pk=pk)
    form = SilenceForm(request.POST)
    if not form.is_valid():
        messages.error(request, f"No silence was set: {field_errors(form)}")
        return redirect("alerts:alert", pk=pk)
    scope = form.cleaned_data["scope"]
    matcher = {"alert": {"alert": alert}, "gpu": {"gpu": alert.gpu}, "host": {"host": alert.host},
               "rule": {"rule": alert.rule}}[scope]
    if None in matcher.values():
        messages.error(request, f"No silence was set: this alert has no {scope}.")
        return redirect("alerts:alert", pk=pk)
    ends_at = timezone.now() + timedelta(hours=form.cleaned_data["hours"])
    try:
        services.create_silence(request.user, reason=form.cleaned_data["reason"], ends_at=ends_at, **matcher)
    except ValidationError as exc:
        messages.error(request, f"No silence was set: {'; '.join(exc.messages)}")
        return redirect("alerts:alert", pk=pk)
    messages.success(request, f"Silenced until {ends_at:%Y-%m-%d %H:%M} UTC: no notifications for {scope} "
                              f"{'' if scope == 'alert' else 'alerts '}until then.")
    return redirect("alerts:alert", pk=pk)


class SilenceListView(TableListView):
    table_class = tables.SilenceTable
    filterset_class = SilenceFilterSet
    template_name = "alerts/silence_list.html"
    filter_fields = ("active",)
    noun = "silences"
    csv_name = None

    def get_queryset(self) -> QuerySet:
        return Silence.objects.select_related("rule", "host", "gpu__host", "alert", "created_by")

    def get_extra_context(self) -> dict:
        return {"title": "Silences", "empty_title": "No silences",
                "empty_message": "Silence an alert from its page: its notifications stop until the end you choose."}


@require_POST
@staff_required
def silence_end(request, pk: int):
    silence = get_object_or_404(Silence, pk=pk)
    services.end_silence(silence)
    messages.success(request, "The silence has ended: matching alerts notify again from the next evaluation.")
    return redirect("alerts:silence-list")


class RuleForm(forms.Form):
    """One rule's switch, severity and thresholds; the threshold fields are the rule's own."""

    enabled = forms.BooleanField(required=False)
    severity = forms.ChoiceField(choices=Severity.choices)

    def __init__(self, *args, rule: AlertRule, **kwargs):
        super().__init__(*args, **kwargs)
        self.rule = rule
        for param in RULES[rule.kind].params:
            field_class = forms.IntegerField if param.integer else forms.FloatField
            self.fields[f"param_{param.name}"] = field_class(
                label=f"{param.name.replace('_', ' ')} ({param.unit})", min_value=param.low, max_value=param.high,
                help_text=f"{param.help}; default {param.default:g}")

    def params(self) -> dict:
        return {name.removeprefix("param_"): value for name, value in self.cleaned_data.items()
                if name.startswith("param_")}


class RuleChoiceForm(forms.Form):
    rule = forms.IntegerField(min_value=1, max_value=2**63 - 1)


def _rule_form(rule: AlertRule, data=None) -> RuleForm:
    initial = {"enabled": rule.enabled, "severity": rule.severity,
               **{f"param_{k}": v for k, v in rule.effective_params.items()}}
    return RuleForm(data, rule=rule, initial=initial, prefix=rule.kind)


@staff_required
def rule_list(request):
    rules = list(ensure_rules().values())
    rules.sort(key=lambda r: list(RULES).index(r.kind))
    if request.method == "POST":
        which = RuleChoiceForm(request.POST)
        rule = AlertRule.objects.filter(pk=which.cleaned_data["rule"]).first() if which.is_valid() else None
        if rule is None:
            messages.error(request, "No rule was changed: the form named no rule.")
            return redirect("alerts:rule-list")
        form = _rule_form(rule, request.POST)
        if form.is_valid():
            try:
                services.update_rule(rule, enabled=form.cleaned_data["enabled"],
                                     severity=form.cleaned_data["severity"], params=form.params())
                messages.success(request, f"{rule.title}: saved; the next evaluation uses it.")
                return redirect("alerts:rule-list")
            except ValidationError as exc:
                messages.error(request, f"{rule.title} was not changed: {'; '.join(exc.messages)}")
        else:
            messages.error(request, f"{rule.title} was not changed: {field_errors(form)}")
        forms_by_kind = {r.kind: (form if r.pk == rule.pk else _rule_form(r)) for r in rules}
    else:
        forms_by_kind = {r.kind: _rule_form(r) for r in rules}
    rows = [(r, RULES[r.kind], forms_by_kind[r.kind],
             [forms_by_kind[r.kind][f"param_{p.name}"] for p in RULES[r.kind].params]) for r in rules]
    return render(request, "alerts/rule_list.html", {"rows": rows})


class PoolForm(forms.Form):
    edition = forms.ChoiceField(choices=Edition.choices)
    owned = forms.IntegerField(min_value=0, max_value=1_000_000)
    note = forms.CharField(required=False, max_length=200)


@staff_required
def licences(request):
    if request.method == "POST":
        form = PoolForm(request.POST)
        if form.is_valid():
            services.set_pool(form.cleaned_data["edition"], form.cleaned_data["owned"], form.cleaned_data["note"])
            messages.success(request, "Saved: the pool and its alert use the new count from the next evaluation.")
            return redirect("alerts:licences")
        messages.error(request, f"The pool was not saved: {field_errors(form)}")
    else:
        form = PoolForm()
    overview = licence_queries.overview(days=30)
    chart = licence_queries.chart(overview)
    return render(request, "alerts/licences.html", {"overview": overview, "form": form, "chart": chart,
                                                    "pools": LicencePool.objects.all()})


@require_POST
@staff_required
def alert_drain(request, pk: int):
    """Plan moving every VM off the alert's GPU: an optimizer run the admin reviews and applies."""
    alert = get_object_or_404(Alert.objects.select_related("gpu__host", "gpu__gpu_model"), pk=pk)
    try:
        run = drain.start_for_alert(alert, request.user)
    except drain.DrainRefused as exc:
        messages.error(request, str(exc))
        return redirect("alerts:alert", pk=pk)
    if run.status == OptimizerStatus.FAILED:
        # The run's page says why (the task queue is unreachable).
        messages.error(request, f"The drain of {alert.gpu} was not queued; the reason is below.")
        return redirect("sizing:optimizer-run", pk=run.pk)
    messages.success(request, f"Planning how to move every VM off {alert.gpu}: review the plan, then apply it.")
    return redirect("sizing:optimizer-run", pk=run.pk)


@staff_required
def versions_page(request):
    return render(request, "alerts/versions.html", {"report": versions.report()})
