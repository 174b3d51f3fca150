"""The audit log page: objects and the ids inside before/after read as names with links, a gone
object stays a bare id, one lookup per kind of object whatever the number of events, sorting and
pages like the other lists, and a bad parameter named in a 400."""

from __future__ import annotations

import re

import pytest
from django.db import connection
from django.test.utils import CaptureQueriesContext

from fleet import audit, services
from fleet.models import AuditEvent, Gpu
from fleet.tests.factories import GpuFactory, HostFactory, VirtualMachineFactory, profile

pytestmark = pytest.mark.django_db


def place(n: int, admin_user) -> tuple:
    host = HostFactory(name=f"render-{n:02d}")
    gpu = GpuFactory(host=host, pci_bus_id=f"00000000:{n + 16:02X}:00.0")
    vm = VirtualMachineFactory(name=f"ws-{n:02d}")
    with audit.acting_as(admin_user, "web"):
        services.place_vgpu(vm, gpu, profile("RTX6000-12Q"))
    return host, gpu, vm


def change_cell(html: str, event: AuditEvent, field: str) -> str:
    """The <tr> of one changed field in the diff of `event`'s row."""
    row = re.search(rf'<tr>(?:(?!<tr>).)*?#{event.object_id}</span>.*?</table>', html, re.S).group(0)
    return re.search(rf'<tr class="changed" data-field="{field}">.*?</tr>', row, re.S).group(0)


def test_ids_in_before_and_after_read_as_linked_names(staff, admin_user):
    host, gpu, vm = place(1, admin_user)
    event = AuditEvent.objects.get(action="vgpu.place")

    html = staff.get("/audit/").content.decode()

    gpu_cell = change_cell(html, event, "gpu_id")
    assert f'<a href="/gpus/{gpu.pk}/">render-01 · 00000000:11:00.0</a>' in gpu_cell
    assert "<th>gpu</th>" in gpu_cell, "the field reads as what it names"
    assert f'<a href="/vms/{vm.pk}/">ws-01</a>' in change_cell(html, event, "vm_id")
    assert "RTX6000-12Q" in change_cell(html, event, "profile_id")
    assert f"<ins>{gpu.pk}</ins>" not in gpu_cell, "no raw id where a name is known"


def test_the_object_links_to_its_page_and_a_gone_id_stays_an_id(staff, admin_user):
    host, gpu, vm = place(2, admin_user)
    with audit.acting_as(admin_user, "web"):
        services.update_host(host, name="render-02b")
    gone_id = gpu.pk
    AuditEvent.objects.create(at=AuditEvent.objects.latest("at").at, action="vgpu.remove", object_type="vgpu",
                              object_id="999", before={"gpu_id": 987654}, after=None)

    html = staff.get("/audit/", {"action": "host.update"}).content.decode()
    assert f'<a href="/hosts/{host.pk}/">' in html

    html = staff.get("/audit/", {"action": "vgpu.remove"}).content.decode()
    assert "#987654" in html
    assert "(gone)" in html
    assert Gpu.objects.filter(pk=gone_id).exists()


def queries(client, path: str) -> int:
    with CaptureQueriesContext(connection) as context:
        assert client.get(path).status_code == 200
    return len(context.captured_queries)


def test_one_lookup_per_kind_whatever_the_number_of_events(staff, admin_user):
    place(3, admin_user)
    few = queries(staff, "/audit/")

    for n in range(4, 12):
        place(n, admin_user)

    assert queries(staff, "/audit/") == few


def test_sorting_and_pages_keep_the_filters(staff, admin_user):
    for n in range(1, 4):
        place(n, admin_user)

    html = staff.get("/audit/", {"action": "vgpu.place", "ordering": "action"}).content.decode()

    assert 'aria-sort="ascending"' in html
    assert 'href="/audit/?action=vgpu.place&amp;ordering=-action"' in html
    assert 'href="/api/v1/audit-events/?action=vgpu.place&amp;format=csv"' in html
    assert "1–3 of 3 events" in html


@pytest.mark.parametrize(("params", "message"), [
    ({"since": "yesterday"}, "since: &#x27;yesterday&#x27; is not a time"),
    ({"source": "fax"}, "source: Select a valid choice. fax is not one of the available choices."),
    ({"page": "0"}, "page: 0 is out of range"),
    ({"format": "xls"}, "format: Select a valid choice. xls is not one of the available choices."),
])
def test_a_bad_parameter_is_a_400_naming_it(staff, admin_user, params, message):
    place(1, admin_user)

    response = staff.get("/audit/", params)

    assert response.status_code == 400
    assert message in response.content.decode()
