"""The evaluation end to end: stored samples and state -> alerts -> an e-mail through a real SMTP
server and a signed webhook to a real HTTP receiver, once per alert; resolution when the
condition ends; nothing while silenced; the artist told about their own VM only."""

from __future__ import annotations

import json
from datetime import UTC, datetime, timedelta

import pytest

from alerts import services
from alerts.evaluate import evaluate as evaluate_once
from alerts.evaluate import prune
from alerts.models import Alert, AlertRule, AlertState, Evaluation, EvaluationLease, LicencePool, LicenceUsage
from fleet import services as fleet_services
from fleet.models import Notification
from fleet.tests.factories import ArtistFactory, GpuFactory, HostFactory, UserFactory, VirtualMachineFactory, profile
from notify.messages import verify_signature
from notify.models import Delivery, NotificationChannel
from telemetry.models import Agent, VgpuHealthState, VgpuSample, XidError

pytestmark = pytest.mark.django_db

T0 = datetime(2026, 11, 26, 12, 0, tzinfo=UTC)
SECRET = "on-call-hook-secret-0123456789"


@pytest.fixture(autouse=True)
def _commit_callbacks(django_capture_on_commit_callbacks):
    """Deliveries leave when the evaluation's transaction commits: run those callbacks here too."""
    global _capture
    _capture = django_capture_on_commit_callbacks
    yield
    _capture = None


_capture = None


def evaluate(now: datetime):
    with _capture(execute=True):
        return evaluate_once(now)


@pytest.fixture
def world(smtp, receiver, eager):
    host = HostFactory(name="node-01")
    gpu = GpuFactory(host=host)
    ana = ArtistFactory(name="Ana", user=UserFactory(username="ana", email="ana@studio.test"))
    bob = ArtistFactory(name="Bob", user=UserFactory(username="bob", email="bob@studio.test"))
    vm = VirtualMachineFactory(name="vws-anim-01", artist=ana)
    other = VirtualMachineFactory(name="vws-model-02", artist=bob)
    fleet_services.place_vgpu(vm, gpu, profile("RTX6000-12Q"))
    fleet_services.place_vgpu(other, gpu, profile("RTX6000-12Q"))
    agent = Agent.objects.create(name="node-01-agent", url="http://node-01:9410", host=host)
    NotificationChannel.objects.create(name="on-call mail", kind="email", target="oncall@studio.test")
    NotificationChannel.objects.create(name="pager", kind="webhook", target=receiver.url, secret=SECRET)
    smtp.envelopes.clear()
    return {"host": host, "gpu": gpu, "vm": vm, "other": other, "agent": agent, "smtp": smtp,
            "receiver": receiver}


def alerts_of(rule: str) -> list[Alert]:
    return list(Alert.objects.filter(rule__kind=rule).order_by("pk"))


def webhook_bodies(receiver) -> list[dict]:
    bodies = []
    for post in receiver.posts:
        headers = {k.lower(): v for k, v in post.headers.items()}
        assert verify_signature(SECRET, headers["x-fleet-timestamp"], post.body, headers["x-fleet-signature"],
                                tolerance_s=10**9)
        bodies.append(json.loads(post.body))
    return bodies


def mails(smtp) -> list[str]:
    return [envelope.content.decode(errors="replace") for envelope in smtp.envelopes
            if "oncall@studio.test" in envelope.rcpt_tos]


def assert_one_firing_then_quiet(world, rule: str, now: datetime) -> Alert:
    evaluate(now)
    evaluate(now + timedelta(seconds=30))  # the condition still holds: the same alert, nothing new sent
    (alert,) = alerts_of(rule)
    assert alert.state == AlertState.FIRING
    assert len(mails(world["smtp"])) == 1
    (body,) = webhook_bodies(world["receiver"])
    assert body["event"] == "firing"
    assert body["rule"] == rule
    return alert


def assert_resolved(world, rule: str, now: datetime) -> None:
    evaluate(now)
    (alert,) = alerts_of(rule)
    assert alert.state == AlertState.RESOLVED
    assert alert.resolved_at == now
    assert [b["event"] for b in webhook_bodies(world["receiver"])] == ["firing", "resolved"]
    assert len(mails(world["smtp"])) == 2


def test_a_simulated_xid_fires_once_with_its_meaning_and_resolves_after_the_quiet_time(world):
    XidError.objects.create(gpu=world["gpu"], code=79, at=T0 - timedelta(minutes=1))
    alert = assert_one_firing_then_quiet(world, "xid", T0)
    assert "fallen off the bus" in alert.title
    assert set(alert.vms.values_list("name", flat=True)) == {"vws-anim-01", "vws-model-02"}
    assert "fallen off the bus" in mails(world["smtp"])[0]
    assert_resolved(world, "xid", T0 + timedelta(minutes=62))


