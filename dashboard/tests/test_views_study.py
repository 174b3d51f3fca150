"""The proof-of-concept study page (/sizing/study/) and its CSV: what an admin reads and
downloads, who may open them, and bad dates refused with the field named."""

from __future__ import annotations

import csv
import io

from django.db import connection
from django.test.utils import CaptureQueriesContext
from django.urls import reverse

from dashboard.tests.test_views_overview import one, text
from sizing import study
from sizing.tests.test_study import END, START, world

PAGE = reverse("sizing:study")
CSV = reverse("sizing:study-csv")


def query(w) -> str:
    return f"?hosts={w.fleet.host_a.pk}&start={START}&end={END}"


def test_the_page_shows_the_workflows_the_vms_and_the_density_in_words(staff):
    w = world()
    response = staff.get(PAGE + query(w))
    assert response.status_code == 200
    html = response.content.decode()
    expected = study.study([w.fleet.host_a.pk], START, END).density.sentence
    assert text(one(html, data_density=True)) == expected
    lighting = text(one(html, data_workflow="Lighting"))
    assert "90%" in lighting
    assert "75%" in lighting
    assert "5.00 / 5 (1)" in lighting
    down = text(one(html, data_vm="ws-down"))
    assert "Mo Modeler" in down
    assert "3.00 / 5 (2)" in down
    assert "ws-new" not in html  # on host-b, not chosen
    assert text(one(html, data_scope=True)) == f"Hosts: host-a (3 VMs) · Days: {START} to {END}"
    # Printed, the report leaves out the menu and the form (static/css/app.css, @media print).
    assert 'class="card study-form no-print"' in html


def test_the_server_picker_offers_hosts_with_gpus_and_plans_on_the_one_chosen(staff):
    w = world()
    response = staff.get(query(w).join((PAGE, f"&server={w.fleet.host_b.pk}")))
    assert response.status_code == 200
    assert "On a server like host-b:" in response.content.decode()
    offered = [label for _, label in response.context["form"].fields["server"].choices]
    assert offered == ["First chosen host with GPUs", "host-a", "host-b"]  # ws-idle's host has no GPU


def test_a_group_of_vms_is_named_on_the_page_and_only_its_vms_are_shown(staff):
    world()
    page = staff.get(f"{PAGE}?vms=ws-k*&workflows=lighting&start={START}&end={END}")
    assert page.status_code == 200
    html = page.content.decode()
    assert text(one(html, data_scope=True)) == (f"Hosts: every host (2) · VMs named: ws-k* · Workflows: Lighting "
                                                f"(1 VM) · Days: {START} to {END}")
    assert 'data-vm="ws-keep"' in html
    assert 'data-vm="ws-down"' not in html
    refused = staff.get(f"{PAGE}?vms=ws-down,wsdown")
    assert "vms: No VM is named wsdown." in text(one(refused.content.decode(), role="alert"))


def test_the_page_opens_on_the_last_14_days_of_every_host(staff):
    world()
    response = staff.get(PAGE)
    assert response.status_code == 200
    start, end = study.default_days()
    assert response.context["study"].start == start
    assert response.context["study"].end == end
    assert {vm.name for vm in response.context["study"].vms} >= {"ws-down", "ws-new"}
    assert text(one(response.content.decode(), data_scope=True)).startswith("Hosts: every host (")


def test_the_csv_has_a_row_a_vm_and_a_row_a_workflow(staff):
    w = world()
    response = staff.get(CSV + query(w))
    assert response.status_code == 200
    assert response["Content-Type"].startswith("text/csv")
    rows = list(csv.DictReader(io.StringIO(b"".join(response.streaming_content).decode())))
    vms = {row["name"]: row for row in rows if row["row"] == "vm"}
    workflows = {row["name"]: row for row in rows if row["row"] == "workflow"}
    assert set(vms) == {"ws-down", "ws-dismissed", "ws-keep"}
    assert vms["ws-down"]["gpu_util_p95_pct"] == "70.0"
    assert vms["ws-down"]["fb_p95_pct_of_profile"] == "50.0"
    assert vms["ws-down"]["feedback_mean"] == "3.0"
    assert workflows["Lighting"]["ram_p95_pct_of_allocation"] == "25.0"
    density = study.study([w.fleet.host_a.pk], START, END).density
    last = rows[-1]  # the report ends with the density the measurements support
    assert (last["row"], last["host"], last["vms"], last["servers"]) == ("density", "host-a", "3", str(density.servers))
    assert last["note"].startswith(density.sentence)


def test_artists_get_403_and_visitors_the_login(client, artist):
    client.force_login(artist.user)
    assert client.get(PAGE).status_code == 403
    assert client.get(CSV).status_code == 403
    client.logout()
    assert client.get(PAGE).status_code == 302


def test_bad_dates_are_a_400_naming_the_field(staff):
    world()
    for params, name in (("start=2026-02-30", "start"), (f"start={END}&end={START}", "end"),
                         ("start=2020-01-01&end=2026-11-14", "start"), ("end=9999-12-31", "end"),
                         ("hosts=999999", "hosts"), ("server=999999", "server"), ("server=x", "server"),
                         ("vms=ws-down+wsdown", "vms"), ("vms=nope-*", "vms"), ("workflows=juggling", "workflows"),
                         ("vms=" + "x" * 101, "vms"), ("vms=" + "+".join(f"ws-{i}" for i in range(201)), "vms")):
        page = staff.get(f"{PAGE}?{params}")
        assert page.status_code == 400, params
        assert f"{name}:" in text(one(page.content.decode(), role="alert")), params
        download = staff.get(f"{CSV}?{params}")
        assert download.status_code == 400, params
        assert f"{name}:" in download.content.decode(), params


def test_the_page_costs_the_same_queries_for_one_host_and_the_whole_fleet(staff):
    w = world()
    staff.get(PAGE)  # session and caches warm
    with CaptureQueriesContext(connection) as one_host:
        assert staff.get(PAGE + query(w)).status_code == 200
    with CaptureQueriesContext(connection) as fleet:
        assert staff.get(f"{PAGE}?start={START}&end={END}").status_code == 200
    assert len(fleet) == len(one_host)


def test_a_study_of_hosts_without_gpus_ends_its_csv_saying_why_no_density(staff):
    from fleet.tests.factories import HostFactory

    world()
    bare = HostFactory(name="cpu-only-01")
    response = staff.get(f"{CSV}?hosts={bare.pk}&start={START}&end={END}")
    rows = list(csv.DictReader(io.StringIO(b"".join(response.streaming_content).decode())))
    assert [row["row"] for row in rows] == ["density"]
    assert rows[-1]["note"] == "None of these hosts has a GPU: there is no server to plan on."
    page = staff.get(f"{PAGE}?hosts={bare.pk}&start={START}&end={END}")
    assert text(one(page.content.decode(), data_density_error=True)) == rows[-1]["note"]
