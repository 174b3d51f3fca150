"""The right-sizing page: who may open it, figures equal to the database, the rows and their
evidence, filters, Accept / Dismiss / Restore / Refresh through the page, its query count, and
the "Right-sizing" box of a VM's page."""

from __future__ import annotations

import html
import json
import re

import pytest
from django.test import Client

from dashboard.views import suggestions as views
from fleet import services
from fleet.models import ResizeRequest
from fleet.tests.factories import ArtistFactory, GpuFactory, HostFactory, VirtualMachineFactory, profile
from sizing import tasks
from sizing.models import Suggestion
from sizing.suggestions import refresh_suggestions
from sizing.tests.suggestion_world import GIB, NOW, TWO_WEEKS_H, guest_hourly, hourly, rtx_studio, two_weeks_of_use
from telemetry.models import VmRollup

pytestmark = pytest.mark.django_db

PAGE = "/sizing/suggestions/"


@pytest.fixture
def staff_client(admin_user):
    client = Client()
    client.force_login(admin_user)
    return client


@pytest.fixture
def artist_client(artist):
    client = Client()
    client.force_login(artist.user)
    return client


@pytest.fixture
def world(artist):
    world = rtx_studio(artist=artist)
    two_weeks_of_use(world)
    refresh_suggestions(now=NOW)
    world.heavy_s, world.light_s, world.peer_s = (Suggestion.objects.get(vm=vm)
                                                  for vm in (world.heavy, world.light, world.peer))
    return world


def body(response) -> str:
    assert response.status_code == 200, response.status_code
    return response.content.decode()


def figure(page: str, name: str) -> int:
    match = re.search(rf'data-figure="{name}".*?data-value="(-?\d+)"', page, re.S)
    assert match, name
    return int(match.group(1))


def row(page: str, suggestion) -> str:
    """The HTML of one suggestion's table row (not its evidence row)."""
    match = re.search(rf'<tr id="suggestion-{suggestion.pk}".*?</tr>', page, re.S)
    assert match, f"no row for suggestion {suggestion.pk}"
    return match.group(0)


def text(fragment: str) -> str:
    return " ".join(html.unescape(re.sub(r"<[^>]+>", " ", fragment)).split())


def shown_vms(page: str) -> list[str]:
    return re.findall(r'<tr id="suggestion-\d+"[^>]*>\s*<td><a href="/vms/\d+/">([^<]+)</a>', page)


# Access ------------------------------------------------------------------------------------------


def test_anonymous_visitors_are_sent_to_login_and_change_nothing(client, world):
    response = client.get(PAGE)
    assert response.status_code == 302
    assert response["Location"].startswith("/login/")
    assert client.post(f"{PAGE}{world.heavy_s.pk}/accept/").status_code == 302
    assert client.post(f"{PAGE}refresh/").status_code == 302
    assert not ResizeRequest.objects.exists()


def test_artists_get_403_on_the_page_and_its_actions(artist_client, world):
    assert artist_client.get(PAGE).status_code == 403
    for action in ("accept", "dismiss", "restore"):
        assert artist_client.post(f"{PAGE}{world.heavy_s.pk}/{action}/").status_code == 403
    assert artist_client.post(f"{PAGE}refresh/").status_code == 403
    assert not ResizeRequest.objects.exists()
    assert Suggestion.objects.get(pk=world.heavy_s.pk).dismissed_key == ""


def test_actions_are_post_only(staff_client, world):
    assert staff_client.get(f"{PAGE}{world.heavy_s.pk}/accept/").status_code == 405
    assert staff_client.get(f"{PAGE}refresh/").status_code == 405
    assert not ResizeRequest.objects.exists()


# What the page shows -----------------------------------------------------------------------------


def test_figures_equal_the_database(staff_client, world):
    world.peer_s.dismissed_key = world.peer_s.evidence_key
    world.peer_s.save()

    page = body(staff_client.get(PAGE))

    assert figure(page, "upsize") == Suggestion.objects.filter(action="upsize").count() == 1
    assert figure(page, "downsize") == Suggestion.objects.filter(action="downsize").count() == 1
    assert figure(page, "keep") == 0  # the only keep is dismissed
    assert figure(page, "insufficient_data") == 0
    assert figure(page, "dismissed") == 1
    # Light's downsize frees one GPU, heavy's upsize in place needs none.
    assert figure(page, "gpus") == 1
    assert "each change on its own" in text(page)