def test_each_artist_on_a_failing_gpu_is_told_about_their_own_vm_only(world):
    XidError.objects.create(gpu=world["gpu"], code=48, at=T0 - timedelta(minutes=1))
    evaluate(T0)
    (ana_note,) = Notification.objects.filter(user__username="ana")
    (bob_note,) = Notification.objects.filter(user__username="bob")
    assert "vws-anim-01" in ana_note.message
    assert "vws-model-02" not in ana_note.message
    assert "vws-model-02" in bob_note.message
    assert "vws-anim-01" not in bob_note.message


def test_an_agent_that_stops_answering_fires_once_and_resolves_when_it_answers(world):
    agent = world["agent"]
    Agent.objects.filter(pk=agent.pk).update(consecutive_failures=3, last_error="connection refused",
                                             last_seen=T0 - timedelta(minutes=1))
    alert = assert_one_firing_then_quiet(world, "agent_unreachable", T0)
    assert "connection refused" in alert.summary
    Agent.objects.filter(pk=agent.pk).update(consecutive_failures=0, last_seen=T0 + timedelta(minutes=1))
    assert_resolved(world, "agent_unreachable", T0 + timedelta(minutes=1))


def test_a_licence_that_lapses_fires_once_and_resolves_when_licensed_again(world):
    state = VgpuHealthState.objects.create(vm=world["vm"], gpu=world["gpu"], type_name="RTX6000-12Q",
                                           license_state="unlicensed", changed_at=T0)
    alert = assert_one_firing_then_quiet(world, "vgpu_unlicensed", T0)
    assert list(alert.vms.values_list("name", flat=True)) == ["vws-anim-01"]
    state.license_state = "licensed"
    state.save()
    assert_resolved(world, "vgpu_unlicensed", T0 + timedelta(minutes=1))


def fb_samples(world, start: datetime, minutes: int, fb_mib: float) -> None:
    """Readings of Ana's vGPU every 10 s, as ingest stores them (with the inventory's vGPU row)."""
    vgpu = world["vm"].vgpus.get()
    VgpuSample.objects.bulk_create([
        VgpuSample(vm=world["vm"], gpu=world["gpu"], vgpu=vgpu, ts=start + timedelta(seconds=10 * i),
                   fb_used_mib=fb_mib, util_gpu=40) for i in range(minutes * 6)])


def test_a_frame_buffer_that_fills_fires_once_and_resolves_when_it_drains(world):
    fb_samples(world, T0 - timedelta(minutes=6), 6, 11_900.0)  # of the 12,288 MiB of RTX6000-12Q
    alert = assert_one_firing_then_quiet(world, "vgpu_fb_full", T0)
    assert "vws-anim-01" in alert.title
    fb_samples(world, T0 + timedelta(seconds=10), 6, 4_000.0)
    assert_resolved(world, "vgpu_fb_full", T0 + timedelta(minutes=6))


def test_a_frame_buffer_full_for_less_than_the_window_does_not_fire(world):
    fb_samples(world, T0 - timedelta(minutes=2), 2, 12_000.0)
    evaluate(T0)
    assert alerts_of("vgpu_fb_full") == []


def test_a_silenced_alert_is_recorded_but_nobody_is_notified_until_the_silence_ends(world, admin_user):
    services.create_silence(admin_user, reason="GPU swap tonight", host=world["host"],
                            starts_at=T0 - timedelta(hours=1), ends_at=T0 + timedelta(hours=2))
    XidError.objects.create(gpu=world["gpu"], code=79, at=T0 - timedelta(minutes=1))
    evaluate(T0)
    (alert,) = alerts_of("xid")
    assert alert.silenced is True
    assert world["receiver"].posts == []
    assert mails(world["smtp"]) == []
    assert not Notification.objects.filter(user__username="ana").exists()
    # Resolved while still silenced: quiet too.
    evaluate(T0 + timedelta(minutes=62))
    (alert,) = alerts_of("xid")
    assert alert.state == AlertState.RESOLVED
    assert Delivery.objects.count() == 0


def test_an_acknowledged_alert_stays_open_until_its_condition_ends(world, admin_user):
    XidError.objects.create(gpu=world["gpu"], code=79, at=T0 - timedelta(minutes=1))
    evaluate(T0)
    (alert,) = alerts_of("xid")
    services.acknowledge(alert, admin_user, "resetting at 22:00")
    evaluate(T0 + timedelta(minutes=1))
    alert.refresh_from_db()
    assert alert.state == AlertState.ACKNOWLEDGED
    assert alert.acknowledged_by == admin_user
    evaluate(T0 + timedelta(minutes=62))
    alert.refresh_from_db()
    assert alert.state == AlertState.RESOLVED


