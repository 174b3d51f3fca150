"""A resize request carries the right-sizing evidence of its VM (the suggestion's kind, target,
reason and figures), and a request filed from an accepted suggestion is marked and approves."""



from fleet import requests as service
from fleet.models import Notification, Vgpu
from fleet.tests.factories import VirtualMachineFactory, profile
from fleet.tests.request_world import URL
from sizing.models import SuggestionAction
from sizing.suggestions import accept_suggestion
from sizing.tests.suggestion_world import suggest


def test_evidence_rides_along_with_each_request(fleet_world, admin_user, artist_api, admin_api, filed,
                                                django_assert_num_queries):
    """The suggestion's kind, target, reason and figures, and whether it asks for the same thing;
    the list pays no query per row for it."""
    suggest(fleet_world.vm_a)
    evidence = artist_api.get(f"{URL}{filed.pk}/").json()["evidence"]
    assert evidence["action"] == "upsize"
    assert evidence["suggested"] == "RTX6000-24Q"
    assert evidence["matches_request"] is True
    assert evidence["from_suggestion"] is False
    assert "Over 14 days: frame buffer p95 11.2 of 12 GiB (93%), peak 100%, mean 74%" in evidence["figures"]
    assert "host-a" not in str(evidence)  # where a move would go is the admin's queue, not the artist's view
    for n in range(3):
        vm = VirtualMachineFactory(name=f"ws-more-{n}")
        suggest(vm, action=SuggestionAction.DOWNSIZE, target="RTX6000-8Q")
        service.file_request(vm, admin_user, profile("RTX6000-8Q"), 1, "smaller")
    with django_assert_num_queries(2):  # count, and the page with VMs and suggestions
        rows = admin_api.get(URL).json()["results"]
    assert [r["evidence"]["action"] for r in rows] == ["downsize"] * 3 + ["upsize"]


def test_without_a_suggestion_the_evidence_says_so(admin_api, filed):
    evidence = admin_api.get(f"{URL}{filed.pk}/").json()["evidence"]
    assert (evidence["action"], evidence["label"], evidence["matches_request"]) == ("", "No usage evidence yet", None)


def test_a_request_filed_from_an_accepted_suggestion_is_marked_and_approves(fleet_world, admin_user, admin_api):
    suggestion = suggest(fleet_world.vm_a)
    request = accept_suggestion(suggestion, admin_user, evidence_key="k1")
    row = admin_api.get(f"{URL}{request.pk}/").json()
    assert row["evidence"]["from_suggestion"] is True
    assert row["reason"].startswith("Right-sizing: fb p95 11.2 GiB = 93% of 12 GiB over 14 days")
    response = admin_api.post(f"{URL}{request.pk}/approve/", {}, format="json")
    assert response.status_code == 200, response.json()
    assert [v.profile.name for v in Vgpu.objects.filter(vm=fleet_world.vm_a)] == ["RTX6000-24Q"]
    assert Notification.objects.filter(user=fleet_world.ana.user, message__contains="approved and applied").exists()


def test_a_vcpu_and_ram_request_matches_the_evidence_only_where_it_asks_what_the_advice_says(
        fleet_world, admin_user, admin_api):
    """Compared part by part: the RAM the guest advice suggests matches; other vCPUs where the
    advice is to keep them differ; a change of vCPUs alone says nothing of the vGPU's advice."""
    suggestion = suggest(fleet_world.vm_a)  # the vGPU: upsize to RTX6000-24Q
    suggestion.cpu_action, suggestion.ram_action = "keep", "downsize"
    suggestion.suggested_ram_gib = 8
    suggestion.save()
    vm = fleet_world.vm_a

    def matches(reason, **size):
        request = service.file_request(vm, admin_user, None, None, reason, **size)
        found = admin_api.get(f"{URL}{request.pk}/").json()["evidence"]["matches_request"]
        service.cancel(request, admin_user)
        return found

    assert matches("less RAM", requested_ram_gib=8) is True
    assert matches("less RAM, more vCPUs", requested_ram_gib=8, requested_vcpus=vm.vcpus + 4) is False
    assert matches("some RAM", requested_ram_gib=12) is False