def test_each_row_shows_the_advice_its_figures_where_it_fits_and_the_gpus(staff_client, world):
    page = body(staff_client.get(PAGE))

    light = text(row(page, world.light_s))
    assert "ws-light" in light
    assert "Bob" in light
    assert "RTX6000-24Q → to RTX6000-12Q" in light
    assert "Downsize" in light
    assert "p95 30% · peak 30% · mean 30%" in light
    assert "Needs a move" in light
    assert "frees 1" in light
    heavy = text(row(page, world.heavy_s))
    assert "RTX6000-12Q → to RTX6000-24Q" in heavy
    assert "Fits on its GPU" in heavy
    # Upsizes first: short of frame buffer now beats money to save.
    assert shown_vms(page) == ["ws-heavy", "ws-light", "ws-peer"]


def test_the_evidence_row_and_chart_data_of_each_row(staff_client, world):
    page = body(staff_client.get(PAGE))

    evidence = re.search(rf'<tr class="suggestion-detail" id="suggestion-{world.light_s.pk}-detail" hidden>.*?</tr>',
                         page, re.S)
    assert evidence
    assert world.light_s.evidence["impact"]["detail"] in html.unescape(evidence.group(0))
    assert "336 h of data, 336 h of work" in text(evidence.group(0))
    charts = json.loads(re.search(r'<script id="suggestion-charts" type="application/json">(.*?)</script>',
                                  page, re.S).group(1))
    chart = charts[str(world.light_s.pk)]
    assert chart["profile_fb_mib"] == 24 * GIB
    assert (chart["high_pct"], chart["avg_high_pct"]) == (90.0, 70.0)
    assert len(chart["daily"]) == 15  # 14 days of hours end at 10:00, so they touch 15 dates
    assert chart["daily"][-1]["fb_peak_mib"] == 7_372.0
    assert "vendor/plotly.min.js" in page
    assert "js/suggestions.js" in page


def test_user_text_is_escaped_in_the_table_and_the_chart_data(staff_client, world):
    world.light.name = "<script>alert(1)</script>"
    world.light.save()

    page = body(staff_client.get(PAGE))

    assert "<script>alert(1)</script>" not in page
    assert "&lt;script&gt;alert(1)&lt;/script&gt;" in page


def test_filters_narrow_the_list_and_a_bad_one_is_a_400_page(staff_client, world):
    assert shown_vms(body(staff_client.get(PAGE, {"action": "downsize"}))) == ["ws-light"]
    assert shown_vms(body(staff_client.get(PAGE, {"artist": world.bob.pk}))) == ["ws-light"]
    assert shown_vms(body(staff_client.get(PAGE, {"fits": "same_gpu"}))) == ["ws-heavy"]
    assert shown_vms(body(staff_client.get(PAGE, {"host": world.host.pk}))) == ["ws-heavy", "ws-light", "ws-peer"]
    assert shown_vms(body(staff_client.get(PAGE, {"vm": world.peer.pk}))) == ["ws-peer"]

    bad = staff_client.get(PAGE, {"action": "shrink"})
    assert bad.status_code == 400
    assert "These filters cannot be applied" in bad.content.decode()


def test_the_csv_export_carries_the_figures(staff_client, world):
    response = staff_client.get(PAGE, {"format": "csv", "action": "downsize"})
    lines = b"".join(response.streaming_content).decode().splitlines()

    assert lines[0].startswith("vm,artist,host,current_profile,suggested_profile,suggested_vgpus,action,fb_p95_pct")
    assert lines[1].startswith("ws-light,Bob,render-01,RTX6000-24Q,RTX6000-12Q,,downsize,30.0")
    assert len(lines) == 2


def test_every_form_carries_a_csrf_token_and_a_post_without_one_is_refused(staff_client, admin_user, world):
    page = body(staff_client.get(PAGE))
    forms = re.findall(r'<form method="post".*?</form>', page, re.S)
    assert len(forms) >= 5  # refresh, Accept of heavy and light, Dismiss of both (keep has none)
    assert all("csrfmiddlewaretoken" in form for form in forms)

    strict = Client(enforce_csrf_checks=True)
    strict.force_login(admin_user)
    assert strict.post(f"{PAGE}{world.heavy_s.pk}/accept/").status_code == 403
    assert not ResizeRequest.objects.exists()


def _crowd(n: int) -> None:
    host = HostFactory(cpu_threads=512, ram_gib=4096)
    for i in range(n):
        vm = VirtualMachineFactory(artist=ArtistFactory())
        services.place_vgpu(vm, GpuFactory(host=host), profile("RTX6000-24Q"))
        hourly(vm, 96, fb_mib=2_000 + 900 * i, profile_fb_mib=24 * GIB)


