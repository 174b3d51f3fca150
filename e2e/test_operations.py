"""An approval carried out on the hypervisor, in a real browser with a real Celery worker: the
admin opens a pending request of a VM on a linked (simulated) host, reads that the host is
linked, ticks "Run it now" and the confirmation, lands on the operation's page and watches it
(refreshed every 2 s by htmx) go through its steps to "Succeeded"; the VM's page then shows the
new profile, and the host's hypervisor runs the VM with the new vGPU.

The worker is a `celery worker` child process on the test's database (transaction=True: what
the test and the live server write is committed) and on this run's broker, on a queue of its
own; the live server's approval sends the operation there.
"""

from __future__ import annotations

import os
import uuid
from collections.abc import Iterator
from pathlib import Path

import pytest
from celery import Celery
from django.conf import settings

from e2e.conftest import request_on_its_host, sign_in
from fleet.models import Vgpu, VirtualMachine
from hypervisors import operations, sim_seed
from hypervisors.backends.base import PowerState
from hypervisors.backends.sim import SimBackend
from hypervisors.matching import type_name_for
from hypervisors.models import Operation
from telemetry.tests.test_worker import START_TIMEOUT_S, Worker, database_env, shared_broker

pytestmark = pytest.mark.django_db(transaction=True, serialized_rollback=True)

#: Seconds the guest takes to power off: long enough to see the operation running.
SHUTDOWN_S = 3.0
STEPS = ["notify", "shutdown", "remove_vgpu", "create_vgpu", "redefine", "start", "verify"]


@pytest.fixture
def operation_worker(tmp_path, monkeypatch) -> Iterator[Worker]:
    """A real worker on this run's broker (REDIS_URL's own database, else the filesystem broker)
    and a queue of the test's, sharing the test's simulated hypervisors; the operations the live
    server enqueues are sent to it."""
    queue = f"test-operations-{uuid.uuid4().hex[:10]}"
    if settings.REDIS_URL:
        broker_env, publisher = {"CELERY_BROKER_URL": settings.REDIS_URL}, Celery("publisher",
                                                                                  broker=settings.REDIS_URL)
    else:
        broker_env, publisher = shared_broker(tmp_path)
    sim_dir = tmp_path / "sim"
    monkeypatch.setattr(settings, "HYPERVISOR_SIM_DIR", sim_dir)
    env = {**os.environ, **database_env(), **broker_env, "CELERY_QUEUE": queue, "PYTHONUNBUFFERED": "1",
           "HYPERVISOR_SIM_DIR": str(sim_dir), "HYPERVISOR_VERIFY_WAIT_S": "0",
           "HYPERVISOR_SHUTDOWN_TIMEOUT_S": "60"}
    monkeypatch.setattr(operations, "enqueue", lambda operation_id: publisher.send_task(
        operations.RUN_OPERATION_TASK, args=[operation_id], queue=queue))
    worker = Worker(env)
    try:
        if not worker.ready.wait(START_TIMEOUT_S):
            pytest.fail(f"the worker did not start within {START_TIMEOUT_S} s:\n{worker.output}")
        yield worker
    finally:
        # Before the database is flushed: the worker holds connections to it.
        worker.stop()
        publisher.close()


def test_admin_approves_on_a_linked_host_and_watches_the_operation_succeed(page, demo_world, operation_worker,
                                                                          tmp_path):
    out = Path(os.environ.get("SCREENSHOT_DIR") or tmp_path)
    out.mkdir(parents=True, exist_ok=True)
    # The demo's hosts, linked to simulated hypervisors as `make run` links them.
    sim_seed.link_demo_hosts()
    candidates = VirtualMachine.objects.filter(vgpus__isnull=False, artist__isnull=False).distinct().order_by("name")
    request = next(r for r in (request_on_its_host(vm, vm.artist.user, "lighter scenes this month")
                               for vm in candidates) if r is not None)
    vm = request.vm
    target = request.requested_profile
    host = SimBackend.open(vm.host.hypervisor_uri)
    host.set_shutdown_s(SHUTDOWN_S)
    old_devices = {d.id for d in host.domain(str(vm.uuid)).vgpus}

    sign_in(page, "admin", next_path=f"/requests/{request.pk}/review/")
    linked = page.locator("[data-linked]")
    assert f"{vm.host.name} is linked to its hypervisor" in linked.inner_text()
    assert vm.host.hypervisor_uri in linked.inner_text()
    confirm = page.locator("[data-form=confirm]")
    run_now = confirm.locator("input[name=run_now]")
    run_now.check()
    confirm.locator("input[name=confirm]").check()
    confirm.locator("input[name=comment]").fill("go ahead, it is quiet now")
    page.screenshot(path=str(out / "operation-approve-linked.png"), full_page=True)
    confirm.locator("button[type=submit]").click()

    operation = Operation.objects.get(request=request)
    page.wait_for_url(f"**/operations/{operation.pk}/")
    assert f"operation #{operation.pk} carries it out on {vm.host.name}" in page.locator("ul.messages").inner_text()
    # The page refreshes itself while the operation runs: the guest takes SHUTDOWN_S to power off.
    page.locator("[data-step=shutdown][data-step-status=running]").wait_for(timeout=30_000)
    assert page.locator("[data-op-status]").inner_text() == "Running"
    page.screenshot(path=str(out / "operation-running.png"), full_page=True)
    page.locator("#operation[data-status=succeeded]").wait_for(timeout=60_000)
    assert page.locator("[data-op-status]").inner_text() == "Succeeded"
    rows = page.locator("[data-table=steps] tbody tr")
    assert [rows.nth(i).get_attribute("data-step") for i in range(rows.count())] == STEPS
    assert [rows.nth(i).get_attribute("data-step-status") for i in range(rows.count())] == ["done"] * len(STEPS)
    assert "Task hypervisors.tasks.run_operation" in operation_worker.output
    page.screenshot(path=str(out / "operation-succeeded.png"), full_page=True)

    # The VM's page shows the new profile; the hypervisor runs the VM with the new device, whose id
    # the inventory records.
    page.locator("h1 a", has_text=vm.name).click()
    page.wait_for_url(f"**/vms/{vm.pk}/")
    assert target.name in page.locator("[data-table=vgpus]").inner_text()
    page.locator("[data-section=vgpus]").screenshot(path=str(out / "operation-vm-after.png"))
    domain = SimBackend.open(vm.host.hypervisor_uri).domain(str(vm.uuid))
    assert domain.state == PowerState.RUNNING
    assert not {d.id for d in domain.vgpus} & old_devices
    assert {d.type_name for d in domain.vgpus} == {type_name_for(target.name)}
    assert sorted(d.id for d in domain.vgpus) == sorted(Vgpu.objects.filter(vm=vm).values_list("device_id", flat=True))
