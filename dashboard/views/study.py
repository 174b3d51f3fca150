"""The proof-of-concept study (/sizing/study/ and its CSV): what a group of VMs (the chosen
hosts', narrowed by name and workflow) used over the chosen days next to their artists'
ratings, per workflow and per VM, and the density the measurements support (`sizing.study`).
Admins only: it names artists and their ratings.

A bad date or range is a 400 naming the field, on the page and for the CSV alike.
"""

from __future__ import annotations

from django.http import HttpResponseBadRequest
from django.shortcuts import render

from config.csv_export import csv_response
from dashboard.access import staff_required
from dashboard.forms import field_errors
from fleet.models import Host
from sizing import study as studies
from sizing.forms import StudyForm

CSV_HEADER = ("row", "name", "host", "artist", "workflow", "vms", "hours_measured", "gpu_util_p95_pct",
              "fb_p95_pct_of_profile", "encoder_max_pct", "vcpu_p95_pct", "busiest_vcpu_p95_pct",
              "ram_p95_pct_of_allocation", "feedback_count", "feedback_mean", "top_tags", "servers",
              "artists_per_server", "note")


def _form(request) -> StudyForm:
    return StudyForm(request.GET or None, hosts=Host.objects.order_by("name", "id"),
                     servers=Host.objects.filter(gpus__isnull=False).distinct().order_by("name", "id"))


def _run(form: StudyForm) -> studies.Study:
    data = form.cleaned_data if form.is_bound else {}
    return studies.study(data.get("hosts") or (), data.get("start") or form.default_start,
                         data.get("end") or form.default_end, server_id=data.get("server"), group=data.get("group"))


@staff_required
def study_page(request):
    """The study's page: the form, the per-workflow and per-VM tables, and the density in words."""
    form = _form(request)
    if form.is_bound and not form.is_valid():
        return render(request, "sizing/study.html", {"form": form, "error": field_errors(form)}, status=400)
    result = _run(form)
    return render(request, "sizing/study.html", {
        "form": form, "study": result, "csv_query": request.GET.urlencode(),
    })


def _cells(figures: studies.Figures) -> list:
    def rounded(value):
        return round(value, 1) if value is not None else None

    return [figures.vms, figures.hours, rounded(figures.gpu_p95), rounded(figures.fb_p95_pct),
            rounded(figures.enc_max), rounded(figures.vcpu_p95), rounded(figures.busiest_vcpu_p95),
            rounded(figures.ram_p95_pct), figures.feedback_count, figures.feedback_mean,
            "; ".join(figures.top_tags), "", "", ""]


def _density_row(result: studies.Study) -> list:
    """The last row: the density the measurements support, on which server, in figures and words."""
    density = result.density
    if density is None:
        cells = {"row": "density", "note": result.density_error}
    else:
        cells = {"row": "density", "name": density.host, "host": density.host, "vms": density.vms,
                 "servers": density.servers, "artists_per_server": density.artists_per_server,
                 "note": f"{density.sentence} On a server like {density.host}: {density.gpus} x {density.gpu_model}, "
                         f"{density.cpu_threads} threads, {density.ram_gib} GiB."}
    return [cells.get(column, "") for column in CSV_HEADER]


@staff_required
def study_csv(request):
    """The study as CSV: one row a VM, then one a workflow (same query as the page), and last the
    density they support."""
    form = _form(request)
    if form.is_bound and not form.is_valid():
        return HttpResponseBadRequest(f"Study not made: {field_errors(form)}", content_type="text/plain")
    result = _run(form)
    rows = [["vm", vm.name, vm.host, vm.artist, vm.workflow, *_cells(vm.figures)] for vm in result.vms]
    rows += [["workflow", wf.label, "", "", wf.label, *_cells(wf)] for wf in result.workflows]
    rows.append(_density_row(result))
    return csv_response(f"study-{result.start}-{result.end}.csv", CSV_HEADER, [rows])