def test_the_page_costs_the_same_queries_for_2_suggestions_as_for_12(staff_client, django_assert_num_queries):
    _crowd(2)
    refresh_suggestions(now=NOW)
    # session, user, count, page of rows, pending requests of the page's VMs, summary, and the
    # choices of the host and artist filters, and the navigation badges
    with django_assert_num_queries(9):
        assert len(shown_vms(body(staff_client.get(PAGE)))) == 2
    _crowd(10)
    refresh_suggestions(now=NOW)
    with django_assert_num_queries(9):
        assert len(shown_vms(body(staff_client.get(PAGE)))) == 12


# Acting through the page ---------------------------------------------------------------------


def test_accept_files_the_request_and_the_row_then_says_so(staff_client, admin_user, world):
    response = staff_client.post(f"{PAGE}{world.heavy_s.pk}/accept/", {
        "evidence_key": world.heavy_s.evidence_key, "next": f"{PAGE}?action=upsize#suggestion-{world.heavy_s.pk}",
    }, follow=True)

    filed = ResizeRequest.objects.get()
    assert (filed.vm, filed.requested_profile.name, filed.status, filed.requested_by) == (
        world.heavy, "RTX6000-24Q", "pending", admin_user)
    assert response.redirect_chain == [(f"{PAGE}?action=upsize#suggestion-{world.heavy_s.pk}", 302)]
    page = body(response)
    assert f"Request #{filed.pk} filed" in text(page)
    heavy = text(row(page, world.heavy_s))
    assert f"Request #{filed.pk} pending" in heavy
    assert "Accept" not in heavy


def test_a_second_accept_is_refused_with_a_message_and_files_nothing_more(staff_client, world):
    staff_client.post(f"{PAGE}{world.heavy_s.pk}/accept/")
    response = staff_client.post(f"{PAGE}{world.heavy_s.pk}/accept/", follow=True)

    assert ResizeRequest.objects.count() == 1
    assert "already has a pending request" in text(body(response))


def test_a_pending_request_filed_elsewhere_replaces_the_accept_button(staff_client, world):
    mine = ResizeRequest.objects.create(vm=world.light, requested_profile=world.q12, reason="Filed by Bob")

    light = text(row(body(staff_client.get(PAGE)), world.light_s))

    assert f"Request #{mine.pk} pending" in light
    assert "Accept" not in light


def test_dismiss_hides_the_row_until_restored(staff_client, world):
    response = staff_client.post(f"{PAGE}{world.light_s.pk}/dismiss/",
                                 {"evidence_key": world.light_s.evidence_key, "next": PAGE}, follow=True)

    page = body(response)
    assert "dismissed until its evidence changes" in text(page)
    assert shown_vms(page) == ["ws-heavy", "ws-peer"]
    assert figure(page, "dismissed") == 1
    dismissed_page = body(staff_client.get(PAGE, {"dismissed": "true"}))
    assert shown_vms(dismissed_page) == ["ws-light"]
    assert "Restore" in text(row(dismissed_page, world.light_s))

    staff_client.post(f"{PAGE}{world.light_s.pk}/restore/", {"next": PAGE})

    assert shown_vms(body(staff_client.get(PAGE))) == ["ws-heavy", "ws-light", "ws-peer"]


def test_a_dismiss_of_evidence_recomputed_since_it_was_shown_is_refused(staff_client, world):
    response = staff_client.post(f"{PAGE}{world.light_s.pk}/dismiss/", {"evidence_key": "0" * 64}, follow=True)

    assert "recomputed" in text(body(response))
    assert Suggestion.objects.get(pk=world.light_s.pk).dismissed_key == ""


def test_an_evidence_key_that_is_none_is_a_400_naming_the_field(staff_client, world):
    response = staff_client.post(f"{PAGE}{world.light_s.pk}/dismiss/", {"evidence_key": "0" * 65, "next": PAGE})

    assert response.status_code == 400
    assert "evidence_key: Ensure this value has at most 64 characters" in response.content.decode()
    assert Suggestion.objects.get(pk=world.light_s.pk).dismissed_key == ""


def test_a_next_pointing_elsewhere_comes_back_to_the_list(staff_client, world):
    response = staff_client.post(f"{PAGE}{world.light_s.pk}/dismiss/", {"next": "https://evil.example/"})

    assert response.status_code == 302
    assert response["Location"] == PAGE


# Empty state and refresh -----------------------------------------------------------------------


