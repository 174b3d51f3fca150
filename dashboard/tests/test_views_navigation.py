"""The main menu (dashboard/navigation.py, templates/base.html): an admin's five groups with their
pages, an artist's one page and nothing of the fleet, the page shown marked in its group, the
pending requests counted on the Requests group. How it looks and opens at each width is the
browser's to check (e2e/test_layout.py)."""

import re

import pytest
from django.test import Client

from fleet import requests as service
from fleet.tests.factories import profile

GROUPS = {
    "Fleet": ["Overview", "Hosts", "GPUs", "VMs", "Artists", "GPU scheduler", "Drift"],
    "Telemetry": ["Heatmaps", "Agents"],
    "Sizing": ["Right-sizing", "Density planner", "Placement optimizer", "Artist feedback", "PoC study"],
    "Requests": ["Resize requests", "Approved", "Rejected", "Cancelled", "Operations"],
    "Health": ["Alerts", "Alert rules", "Silences", "Licences", "Driver versions", "Notification channels",
               "Deliveries"],
    "Admin": ["Audit log", "Admin site", "API docs"],
}
FLEET_PATHS = ("/hosts/", "/gpus/", "/heatmap/", "/agents/", "/sizing/", "/requests/", "/audit/", "/admin/",
               "/scheduler/", "/drift/", "/api/")


def header(client, path: str) -> str:
    response = client.get(path)
    assert response.status_code == 200, path
    return re.search(r"<header.*?</header>", response.content.decode(), re.S).group(0)


def groups(html: str) -> dict[str, list[str]]:
    """Each group of the menu: its heading, then the labels of its links."""
    found = {}
    for block in re.findall(r"<details.*?</details>", html, re.S):
        heading = re.search(r"<summary>([^<]+)", block).group(1).strip()
        found[heading] = [label.strip() for label in re.findall(r"<a [^>]*>([^<]+)", block)]
    return found


def current(html: str) -> list[str]:
    """The labels of the links marked as the page shown, and the group marked current."""
    links = [label.strip() for label in re.findall(r'aria-current="page">([^<]+)', html)]
    sections = [heading.strip() for heading in re.findall(r'navgroup current">\s*<summary>([^<]+)', html)]
    return sections + links


def signed_in(user) -> Client:
    client = Client()
    client.force_login(user)
    return client


@pytest.mark.django_db
def test_an_admin_gets_six_groups_with_every_page_and_the_shown_one_marked(fleet_world, admin_user):
    client = signed_in(admin_user)
    html = header(client, "/sizing/planner/")
    assert groups(html) == GROUPS
    assert current(html) == ["Sizing", "Density planner"]
    assert current(header(client, f"/hosts/{fleet_world.host_a.pk}/")) == ["Fleet", "Hosts"]
    assert current(header(client, "/")) == ["Fleet", "Overview"]
    assert current(header(client, "/agents/")) == ["Telemetry", "Agents"]
    assert current(header(client, "/audit/")) == ["Admin", "Audit log"]
    assert current(header(client, "/drift/")) == ["Fleet", "Drift"]


@pytest.mark.django_db
def test_a_filtered_request_list_marks_its_own_entry_not_the_plain_list(fleet_world, admin_user):
    client = signed_in(admin_user)
    assert current(header(client, "/requests/")) == ["Requests", "Resize requests"]
    assert current(header(client, "/requests/?status=rejected")) == ["Requests", "Rejected"]
    assert 'href="/requests/?status=approved"' in header(client, "/requests/")


@pytest.mark.django_db
def test_the_requests_group_counts_the_pending_requests(fleet_world, admin_user):
    client = signed_in(admin_user)
    assert 'data-badge="requests"' not in header(client, "/")
    service.file_request(fleet_world.vm_a, fleet_world.ana.user, profile("RTX6000-24Q"), 1, "bigger scenes")
    html = header(client, "/")
    summary = re.search(r"<summary>Requests.*?</summary>", html, re.S).group(0)
    assert re.search(r'data-badge="requests">1<', summary)


@pytest.mark.django_db
def test_an_artist_gets_their_workstation_and_nothing_of_the_fleet(fleet_world):
    client = signed_in(fleet_world.ana.user)
    html = header(client, "/me/")
    assert groups(html) == {}
    assert re.findall(r'<a class="navlink" href="([^"]+)"', html) == ["/me/"]
    assert not [path for path in FLEET_PATHS if f'href="{path}' in html]
    assert current(html) == ["My workstation"]
    # Their own VM and artist pages belong to their workstation.
    assert current(header(client, f"/vms/{fleet_world.vm_a.pk}/")) == ["My workstation"]
    assert current(header(client, f"/artists/{fleet_world.ana.pk}/")) == ["My workstation"]
    assert current(header(client, "/notifications/")) == []


@pytest.mark.django_db
def test_a_visitor_who_is_not_signed_in_gets_no_menu():
    html = header(Client(), "/login/")
    assert "<nav" not in html
    assert "Menu" not in html


@pytest.mark.django_db
def test_the_menu_kept_for_one_page_and_role_follows_the_page_the_role_and_the_counts(fleet_world, admin_user):
    """The rendered menu is kept per process (dashboard/templatetags/menu.py): the next page, the
    next role and the next count must each get their own, never the one rendered before."""
    admin = signed_in(admin_user)
    assert current(header(admin, "/hosts/")) == ["Fleet", "Hosts"]
    assert current(header(admin, "/hosts/")) == ["Fleet", "Hosts"]  # the kept one
    assert current(header(admin, "/gpus/")) == ["Fleet", "GPUs"]
    # An artist on a page an admin saw a moment ago gets the artist's menu.
    artist = signed_in(fleet_world.ana.user)
    assert groups(header(admin, f"/vms/{fleet_world.vm_a.pk}/")) == GROUPS
    assert groups(header(artist, f"/vms/{fleet_world.vm_a.pk}/")) == {}
    # A request filed now is counted on the admin's next page, the same page as before.
    assert 'data-badge="requests"' not in header(admin, "/hosts/")
    service.file_request(fleet_world.vm_a, fleet_world.ana.user, profile("RTX6000-24Q"), 1, "bigger scenes")
    assert re.search(r'data-badge="requests">1<', header(admin, "/hosts/"))


@pytest.mark.django_db
def test_each_user_gets_their_own_unread_count(fleet_world, admin_user):
    """The badge query is compiled once per process and run with each user's id."""
    from fleet.models import Notification
    from fleet.tests.factories import UserFactory

    other_admin = UserFactory(username="ops", is_staff=True)
    Notification.objects.create(user=admin_user, message="one")
    Notification.objects.create(user=admin_user, message="two")
    assert re.search(r'data-badge="notifications">2<', header(signed_in(admin_user), "/hosts/"))
    assert 'data-badge="notifications"' not in header(signed_in(other_admin), "/hosts/")
    Notification.objects.create(user=fleet_world.ana.user, message="for ana")
    assert re.search(r'data-badge="notifications">1<', header(signed_in(fleet_world.ana.user), "/me/"))
