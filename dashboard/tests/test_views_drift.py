"""/drift/ (dashboard/views/drift.py) and the overview's drift counts: an admin reads each
disagreement with the three views and a link to where it is fixed; artists and visitors are kept
out; a bad filter is named; the page's query count does not grow with the fleet."""

import re

import pytest
from django.test import Client

from hypervisors import services
from hypervisors.drift import Kind
from hypervisors.models import Operation
from hypervisors.tests.fixtures import add_unread_hosts

URL = "/drift/"


def rows(html: str) -> dict[str, str]:
    """Each row of the drift table by its kind."""
    table = re.search(r'<table class="data list" data-table="drift">.*?</table>', html, re.S).group(0)
    return {kind: row for kind, row in re.findall(r'<tr data-kind="([a-z_]+)".*?>(.*?)</tr>', table, re.S)}


def view(row: str, name: str) -> str:
    return re.search(rf'data-view="{name}">(.*?)</td>', row, re.S).group(1).strip()


@pytest.mark.django_db
def test_an_admin_sees_each_drift_with_the_three_views_and_where_to_act(staff, drifting):
    response = staff.get(URL)
    assert response.status_code == 200
    found = rows(response.content.decode())
    assert set(found) == {Kind.MISSING_DEVICE, Kind.AGENT_OLD_GPU, Kind.UNREAD}
    missing = found[Kind.MISSING_DEVICE]
    assert "ws-b" in missing
    assert "the VM runs without that vGPU" in missing
    assert view(missing, "inventory") == "node-01: RTX6000-24Q on 00000000:5E:00.0"
    assert view(missing, "hypervisor").endswith("running, no vGPU")
    assert view(missing, "telemetry").startswith("no reading in the last")
    old = found[Kind.AGENT_OLD_GPU]
    assert f'href="/agents/?host={drifting.host.pk}"' in old
    assert "The agent still reports ws-a on GPU 00000000:5E:00.0 of node-01" in old


@pytest.mark.django_db
def test_an_operation_under_way_is_shown_as_such_with_a_link(staff, drifting):
    operation = Operation.objects.create(kind="resize", vm=drifting.vm_b, host=drifting.host,
                                         target_host=drifting.host)
    found = rows(staff.get(URL).content.decode())
    assert Kind.MISSING_DEVICE not in found
    assert f'href="/operations/{operation.pk}/"' in found[Kind.IN_OPERATION]
    assert f"being changed by operation #{operation.pk}" in found[Kind.IN_OPERATION]


@pytest.mark.django_db
def test_filters_and_a_refused_one(staff, drifting):
    found = rows(staff.get(URL, {"kind": Kind.AGENT_OLD_GPU, "host": "node-01"}).content.decode())
    assert set(found) == {Kind.AGENT_OLD_GPU}
    html = staff.get(URL, {"severity": "critical", "host": "node-02"}).content.decode()
    assert "No differences match these filters" in html
    response = staff.get(URL, {"host": "node-99"})
    assert response.status_code == 400
    assert "node-99" in response.content.decode()


@pytest.mark.django_db
def test_a_fleet_in_step_says_so(staff, linked):
    services.sync_host(linked.host)
    assert "No drift" in staff.get(URL).content.decode()


@pytest.mark.django_db
def test_artists_get_403_and_visitors_the_login_page(artist, drifting):
    client = Client()
    response = client.get(URL)
    assert response.status_code == 302
    assert response["Location"].startswith("/login/")
    client.force_login(artist.user)
    assert client.get(URL).status_code == 403


@pytest.mark.django_db
def test_query_count_does_not_grow_with_the_fleet(staff, drifting, django_assert_num_queries):
    staff.get(URL)
    # Session, user, the drift snapshot's nine, the host filter's choices, the menu's badges.
    with django_assert_num_queries(13):
        staff.get(URL)
    add_unread_hosts(4)
    with django_assert_num_queries(13):
        html = staff.get(URL).content.decode()
    assert html.count('data-kind="hypervisor_unread"') == 5


@pytest.mark.django_db
def test_the_overview_counts_drifting_vms_and_gpus_by_kind_and_links_to_the_page(staff, drifting):
    html = staff.get("/").content.decode()
    section = re.search(r'<section class="card" data-section="drift">.*?</section>', html, re.S).group(0)
    assert 'data-drifting-vms="2"' in section
    assert 'data-drifting-gpus="1"' in section
    missing = re.search(rf'<tr data-drift-kind="{Kind.MISSING_DEVICE}">(.*?)</tr>', section, re.S).group(1)
    assert f'href="/drift/?kind={Kind.MISSING_DEVICE}"' in missing
    assert 'data-vms="1"' in missing
    assert 'data-gpus="1"' in missing
    assert 'href="/drift/"' in section