def test_an_empty_page_explains_and_refresh_now_computes_small_fleets_at_once(staff_client, time_machine):
    time_machine.move_to(NOW, tick=False)  # the hour cannot turn between the rollups and the refresh
    world = rtx_studio()
    two_weeks_of_use(world)

    page = body(staff_client.get(PAGE))
    assert "No suggestions yet" in page
    assert "computed every hour from the last two weeks" in page

    response = staff_client.post(f"{PAGE}refresh/", {"next": PAGE}, follow=True)

    assert Suggestion.objects.count() == 3
    assert "Suggestions refreshed: 3 VMs judged (1 upsize, 1 downsize)" in text(body(response))
    assert shown_vms(body(response)) == ["ws-heavy", "ws-light", "ws-peer"]


def test_refresh_now_hands_a_large_fleet_to_the_worker(staff_client, monkeypatch):
    rtx_studio()
    monkeypatch.setattr(views, "SYNC_REFRESH_MAX_VMS", 2)
    sent = []
    monkeypatch.setattr(tasks.refresh_suggestions, "apply_async",
                        lambda args=(), kwargs=None, **options: sent.append(tuple(args)))

    response = staff_client.post(f"{PAGE}refresh/", follow=True)

    assert sent == [()]
    assert not Suggestion.objects.exists()
    assert "Refreshing the suggestions of 3 VMs in the background" in text(body(response))


def test_while_the_task_queue_is_down_refresh_now_says_so_and_keeps_the_suggestions(staff_client, world,
                                                                                   monkeypatch, broker_down):
    monkeypatch.setattr(views, "SYNC_REFRESH_MAX_VMS", 2)
    before = list(Suggestion.objects.order_by("pk").values_list("pk", "vm__name", "action", "evidence_key"))

    response = staff_client.post(f"{PAGE}refresh/", {"next": PAGE}, follow=True)

    assert broker_down == ["sizing.tasks.refresh_suggestions"]
    page = body(response)
    assert ("Could not queue the refresh: the task queue (Redis) is unreachable. The suggestions below are "
            "unchanged; refresh again once it is back.") in text(page)
    assert "in the background" not in page
    assert list(Suggestion.objects.order_by("pk").values_list("pk", "vm__name", "action", "evidence_key")) == before
    assert shown_vms(page) == ["ws-heavy", "ws-light", "ws-peer"]


def test_when_every_suggestion_is_dismissed_the_page_says_where_they_are(staff_client, world):
    for suggestion in Suggestion.objects.all():
        suggestion.dismissed_key = suggestion.evidence_key
        suggestion.save()

    page = body(staff_client.get(PAGE))

    assert "Every suggestion is dismissed" in page
    assert "?dismissed=true" in page


# The VM's page -----------------------------------------------------------------------------------


def test_a_vms_page_shows_its_suggestion(staff_client, world):
    page = text(body(staff_client.get(f"/vms/{world.light.pk}/")))

    assert "Right-sizing" in page
    assert "Downsize RTX6000-24Q → to RTX6000-12Q" in page
    assert world.light_s.reason in page
    assert world.light_s.evidence["impact"]["detail"] in page


def test_the_cpu_reading_beside_an_idle_gpu_is_on_the_vms_page_the_list_and_the_api(staff_client, world):
    world.peer.vcpus, world.peer.ram_gib = 8, 32
    world.peer.save()
    VmRollup.objects.filter(vm=world.peer).update(util_gpu_p95=12.0)
    guest_hourly(world.peer, TWO_WEEKS_H, util_pct=14.0, busiest_pct=98.0, ram_used_mib=5 * GIB)
    refresh_suggestions(now=NOW)

    vm_page = text(body(staff_client.get(f"/vms/{world.peer.pk}/")))
    assert "CPU-bound: one vCPU saturated while the GPU idles." in vm_page
    assert "do not upsize the vGPU" in vm_page
    assert "all vCPUs p95 14%, busiest vCPU p95 98%" in vm_page
    assert "Downsize 32 → to 8 GiB" in vm_page  # 5 of 32 GiB used
    listed = body(staff_client.get(PAGE))
    assert 'data-combined="cpu_bound"' in listed
    api = staff_client.get(f"/api/v1/suggestions/?vm={world.peer.pk}").json()["results"][0]
    assert (api["cpu_action"], api["ram_action"], api["suggested_ram_gib"], api["combined"]) == (
        "keep", "downsize", 8, "cpu_bound")
    assert "no ratings in the window" in vm_page
    assert "Medium No feedback from the artist in the window: the figures alone." in vm_page
    # A VM whose guest was never read says where the figures would come from.
    assert "not read yet (the host's hypervisor link gives the guest's CPU)" in text(
        body(staff_client.get(f"/vms/{world.light.pk}/")))


