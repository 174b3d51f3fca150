"""The ways sync runs without a browser: `manage.py hypervisor_sync`, the periodic task over
every linked host (one unreachable host does not stop the others), its beat entry, and the
demo's simulated hypervisors (`demo_hypervisors`)."""

import importlib.util
from io import StringIO

import pytest
from django.core.management import CommandError, call_command
from django_celery_beat.models import PeriodicTask

from fleet.models import Vgpu, VirtualMachine
from fleet.tests.factories import HostFactory
from hypervisors import schedules, sim_seed, tasks
from hypervisors.backends import sim
from hypervisors.models import HypervisorStatus, SyncReport
from hypervisors.tests.fixtures import BUS_A

pytestmark = pytest.mark.django_db


def run(*args) -> str:
    out = StringIO()
    call_command("hypervisor_sync", *args, stdout=out, stderr=out)
    return out.getvalue()


def test_command_reports_then_applies(linked):
    assert "node-01 (sim://node-01): in step with the inventory (2 domain(s))" in run()
    device = linked.sim.create_vgpu(BUS_A, "NVIDIA RTX6000-12Q")
    linked.sim.define_domain("ws-new", vcpus=4, ram_mib=16384, vgpus=(device,), running=True)

    out = run("--host", "node-01")
    assert "1 difference(s)" in out
    assert "new       ws-new" in out
    assert not VirtualMachine.objects.filter(name="ws-new").exists()

    out = run("--host", "node-01", "--apply", "all")
    assert "ws-new: applied: Created VM ws-new" in out
    assert VirtualMachine.objects.get(name="ws-new").vgpus.get().device_id == device.id
    # Read three times, and once more after applying: the last report is the state after the change.
    assert SyncReport.objects.filter(trigger="command").count() == 4
    assert SyncReport.objects.filter(host=linked.host).first().differences == []
    assert HypervisorStatus.objects.get(host=linked.host).ok is True


def test_command_refuses_unknown_and_unlinked_hosts(linked):
    with pytest.raises(CommandError, match="No host named nowhere"):
        run("--host", "nowhere")
    HostFactory(name="bare")
    with pytest.raises(CommandError, match="No hypervisor URI on bare"):
        run("--host", "bare")


def test_command_exits_1_when_a_hypervisor_cannot_be_read(linked):
    linked.sim.path.unlink()
    with pytest.raises(CommandError, match="1 hypervisor"):
        run()


def test_task_goes_on_past_unreachable_hosts(linked, tmp_path):
    HostFactory(name="node-02", hypervisor_uri="sim://node-02")  # no state file: the host is down
    # A libvirt host whose daemon is not there (or, without libvirt-python, one that cannot be read).
    HostFactory(name="node-03", hypervisor_uri=f"qemu+unix:///system?socket={tmp_path}/no-libvirtd-sock")
    HostFactory(name="bare")  # not linked: not read

    assert tasks.sync_hypervisors() == {"hosts": 3, "ok": 1, "failed": 2}

    reports = {r.host.name: r for r in SyncReport.objects.select_related("host")}
    assert set(reports) == {"node-01", "node-02", "node-03"}
    assert reports["node-01"].ok
    assert reports["node-01"].diff["summary"]["same"] == 2
    assert not reports["node-02"].ok
    assert "node-02.json" in reports["node-02"].error
    assert not reports["node-03"].ok
    why = "Could not connect" if importlib.util.find_spec("libvirt") else "libvirt-python is not installed"
    assert why in reports["node-03"].error
    statuses = {s.host.name: s.ok for s in HypervisorStatus.objects.select_related("host")}
    assert statuses == {"node-01": True, "node-02": False, "node-03": False}


def test_beat_entry_is_created_once_and_kept(settings):
    # migrate created it (post_migrate); a fresh database with another interval:
    PeriodicTask.objects.get(name=schedules.SYNC_HYPERVISORS).delete()
    settings.HYPERVISOR_SYNC_INTERVAL_S = 600
    schedules.ensure_default_schedules()
    entry = PeriodicTask.objects.get(name=schedules.SYNC_HYPERVISORS)
    assert entry.task == "hypervisors.tasks.sync_hypervisors"
    assert (entry.interval.every, entry.expire_seconds) == (600, 540)
    entry.enabled = False
    entry.save()
    schedules.ensure_default_schedules()
    assert PeriodicTask.objects.get(name=schedules.SYNC_HYPERVISORS).enabled is False


def test_the_demo_fleet_is_linked_and_in_step(sim_dir):
    call_command("seed_demo", "--hosts", "2", stdout=StringIO())
    out = StringIO()
    call_command("demo_hypervisors", stdout=out)
    assert "poc-rtx6000: sim://poc-rtx6000 (simulated, seeded: 4 domains)" in out.getvalue()
    assert (sim_dir / "poc-rtx6000.json").is_file()
    assert not Vgpu.objects.filter(device_id="").exists()

    assert run().count("in step with the inventory") == 3

    poc = sim.SimBackend.open("sim://poc-rtx6000")
    domain = poc.list_domains()[0]
    poc.change_domain(domain.uuid, vcpus=domain.vcpus + 2)
    out = StringIO()
    call_command("demo_hypervisors", stdout=out)  # an existing simulation keeps its state
    assert "poc-rtx6000: sim://poc-rtx6000 (simulated, state kept)" in out.getvalue()
    assert poc.domain(domain.uuid).vcpus == domain.vcpus + 2
    call_command("demo_hypervisors", "--reseed", "--host", "poc-rtx6000", stdout=StringIO())
    assert poc.domain(domain.uuid).vcpus == domain.vcpus


def test_seed_writes_the_catalog_types_and_running_domains(linked):
    state, new_ids = sim_seed.sim_state_for(linked.host)
    assert new_ids == {}  # seeded once already: the device ids are the inventory's
    types = {t["name"]: t["max_instances"] for t in state["gpus"][0]["types"]}
    assert types["NVIDIA RTX6000-12Q"] == 2
    assert types["NVIDIA RTX6000-24Q"] == 1
    domains = {d.name: d for d in linked.sim.list_domains()}
    assert domains["ws-b"].state == "running"
    assert (domains["ws-b"].vcpus, domains["ws-b"].ram_mib) == (12, 65536)
    assert domains["ws-b"].vgpus[0].type_name == "NVIDIA RTX6000-24Q"
    # The equal-size rule holds on the seeded host: the first GPU takes one more 12Q only.
    available = {(t.gpu_bus_id, t.name): t.available for t in linked.sim.vgpu_types()}
    assert available[(BUS_A, "NVIDIA RTX6000-12Q")] == 1
    assert available[(BUS_A, "NVIDIA RTX6000-24Q")] == 0
