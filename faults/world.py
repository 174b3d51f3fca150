"""The small studio the fault tests break: two hosts polled by real agents, an admin with an API
token and an e-mail address, and a pending resize request."""

from __future__ import annotations

from dataclasses import dataclass

from django.conf import settings
from django.db.models import Count
from django.test import Client

from faults.services import wait_for
from faults.stack import Stack, Web
from fleet import requests as resize_requests
from fleet.api_tokens import issue_token
from fleet.models import Gpu, Host, ResizeRequest
from fleet.tests.factories import UserFactory, profile
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