def test_an_artist_sees_the_suggestion_of_their_own_vm(artist_client, world):
    page = body(artist_client.get(f"/vms/{world.heavy.pk}/"))

    assert "Upsize" in text(page)
    assert "/sizing/suggestions/" not in page  # the page itself is for admins


def test_a_vm_without_suggestion_says_when_it_will_have_one(staff_client):
    vm = VirtualMachineFactory(name="ws-fresh")

    page = text(body(staff_client.get(f"/vms/{vm.pk}/")))

    assert "No suggestion yet" in page


# The admin site -----------------------------------------------------------------------------------


def test_the_admin_site_lists_suggestions_and_shows_their_figures_read_only(staff_client, world):
    listing = body(staff_client.get("/admin/sizing/suggestion/", {"action__exact": "downsize"}))
    assert "ws-light" in listing
    assert "ws-heavy" not in listing

    detail = staff_client.get(f"/admin/sizing/suggestion/{world.light_s.pk}/change/")
    page = body(detail)
    assert "RTX6000-12Q" in page
    assert 'name="action"' not in page  # figures are shown, not editable
    assert staff_client.post(f"/admin/sizing/suggestion/{world.light_s.pk}/change/",
                             {"action": "keep"}).status_code == 403
    assert Suggestion.objects.get(pk=world.light_s.pk).action == "downsize"


def test_the_vm_page_files_the_advised_ram_downsize_as_a_request(staff_client, admin_user, world):
    """peer's vGPU advice is to keep it; its guest used 5 of 32 GiB: filing the advice from its
    page asks for 8 GiB and the same vGPU."""
    world.peer.vcpus, world.peer.ram_gib = 8, 32
    world.peer.save()
    guest_hourly(world.peer, TWO_WEEKS_H, util_pct=60.0, busiest_pct=70.0, ram_used_mib=5 * GIB)
    refresh_suggestions(now=NOW)
    suggestion = Suggestion.objects.get(vm=world.peer)
    assert (suggestion.action, suggestion.cpu_action, suggestion.ram_action, suggestion.suggested_ram_gib) == (
        "keep", "keep", "downsize", 8)
    vm_page = body(staff_client.get(f"/vms/{world.peer.pk}/"))
    form = re.search(r'<form[^>]*data-file-advice>.*?</form>', vm_page, re.S)
    assert form
    assert "File the vCPU and RAM change" in form.group(0)
    key = re.search(r'name="evidence_key" value="(\w+)"', form.group(0)).group(1)

    response = staff_client.post(f"{PAGE}{suggestion.pk}/accept/",
                                 {"evidence_key": key, "next": f"/vms/{world.peer.pk}/"}, follow=True)

    filed = ResizeRequest.objects.get()
    assert (filed.vm, filed.requested_profile, filed.requested_vgpus, filed.requested_vcpus,
            filed.requested_ram_gib, filed.requested_by) == (world.peer, world.q12, 1, None, 8, admin_user)
    assert "RAM 32 -> 8 GiB." in filed.reason
    assert response.redirect_chain == [(f"/vms/{world.peer.pk}/", 302)]
    page = body(response)
    assert f"Request #{filed.pk} filed for ws-peer: 32 -> 8 GiB, pending approval." in text(page)
    assert "data-file-advice" not in page  # filed: the page says so instead of offering it again
    assert f"Resize request #{filed.pk}: pending." in text(page)


def test_accepting_a_vgpu_vcpu_and_ram_downsize_files_all_three_in_one_request(staff_client, world):
    world.light.ram_gib = 32
    world.light.save()
    guest_hourly(world.light, TWO_WEEKS_H, util_pct=20.0, busiest_pct=40.0, ram_used_mib=5 * GIB)
    refresh_suggestions(now=NOW)
    suggestion = Suggestion.objects.get(vm=world.light)
    assert (suggestion.action, suggestion.cpu_action, suggestion.suggested_vcpus, suggestion.ram_action,
            suggestion.suggested_ram_gib) == ("downsize", "downsize", 4, "downsize", 8)

    listed = body(staff_client.get(PAGE))
    assert "with the advised vCPUs and RAM" in row(listed, suggestion)
    staff_client.post(f"{PAGE}{suggestion.pk}/accept/", {"evidence_key": suggestion.evidence_key})

    filed = ResizeRequest.objects.get()
    assert (filed.requested_profile.name, filed.requested_vgpus, filed.requested_vcpus, filed.requested_ram_gib) == (
        "RTX6000-12Q", 1, 4, 8)
    assert filed.changes_vgpus
    assert filed.size_change == "8 -> 4 vCPUs, 32 -> 8 GiB"
