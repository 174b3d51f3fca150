"""The small studio the fault tests break: two hosts polled by real agents, an admin with an API
token and an e-mail address, and a pending resize request; and a host linked to a simulated
hypervisor, for the operations that carry an approval out on it."""

from __future__ import annotations

from dataclasses import dataclass

from django.conf import settings
from django.db.models import Count
from django.test import Client

from faults.services import wait_for
from faults.stack import Stack, Web
from fleet import requests as resize_requests
from fleet import services
from fleet.api_tokens import issue_token
from fleet.models import Gpu, Host, ResizeRequest, Vgpu, VirtualMachine
from fleet.tests import factories
from fleet.tests.factories import UserFactory, profile
from hypervisors import sim_seed
from hypervisors.tests.fixtures import BUS_A, BUS_B
from telemetry.models import GpuSample, VgpuSample
from telemetry.tests.loopback import inventory_host


@dataclass
class World:
    hosts: list[Host]
    request: ResizeRequest
    admin_token: str
    admin_session: str


def build_world() -> World:
    studio = inventory_host("studio-01", gpus=2, vgpus_per_gpu=1)
    render = inventory_host("render-01", gpus=1, vgpus_per_gpu=1)
    admin = UserFactory(username="it-admin", email="it-admin@studio.example", is_staff=True, is_superuser=True)
    vm = studio.gpus.order_by("pk").first().vgpus.get().vm
    # The artist is told of the decision by e-mail too.
    type(vm.artist.user).objects.filter(pk=vm.artist.user_id).update(email="artist@studio.example")
    request = resize_requests.file_request(vm, admin, profile("RTX6000-8Q"), 1, "smaller, the shot is lighter")
    client = Client()
    client.force_login(admin)
    return World(hosts=[studio, render], request=request, admin_token=issue_token(admin, "fault tests")[1],
                 admin_session=client.cookies[settings.SESSION_COOKIE_NAME].value)


def browser(stack_web: Web, world: World) -> Web:
    """`stack_web` logged in as the admin by session cookie (the pages)."""
    stack_web.headers["Cookie"] = f"{settings.SESSION_COOKIE_NAME}={world.admin_session}"
    return stack_web


def api(port_of: Web, world: World) -> Web:
    """A second client of the same server, authenticated by the admin's API token."""
    client = Web(int(port_of.base.rsplit(":", 1)[1]))
    client.headers["Authorization"] = f"Token {world.admin_token}"
    return client


def sample_keys() -> set[tuple[int, float]]:
    """Every stored GPU sample as (gpu id, instant)."""
    return {(gpu, ts.timestamp()) for gpu, ts in GpuSample.objects.values_list("gpu_id", "ts")}


def assert_no_duplicates() -> None:
    """The unique keys hold: one GPU sample per GPU and second, one vGPU sample per VM, GPU and second."""
    assert not GpuSample.objects.values("gpu_id", "ts").annotate(n=Count("id")).filter(n__gt=1).exists()
    assert not VgpuSample.objects.values("vm_id", "gpu_id", "ts").annotate(n=Count("id")).filter(n__gt=1).exists()


def polls_per_gpu() -> dict[int, int]:
    return dict(GpuSample.objects.values_list("gpu_id").annotate(n=Count("id")))


def start_collecting(stack: Stack, world: World) -> set[int]:
    """Start an agent per host, a worker and beat, and wait until every GPU has a sample (the
    state each fault starts from); returns the GPUs' ids."""
    stack.write_agents(world.hosts)
    for agent in stack.manifest:
        stack.start_agent(agent.name)
    stack.start_worker()
    stack.start_beat()
    gpus = set(Gpu.objects.values_list("pk", flat=True))
    assert wait_for(lambda: set(polls_per_gpu()) == gpus, 60), f"no samples from every GPU\n{stack.outputs()}"
    return gpus


@dataclass
class LinkedWorld:
    """node-01 linked to the simulated hypervisor sim://node-01, where ws-ana runs with one
    L40S-24Q; her pending request for an L40S-12Q; an admin with an API token."""

    host: Host
    vm: VirtualMachine
    request: ResizeRequest
    old_device: str
    admin_token: str


def build_linked_world(shutdown_s: float) -> LinkedWorld:
    """The inventory and its simulated hypervisor in step (`sim_seed.seed_host`), in
    settings.HYPERVISOR_SIM_DIR; the guest takes `shutdown_s` seconds to power off once asked."""
    host = factories.HostFactory(name="node-01", hypervisor_uri="sim://node-01")
    l40s = factories.gpu_model("NVIDIA L40S")
    gpu = factories.GpuFactory(host=host, gpu_model=l40s, pci_bus_id=BUS_A)
    factories.GpuFactory(host=host, gpu_model=l40s, pci_bus_id=BUS_B)
    artist = factories.ArtistFactory(name="Ana", user=UserFactory(username="ana", email="ana@studio.example"))
    vm = factories.VirtualMachineFactory(name="ws-ana", artist=artist, vcpus=8, ram_gib=32)
    services.place_vgpu(vm, gpu, profile("L40S-24Q"))
    sim_seed.seed_host(host).set_shutdown_s(shutdown_s)
    old_device = Vgpu.objects.get(vm=vm).device_id
    request = resize_requests.file_request(vm, artist.user, profile("L40S-12Q"), 1, "lighter scenes now")
    admin = UserFactory(username="it-admin", email="it-admin@studio.example", is_staff=True, is_superuser=True)
    return LinkedWorld(host=host, vm=vm, request=request, old_device=old_device,
                       admin_token=issue_token(admin, "fault tests")[1])
