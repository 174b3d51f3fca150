"""The host page's hypervisor card: the link (the secret by name only), the last check, the last
diff with its apply buttons, and the POSTs behind them. Reading the page never reaches the
hypervisor: only the buttons do."""

import pytest

from fleet.models import VirtualMachine
from fleet.tests.factories import UserFactory
from hypervisors.models import HypervisorStatus, SyncReport
from hypervisors.tests.fixtures import BUS_A

pytestmark = pytest.mark.django_db


@pytest.fixture
def staff_client(client, admin_user):
    client.force_login(admin_user)
    return client


def body(response) -> str:
    assert response.status_code == 200, response.content[:2000]
    return response.content.decode()


def test_page_shows_the_link_and_reaches_nothing(staff_client, linked):
    linked.host.hypervisor_secret_ref = "node-01-ssh-key"
    linked.host.save()
    linked.sim.path.unlink()  # the page must not notice: it reads stored rows only
    page = body(staff_client.get(f"/hosts/{linked.host.pk}/"))
    assert '<span class="mono">sim://node-01</span>' in page
    assert "node-01-ssh-key" in page
    assert "never checked" in page
    assert "Never compared with the inventory." in page
    assert "Check now" in page


def test_an_unlinked_host_says_so(staff_client, linked):
    linked.host.hypervisor_uri = ""
    linked.host.save()
    page = body(staff_client.get(f"/hosts/{linked.host.pk}/"))
    assert "Not linked" in page
    assert "Check now" not in page


def test_check_now_keeps_the_answer(staff_client, linked):
    answer = staff_client.post(f"/hosts/{linked.host.pk}/hypervisor/check/", follow=True)
    page = body(answer)
    assert "Hypervisor check: Connected to the simulated hypervisor node-01" in page
    assert "Connected</span>" in page
    assert HypervisorStatus.objects.get(host=linked.host).ok

    linked.sim.path.unlink()
    page = body(staff_client.post(f"/hosts/{linked.host.pk}/hypervisor/check/", follow=True))
    assert "Unreachable</span>" in page
    assert "node-01.json" in page


def test_diff_rows_and_apply_buttons(staff_client, linked):
    device = linked.sim.create_vgpu(BUS_A, "NVIDIA RTX6000-12Q")
    domain = linked.sim.define_domain("ws-new", vcpus=4, ram_mib=16384, vgpus=(device,), running=True)
    linked.sim.change_domain(str(linked.vm_a.uuid), ram_mib=48 * 1024)
    url = f"/hosts/{linked.host.pk}/hypervisor/sync/"

    page = body(staff_client.post(url, {"apply": "none"}, follow=True))
    assert "Read the hypervisor: 2 difference(s) with the inventory." in page
    assert f'data-entry="{domain.uuid}" data-kind="new"' in page
    assert "ram_gib: 32 → 48" in page
    assert page.count('data-form="hypervisor-apply"') == 2
    assert "Apply all" in page
    assert not VirtualMachine.objects.filter(name="ws-new").exists()

    page = body(staff_client.post(url, {"apply": "entry", "entry": domain.uuid}, follow=True))
    assert "ws-new: Created VM ws-new" in page
    assert VirtualMachine.objects.get(name="ws-new").vgpus.count() == 1
    linked.vm_a.refresh_from_db()
    assert linked.vm_a.ram_gib == 32  # not chosen

    page = body(staff_client.post(url, {"apply": "all"}, follow=True))
    linked.vm_a.refresh_from_db()
    assert linked.vm_a.ram_gib == 48
    page = body(staff_client.get(f"/hosts/{linked.host.pk}/"))
    assert "In step with the inventory: 3 domain(s), no difference." in page


def test_a_bad_choice_is_refused_before_the_hypervisor_is_read(staff_client, linked):
    page = body(staff_client.post(f"/hosts/{linked.host.pk}/hypervisor/sync/", {"apply": "entry"}, follow=True))
    assert "Sync not started: entry: Name the entry" in page
    assert not SyncReport.objects.exists()


def test_artists_cannot_check_or_sync(client, linked):
    client.force_login(UserFactory(username="ana"))
    for path in ("hypervisor/check/", "hypervisor/sync/"):
        assert client.post(f"/hosts/{linked.host.pk}/{path}", {"apply": "all"}).status_code == 403
    assert client.get(f"/hosts/{linked.host.pk}/hypervisor/check/").status_code == 403
    assert not SyncReport.objects.exists()
    assert not HypervisorStatus.objects.exists()
