"""The demo as `make run` leaves it (seed_demo, demo_hypervisors, hypervisor_sync, demo_agents,
backfill_demo, demo_feedback, refresh_suggestions): right-sizing on its simulated history names a
VM that only its CPU explains, and the page of its guest without the balloon driver says its
memory is not reported."""

from __future__ import annotations

import re
from io import StringIO

import pytest
from django.contrib.auth import get_user_model
from django.core.management import call_command

from dashboard.tests.test_views_details import guest_figures
from fleet import demo as fleet_demo
from fleet.models import VirtualMachine
from sizing.models import Suggestion
from telemetry.models import GuestSample

pytestmark = pytest.mark.django_db

PASSWORD = "pass-word-123"


@pytest.fixture
def demo(settings, tmp_path):
    """A smaller `make run`: three hosts beside the proof of concept, six days of history."""
    settings.HYPERVISOR_SIM_DIR = tmp_path / "sim"
    agents = str(tmp_path / "agents")
    out = StringIO()
    fleet_demo.seed_demo(hosts=3, admin_password=PASSWORD, artist_password=PASSWORD)
    call_command("demo_hypervisors", stdout=out)
    call_command("hypervisor_sync", stdout=out)
    call_command("demo_agents", "--dir", agents, "--base-port", "9711", stdout=out)
    call_command("backfill_demo", "--dir", agents, "--days", "6", "--recent-days", "0.25", stdout=out)
    call_command("demo_feedback", stdout=out)
    call_command("refresh_suggestions", stdout=out)
    return out.getvalue()


def test_the_demo_names_a_cpu_bound_animator_and_a_guest_whose_memory_is_not_reported(demo, client):
    cpu_bound = list(Suggestion.objects.filter(combined="cpu_bound").select_related("vm__artist"))
    assert [s.vm_id for s in cpu_bound] == [fleet_demo.cpu_bound_vm_id()]
    (suggestion,) = cpu_bound
    assert suggestion.vm.artist.workflow == "animation"
    assert suggestion.evidence["util_gpu_p95_pct"] < 30  # the GPU idles...
    assert suggestion.evidence["guest"]["vcpu_max_util_p95"] >= 90  # ...while one vCPU is saturated
    assert (suggestion.action, suggestion.cpu_action) == ("keep", "keep")  # no bigger vGPU, no more vCPUs
    # The demo's other animators keep their busy GPUs: the CPU-bound one is a case of its own.
    others = Suggestion.objects.filter(vm__artist__workflow="animation").exclude(pk=suggestion.pk)
    assert others.exists()
    assert all(s.evidence["util_gpu_p95_pct"] >= 30 for s in others)

    client.force_login(get_user_model().objects.get(username="admin"))
    listed = client.get("/sizing/suggestions/").content.decode()
    assert 'data-combined="cpu_bound"' in listed
    vm_page = " ".join(re.sub(r"<[^>]+>", " ", client.get(f"/vms/{suggestion.vm_id}/").content.decode()).split())
    assert "CPU-bound: one vCPU saturated while the GPU idles." in vm_page

    no_balloon = VirtualMachine.objects.get(pk=fleet_demo.no_balloon_vm_id())
    assert GuestSample.objects.filter(vm=no_balloon, vcpu_util__isnull=False).exists()
    figures = guest_figures(client.get(f"/vms/{no_balloon.pk}/").content.decode())
    assert figures["ram-used-pct"] == "not reported"
    assert re.fullmatch(r"\d+%", figures["vcpu-util"])  # its CPU is read as any other guest's
