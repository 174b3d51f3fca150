"""GET /api/v1/drift/: admins only, filtered by kind, host (id or name) and severity, unknown
parameters and values refused with 400, paginated, and a query count that does not grow."""

import pytest

from hypervisors.drift import Kind
from hypervisors.models import Operation
from hypervisors.tests.fixtures import add_unread_hosts

URL = "/api/v1/drift/"


def kinds(answer) -> list[tuple[str, str]]:
    return sorted((row["kind"], row["vm_name"]) for row in answer["results"])


@pytest.mark.django_db
def test_an_admin_reads_each_drift_with_three_views_and_what_to_do(admin_api, drifting):
    answer = admin_api.get(URL).json()
    assert answer["count"] == 3
    assert kinds(answer) == [(Kind.AGENT_OLD_GPU, "ws-a"), (Kind.UNREAD, ""), (Kind.MISSING_DEVICE, "ws-b")]
    missing = next(row for row in answer["results"] if row["kind"] == Kind.MISSING_DEVICE)
    assert missing["severity"] == "critical"
    assert missing["vm"] == drifting.vm_b.pk
    assert missing["gpu"] == drifting.gpu_b.pk
    assert missing["inventory"] == "node-01: RTX6000-24Q on 00000000:5E:00.0"
    assert missing["hypervisor"].endswith("running, no vGPU")
    assert missing["telemetry"].startswith("no reading in the last")
    assert missing["action"]["code"] == "fix_hypervisor"
    assert missing["action"]["url"] is None
    old = next(row for row in answer["results"] if row["kind"] == Kind.AGENT_OLD_GPU)
    assert old["action"]["url"] == f"http://testserver/api/v1/agents/?host={drifting.host.pk}"
    unread = next(row for row in answer["results"] if row["kind"] == Kind.UNREAD)
    assert unread["action"]["url"] == f"http://testserver/api/v1/hosts/{drifting.other.pk}/sync/"
    # The first row is the most severe.
    assert answer["results"][0]["severity"] == "critical"


@pytest.mark.django_db
def test_filters_by_kind_host_and_severity(admin_api, drifting):
    assert kinds(admin_api.get(URL, {"kind": Kind.AGENT_OLD_GPU}).json()) == [(Kind.AGENT_OLD_GPU, "ws-a")]
    both = admin_api.get(f"{URL}?kind={Kind.AGENT_OLD_GPU}&kind={Kind.UNREAD}").json()
    assert both["count"] == 2
    assert admin_api.get(URL, {"host": "node-02"}).json()["count"] == 1
    assert admin_api.get(URL, {"host": drifting.host.pk}).json()["count"] == 2
    assert kinds(admin_api.get(URL, {"severity": "critical"}).json()) == [(Kind.MISSING_DEVICE, "ws-b")]


@pytest.mark.django_db
def test_unknown_parameters_and_values_are_400(admin_api, drifting):
    response = admin_api.get(URL, {"hots": "node-01"})
    assert response.status_code == 400
    assert "Unknown filter" in response.json()["hots"][0]
    assert admin_api.get(URL, {"kind": "haunted"}).status_code == 400
    assert admin_api.get(URL, {"kind": "", "host": ""}).json()["count"] == 3  # empty: no filter
    assert "node-99" in admin_api.get(URL, {"host": "node-99"}).json()["host"][0]
    assert admin_api.get(URL, {"severity": "meh"}).status_code == 400
    assert admin_api.get(URL, {"limit": "x"}).status_code == 400


@pytest.mark.django_db
def test_paginated(admin_api, drifting):
    first = admin_api.get(URL, {"limit": 2}).json()
    assert (first["count"], len(first["results"])) == (3, 2)
    second = admin_api.get(first["next"]).json()
    assert len(second["results"]) == 1
    assert {r["kind"] for r in first["results"] + second["results"]} == {Kind.AGENT_OLD_GPU, Kind.UNREAD,
                                                                         Kind.MISSING_DEVICE}


@pytest.mark.django_db
def test_an_operation_under_way_links_to_the_operation(admin_api, drifting):
    operation = Operation.objects.create(kind="resize", vm=drifting.vm_b, host=drifting.host,
                                         target_host=drifting.host)
    row = admin_api.get(URL, {"kind": Kind.IN_OPERATION}).json()["results"][0]
    assert row["message"].startswith(f"ws-b is being changed by operation #{operation.pk}")
    assert row["action"] == {"code": "follow_operation", "text": f"Follow operation #{operation.pk}",
                             "host": drifting.host.pk, "operation": operation.pk,
                             "url": f"http://testserver/api/v1/operations/{operation.pk}/"}


@pytest.mark.django_db
def test_artists_get_403_and_visitors_401(artist_api, api, drifting):
    response = artist_api.get(URL)
    assert response.status_code == 403
    assert "Only fleet admins" in response.json()["detail"]
    assert api.get(URL).status_code == 401


@pytest.mark.django_db
def test_query_count_does_not_grow_with_the_fleet(admin_api, drifting, django_assert_num_queries):
    admin_api.get(URL)
    with django_assert_num_queries(9):  # the drift snapshot; force_authenticate costs none
        admin_api.get(URL)
    add_unread_hosts(4)
    with django_assert_num_queries(9):
        answer = admin_api.get(URL, {"limit": 500}).json()
    assert answer["count"] == 3 + 4  # each new host was never read; its VM is not compared with it
