"""/drift/: where the inventory, the hosts' hypervisors (their last read) and the agents' recent
readings disagree, one row per VM or GPU with the three views side by side and what to do.

Admins only, like the API (`GET /api/v1/drift/`), with the same filters (`DriftFilterForm`).
Stored rows only (`hypervisors.drift_queries`): reading a hypervisor is the host page's "Compare
with the inventory", which each row's action links to.
"""

from __future__ import annotations

from django.core.paginator import Paginator
from django.shortcuts import render
from django.urls import reverse

from dashboard.access import staff_required
from dashboard.listing import PAGE_SIZE, ListControlsForm, url_with
from hypervisors import drift
from hypervisors.drift_queries import fleet_drift, telemetry_window_s
from hypervisors.filtersets import DriftFilterForm


def action_url(action: drift.Action) -> str | None:
    """The page where the admin does what the action says."""
    if action.code == drift.Do.FOLLOW_OPERATION and action.operation_id:
        return reverse("hypervisors:operation-detail", args=[action.operation_id])
    if action.host_id is None:
        return None
    if action.code == drift.Do.CHECK_AGENT:
        return reverse("telemetry:agent-list") + f"?host={action.host_id}"
    return reverse("fleet:host-detail", args=[action.host_id]) + "#hypervisor"


def _errors(*forms) -> list[str]:
    """Every refused parameter as "Label: why"."""
    return [f"{form[name].label if name in form.fields else name}: {error}"
            for form in forms for name, errors in form.errors.items() for error in errors]


@staff_required
def drift_list(request):
    form = DriftFilterForm(request.GET)
    form.fields["host"].empty_label = "Any"
    controls = ListControlsForm(request.GET)
    context = {"form": form, "filter_fields": list(form), "reset_url": request.path, "page": None,
               "window_s": int(telemetry_window_s()), "noun": "differences",
               "filtered": any(request.GET.get(name) for name in form.fields),
               "empty_title": "No drift", "empty_message": "The inventory, the hypervisors' last reads and the "
                                                           "agents' recent readings agree."}
    if not (form.is_valid() & controls.is_valid()):
        context["errors"] = _errors(form, controls)
        return render(request, "hypervisors/drift_list.html", context, status=400)
    everything = fleet_drift()
    items = form.selected(everything)
    paginator = Paginator(items, PAGE_SIZE)
    number = controls.cleaned_data["page"]
    page = paginator.get_page(paginator.num_pages if number == "last" else number)
    rows = [{"item": item, "action_url": action_url(item.action)} for item in page.object_list]
    context.update(
        page=page, rows=rows, counts=drift.counts(everything), total=len(everything),
        prev_url=url_with(request.path, request.GET, page=str(page.previous_page_number()))
        if page.has_previous() else None,
        next_url=url_with(request.path, request.GET, page=str(page.next_page_number())) if page.has_next() else None,
    )
    return render(request, "hypervisors/drift_list.html", context)