def test_a_recurrence_after_resolution_opens_a_new_alert(world):
    XidError.objects.create(gpu=world["gpu"], code=79, at=T0 - timedelta(minutes=1))
    evaluate(T0)
    evaluate(T0 + timedelta(minutes=62))
    XidError.objects.create(gpu=world["gpu"], code=79, at=T0 + timedelta(minutes=63))
    evaluate(T0 + timedelta(minutes=64))
    first, second = alerts_of("xid")
    assert (first.state, second.state) == (AlertState.RESOLVED, AlertState.FIRING)


def test_a_disabled_rule_fires_nothing_and_its_open_alerts_resolve(world):
    XidError.objects.create(gpu=world["gpu"], code=79, at=T0 - timedelta(minutes=1))
    evaluate(T0)
    services.update_rule(AlertRule.objects.get(kind="xid"), enabled=False)
    evaluate(T0 + timedelta(minutes=1))
    (alert,) = alerts_of("xid")
    assert alert.state == AlertState.RESOLVED


def test_one_evaluation_at_a_time_and_a_lost_ones_lease_lapses(world, settings):
    EvaluationLease.objects.create(pk=1, holder="a-worker-that-died", until=T0 + timedelta(seconds=60))
    outcome = evaluate(T0)
    assert outcome.evaluation is None
    assert Evaluation.objects.count() == 0
    outcome = evaluate(T0 + timedelta(seconds=61))
    assert outcome.evaluation is not None
    assert outcome.evaluation.error == ""
    assert EvaluationLease.objects.get(pk=1).holder == ""


def test_licence_use_is_recorded_once_a_minute_per_edition_and_the_pool_rule_fires(world):
    LicencePool.objects.create(edition="vws", owned=2)
    for vm in (world["vm"], world["other"]):
        VgpuHealthState.objects.create(vm=vm, gpu=world["gpu"], type_name="RTX6000-12Q", license_state="licensed",
                                       changed_at=T0)
    evaluate(T0)
    evaluate(T0 + timedelta(seconds=20))
    (usage,) = LicenceUsage.objects.all()
    assert (usage.edition, usage.in_use, usage.unlicensed) == ("vws", 2, 0)
    (alert,) = alerts_of("licence_pool")
    assert "100%" in alert.title



def test_prune_keeps_open_alerts_and_recent_history(world, settings):
    settings.ALERTS_KEEP_DAYS = 30
    XidError.objects.create(gpu=world["gpu"], code=79, at=T0 - timedelta(minutes=1))
    evaluate(T0)
    evaluate(T0 + timedelta(minutes=62))  # resolved
    XidError.objects.create(gpu=world["gpu"], code=13, at=T0 + timedelta(days=40))
    evaluate(T0 + timedelta(days=40, minutes=1))  # another, still open
    LicenceUsage.objects.create(ts=T0, edition="vws", in_use=1, unlicensed=0)
    removed = prune(T0 + timedelta(days=40, minutes=2))
    assert removed["alerts"] >= 1
    assert [a.details["code"] for a in alerts_of("xid")] == [13]
    assert not LicenceUsage.objects.filter(ts=T0).exists()
    assert Evaluation.objects.filter(started_at__lt=T0 + timedelta(days=39)).count() == 0


def _xid(world):
    XidError.objects.create(gpu=world["gpu"], code=79, at=T0 - timedelta(minutes=1))


def _agent_stops(world):
    Agent.objects.filter(pk=world["agent"].pk).update(consecutive_failures=5, last_error="timed out")


def _licence_lapses(world):
    VgpuHealthState.objects.create(vm=world["vm"], gpu=world["gpu"], type_name="RTX6000-12Q",
                                   license_state="unlicensed", changed_at=T0)


def _frame_buffer_fills(world):
    fb_samples(world, T0 - timedelta(minutes=6), 6, 12_100.0)


@pytest.mark.parametrize(("rule", "condition"), [("xid", _xid), ("agent_unreachable", _agent_stops),
                                                  ("vgpu_unlicensed", _licence_lapses),
                                                  ("vgpu_fb_full", _frame_buffer_fills)])
def test_each_kind_stays_quiet_while_its_host_is_silenced(world, admin_user, rule, condition):
    services.create_silence(admin_user, reason="maintenance window", host=world["host"],
                            starts_at=T0 - timedelta(hours=1), ends_at=T0 + timedelta(hours=1))
    condition(world)
    evaluate(T0)
    (alert,) = alerts_of(rule)
    assert alert.silenced is True
    assert Delivery.objects.count() == 0
    assert mails(world["smtp"]) == []
    assert world["receiver"].posts == []
