"""The agent's vGPU device action over real HTTP on loopback: the agent server in a thread, a
fake host sysfs in either NVIDIA layout made to behave by its emulated kernel
(`telemetry.agent.fake_sysfs`), and the requests the dashboard sends."""

from __future__ import annotations

import contextlib
import http.client
import json
import re
import signal
import subprocess
import sys
import tempfile
import urllib.parse
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path

import pytest

from telemetry.agent.fake_sysfs import (
    L40S_SRIOV,
    T4_MDEV,
    FakeGpu,
    KernelEmulator,
    build_mdev_host,
    build_sriov_host,
)
from telemetry.agent.scenario import build_scenario
from telemetry.agent.server import AgentServer
from telemetry.agent.sim_backend import SimBackend
from telemetry.agent.vgpu_devices import HostSysfs
from telemetry.tests.loopback import serving

READ, WRITE, DEVICE = "read-token", "write-token", "device-token"


@dataclass(frozen=True)
class Layout:
    """One NVIDIA layout as a test sees it: the GPU, a type that fits twice, a smaller size."""

    name: str
    gpu: str  # as the agent answers it (NVML's spelling)
    sysfs_gpu: str
    two_fit: str  # a type of which the GPU holds two
    two_fit_id: str
    smaller: str
    device_kind: str


MDEV = Layout("mdev", "00000000:3B:00.0", "0000:3b:00.0", "GRID T4-8Q", "nvidia-233", "GRID T4-4Q", "mdev")
SRIOV = Layout("sriov", "00000000:41:00.0", "0000:41:00.0", "NVIDIA L40S-24Q", "1163", "NVIDIA L40S-12Q", "vf")


@dataclass
class Host:
    layout: Layout
    root: Path
    emulator: KernelEmulator
    server: AgentServer

    def call(self, method: str, path: str, body=None, token: str | None = DEVICE):
        """(status, headers, decoded body or None); waits for the emulated kernel after a change."""
        conn = http.client.HTTPConnection(*self.server.server_address[:2], timeout=10)
        headers = {}
        if token is not None:
            headers["Authorization"] = f"Bearer {token}"
        raw = None
        if body is not None:
            raw = body if isinstance(body, bytes) else json.dumps(body).encode()
            headers["Content-Type"] = "application/json"
        try:
            conn.request(method, path, body=raw, headers=headers)
            response = conn.getresponse()
            data = response.read()
        finally:
            conn.close()
        if method in ("POST", "DELETE"):
            self.emulator.settle()
        return response.status, response, json.loads(data) if data else None

    def create(self, type_name: str | None = None, gpu: str | None = None):
        return self.call("POST", "/v1/vgpu-devices", {"gpu": gpu or self.layout.gpu,
                                                       "type": type_name or self.layout.two_fit})

    def delete(self, device_id: str):
        return self.call("DELETE", f"/v1/vgpu-devices/{urllib.parse.quote(device_id, safe='')}")

    def types(self) -> dict[str, dict]:
        status, _, document = self.call("GET", "/v1/vgpu-types")
        assert status == 200
        return {item["name"]: item for item in document["types"]}

    def devices(self) -> list[dict]:
        status, _, document = self.call("GET", "/v1/vgpu-devices")
        assert status == 200
        return document["devices"]


def sim_backend() -> SimBackend:
    return SimBackend(build_scenario("node-01", []))


@contextlib.contextmanager
def fake_host(layout: Layout, root: Path, *, device_token: str | None = DEVICE) -> Iterator[Host]:
    """The real agent server, managing the devices of a fake sysfs under `root` in `layout`."""
    gpus = [FakeGpu(layout.sysfs_gpu, T4_MDEV if layout is MDEV else L40S_SRIOV)]
    (build_mdev_host if layout is MDEV else build_sriov_host)(root, gpus)
    # settle_s: how long the agent waits to see a removal happen before calling the device busy.
    devices = HostSysfs(root, settle_s=0.5)
    server = AgentServer(("127.0.0.1", 0), sim_backend(), READ, "node-01", write_token=WRITE,
                         device_token=device_token, devices=devices)
    with KernelEmulator(root, gpus) as emulator, serving(server):
        yield Host(layout, root, emulator, server)


@pytest.fixture(params=[MDEV, SRIOV], ids=["mdev", "sriov"])
def host(request, tmp_path) -> Iterator[Host]:
    with fake_host(request.param, tmp_path) as world:
        yield world


# -- listing ------------------------------------------------------------------------------------

def test_types_are_listed_by_name_with_the_ids_the_host_gives(host):
    types = host.types()
    offered = types[host.layout.two_fit]
    assert offered["gpu"] == host.layout.gpu
    assert offered["id"] == host.layout.two_fit_id  # read from the tree, whatever the driver numbers it
    assert offered["layout"] == host.layout.device_kind
    if host.layout is MDEV:
        assert [(name, item["available"]) for name, item in types.items()] == [
            ("GRID T4-1Q", 16), ("GRID T4-2Q", 8), ("GRID T4-4Q", 4), ("GRID T4-8Q", 2), ("GRID T4-16Q", 1)]
    else:
        # SR-IOV says only which types each free VF can take: 16 free VFs offer each.
        assert len(types) == 10
        assert {item["available"] for item in types.values()} == {16}
    assert host.devices() == []


# -- creating with the id the dashboard chose -----------------------------------------------------

def test_an_mdev_is_created_with_the_uuid_asked_for_and_a_second_ask_is_refused():
    chosen = "0b3c6a9e-1d2f-4e5a-8b7c-6d5e4f3a2b1c"
    with tempfile.TemporaryDirectory() as root, fake_host(MDEV, Path(root)) as host:
        body = {"gpu": host.layout.gpu, "type": host.layout.two_fit, "id": chosen.upper()}
        status, _, device = host.call("POST", "/v1/vgpu-devices", body)
        assert (status, device["id"]) == (201, chosen)
        assert (host.root / "sys/bus/mdev/devices" / chosen).exists()
        again, _, refusal = host.call("POST", "/v1/vgpu-devices", body)
        assert (again, refusal["reason"]) == (409, "exists")
        bad, _, refusal = host.call("POST", "/v1/vgpu-devices", {**body, "id": "not-a-uuid"})
        assert bad == 400
        assert "id, when given, must be a UUID" in refusal["error"]
        assert [d["id"] for d in host.devices()] == [chosen]


# -- creating until the GPU is full -------------------------------------------------------------

def test_creates_until_the_gpu_is_full_then_refuses_with_no_instance(host):
    first = host.create()
    second = host.create()
    third = host.create()

    assert (first[0], second[0]) == (201, 201)
    made = [first[2], second[2]]
    for device in made:
        assert device["gpu"] == host.layout.gpu
        assert device["type"] == host.layout.two_fit
        assert device["type_id"] == host.layout.two_fit_id
        assert device["kind"] == host.layout.device_kind
    assert first[1].getheader("Location") == f"/v1/vgpu-devices/{made[0]['id']}"
    if host.layout is MDEV:
        assert all(re.fullmatch(r"[0-9a-f-]{36}", device["id"]) for device in made)
        assert all((host.root / "sys/bus/mdev/devices" / device["id"]).exists() for device in made)
    else:
        assert [device["id"] for device in made] == ["00000000:41:00.4", "00000000:41:00.5"]
        assert (host.root / "sys/bus/pci/devices/0000:41:00.4/nvidia/current_vgpu_type").read_text().strip() == "1163"

    assert third[0] == 409
    assert third[2] == {"reason": "no_instance", "error": f"GPU {host.layout.gpu} has no room for another "
                                                          f"{host.layout.two_fit}: it holds 2 x {host.layout.two_fit}"}
    assert sorted(device["id"] for device in host.devices()) == sorted(device["id"] for device in made)
    types = host.types()
    if host.layout is MDEV:
        assert {item["available"] for item in types.values()} == {0}
    else:
        assert types == {}  # a full card lists nothing creatable on any VF


def test_once_a_gpu_holds_one_size_another_size_is_refused(host):
    assert host.create()[0] == 201

    status, _, answer = host.create(host.layout.smaller)

    assert (status, answer["reason"]) == (409, "no_instance")
    assert answer["error"] == (f"GPU {host.layout.gpu} has no room for another {host.layout.smaller}: it holds "
                               f"1 x {host.layout.two_fit}")
    types = host.types()
    assert types[host.layout.two_fit]["available"] == (1 if host.layout is MDEV else 15)
    assert types.get(host.layout.smaller, {"available": 0})["available"] == 0


def test_removing_a_device_frees_its_slot(host):
    made = host.create()[2]

    status, response, body = host.delete(made["id"])

    assert (status, body) == (204, None)
    assert response.getheader("Content-Length") is None
    assert host.devices() == []
    assert host.types()[host.layout.smaller]["available"] == (4 if host.layout is MDEV else 16)
    assert host.create(host.layout.smaller)[0] == 201


def test_a_device_already_gone_is_404(host):
    made = host.create()[2]
    host.delete(made["id"])

    status, _, answer = host.delete(made["id"])

    assert (status, answer) == (404, {"reason": "no_device", "error": f"no vGPU {made['id']} on this host"})


def test_a_device_a_running_vm_holds_is_busy_and_stays(host):
    made = host.create()[2]
    host.emulator.hold(made["id"])

    status, _, answer = host.delete(made["id"])

    assert status == 409
    assert answer == {"reason": "busy",
                      "error": f"vGPU {made['id']} is in use (a running VM holds it): shut the VM down first"}
    assert [device["id"] for device in host.devices()] == [made["id"]]
    host.emulator.release(made["id"])
    assert host.delete(made["id"])[0] == 204


# -- unknown GPU or type ------------------------------------------------------------------------

def test_unknown_gpu_is_404_naming_the_gpus_that_offer_vgpus(host):
    status, _, answer = host.create(gpu="00000000:AF:00.0")
    assert (status, answer["reason"]) == (404, "no_gpu")
    assert answer["error"] == f"no GPU 00000000:AF:00.0 offers vGPUs on this host (GPUs that do: {host.layout.gpu})"


def test_a_type_the_gpu_does_not_offer_is_404_with_what_it_offers(host):
    status, _, answer = host.create("NVIDIA A40-8Q")
    assert (status, answer["reason"]) == (404, "no_type")
    assert answer["error"].startswith(f"GPU {host.layout.gpu} offers no vGPU type named 'NVIDIA A40-8Q' (it offers: ")
    assert host.layout.two_fit in answer["error"]


def test_the_gpu_may_be_named_as_sysfs_spells_it(host):
    status, _, device = host.create(gpu=host.layout.sysfs_gpu)
    assert (status, device["gpu"]) == (201, host.layout.gpu)


# -- credentials --------------------------------------------------------------------------------

@pytest.mark.parametrize("token", [READ, WRITE, "wrong", None])
@pytest.mark.parametrize(("method", "path"), [("GET", "/v1/vgpu-types"), ("GET", "/v1/vgpu-devices"),
                                              ("POST", "/v1/vgpu-devices")])
def test_only_the_device_token_opens_the_device_paths(tmp_path, token, method, path):
    with fake_host(MDEV, tmp_path) as world:
        status, response, answer = world.call(method, path, {"gpu": MDEV.gpu, "type": MDEV.two_fit}
                                              if method == "POST" else None, token=token)
        assert world.devices() == []
    assert status == 401
    assert answer["error"] == ("missing bearer token" if token is None else "invalid bearer token")
    assert response.getheader("WWW-Authenticate").startswith('Bearer realm="vgpu-agent"')


def test_the_device_token_does_not_open_metrics_or_the_scheduler(tmp_path):
    with fake_host(MDEV, tmp_path) as world:
        metrics = world.call("GET", "/v1/metrics")
        scheduler = world.call("PUT", "/v1/gpus/GPU-1/scheduler", {"policy": "best_effort"})
    assert (metrics[0], scheduler[0]) == (401, 401)


@pytest.mark.parametrize(("method", "path"), [("GET", "/v1/vgpu-types"), ("GET", "/v1/vgpu-devices"),
                                              ("POST", "/v1/vgpu-devices"),
                                              ("DELETE", "/v1/vgpu-devices/00000000:41:00.4")])
def test_an_agent_without_a_device_token_answers_403_saying_how_to_enable_it(tmp_path, method, path):
    with fake_host(SRIOV, tmp_path, device_token=None) as world:
        status, _, answer = world.call(method, path, {"gpu": SRIOV.gpu, "type": SRIOV.two_fit}
                                       if method == "POST" else None)
        vfs = [p.read_text().strip() for p in tmp_path.glob("sys/bus/pci/devices/*/nvidia/current_vgpu_type")]
    assert status == 403
    assert answer == {"error": "this agent does not manage vGPU devices: start it with --device-token-file (and "
                               "--sysfs-root where sysfs is not at /) to create and remove vGPUs through it"}
    assert set(vfs) == {"0"}


# -- bad requests -------------------------------------------------------------------------------

@pytest.mark.parametrize(("body", "error"), [
    (b"", "send a JSON body of 1 to 4096 bytes"),
    (b"{", "the body is not valid JSON"),
    (["GRID T4-8Q"], 'the body must be a JSON object: {"gpu": ..., "type": ...}'),
    ({"type": "GRID T4-8Q"}, "gpu must be the GPU's PCI address, e.g. 00000000:3B:00.0"),
    ({"gpu": "GPU-1234", "type": "GRID T4-8Q"}, "gpu must be the GPU's PCI address, e.g. 00000000:3B:00.0"),
    ({"gpu": "3b:00.0"}, "type must be a vGPU type name of 1 to 100 characters, e.g. NVIDIA L40S-12Q"),
    ({"gpu": "3b:00.0", "type": "  "}, "type must be a vGPU type name of 1 to 100 characters, e.g. NVIDIA L40S-12Q"),
    ({"gpu": "3b:00.0", "type": "x" * 101},
     "type must be a vGPU type name of 1 to 100 characters, e.g. NVIDIA L40S-12Q"),
])
def test_a_bad_body_is_400_and_changes_nothing(tmp_path, body, error):
    with fake_host(MDEV, tmp_path) as world:
        status, _, answer = world.call("POST", "/v1/vgpu-devices", body)
        assert world.devices() == []
    assert (status, answer) == (400, {"error": error, "reason": "bad_request"})


@pytest.mark.parametrize(("method", "path", "allowed"), [
    ("PUT", "/v1/vgpu-devices", "GET, POST"),
    ("DELETE", "/v1/vgpu-devices", "GET, POST"),
    ("GET", "/v1/vgpu-devices/00000000:41:00.4", "DELETE"),
    ("POST", "/v1/metrics", "GET"),
])
def test_other_methods_are_405_naming_the_allowed_ones(tmp_path, method, path, allowed):
    with fake_host(MDEV, tmp_path) as world:
        status, response, answer = world.call(method, path)
    if method == "GET":  # an unknown path for GET, as before
        assert status == 404
        return
    assert (status, response.getheader("Allow")) == (405, allowed)
    assert answer == {"error": f"method {method} not allowed; use {allowed.replace(', ', ' or ')}"}


# -- the agent process --------------------------------------------------------------------------

def write_tokens(folder: Path, **tokens: str) -> None:
    for name, token in tokens.items():
        (folder / name).write_text(token + "\n", encoding="utf-8")
        (folder / name).chmod(0o600)


def test_agent_process_with_a_device_token_creates_vgpus_in_the_tree_it_is_pointed_at(tmp_path):
    from telemetry.tests.test_agent_cli import REPO, agent_command, clean_env

    root = tmp_path / "host"
    gpus = [FakeGpu(MDEV.sysfs_gpu, T4_MDEV)]
    build_mdev_host(root, gpus)
    write_tokens(tmp_path, read=READ, device=DEVICE)
    process = subprocess.Popen(
        agent_command("--listen", "127.0.0.1:0", "--token-file", str(tmp_path / "read"), "--backend", "sim",
                      "--device-token-file", str(tmp_path / "device"), "--sysfs-root", str(root)),
        cwd=REPO, env=clean_env(), stderr=subprocess.PIPE, text=True,
    )
    try:
        with KernelEmulator(root, gpus):
            line = process.stderr.readline()
            port = int(re.search(r"on http://127\.0\.0\.1:(\d+)", line).group(1))
            conn = http.client.HTTPConnection("127.0.0.1", port, timeout=10)
            conn.request("POST", "/v1/vgpu-devices", body=json.dumps({"gpu": MDEV.gpu, "type": "GRID T4-16Q"}),
                         headers={"Authorization": f"Bearer {DEVICE}", "Content-Type": "application/json"})
            response = conn.getresponse()
            device = json.loads(response.read())
            conn.close()
    finally:
        process.send_signal(signal.SIGTERM)
        process.wait(timeout=10)
        process.stderr.close()
    assert line.rstrip().endswith(f"; vGPU devices under {root}")
    assert response.status == 201
    assert (root / "sys/bus/mdev/devices" / device["id"] / "mdev_type").resolve().name == "nvidia-234"


@pytest.mark.parametrize(("tokens", "error"), [
    ({"read": READ, "device": READ}, "the device token must differ from the read and write tokens"),
    ({"read": READ, "write": WRITE, "device": WRITE}, "the device token must differ from the read and write tokens"),
])
def test_agent_refuses_to_start_with_a_device_token_equal_to_another(tmp_path, capsys, tokens, error):
    from telemetry.agent.__main__ import main

    write_tokens(tmp_path, **tokens)
    build_mdev_host(tmp_path / "host", [])
    argv = ["--listen", "127.0.0.1:0", "--backend", "sim", "--sysfs-root", str(tmp_path / "host")]
    for name in tokens:
        argv += ["--token-file" if name == "read" else f"--{name}-token-file", str(tmp_path / name)]
    assert main(argv) == 2
    assert capsys.readouterr().err == f"telemetry.agent: error: {error}\n"


def test_agent_refuses_a_sysfs_root_without_sys(tmp_path, capsys):
    from telemetry.agent.__main__ import main

    write_tokens(tmp_path, read=READ, device=DEVICE)
    code = main(["--listen", "127.0.0.1:0", "--backend", "sim", "--token-file", str(tmp_path / "read"),
                 "--device-token-file", str(tmp_path / "device"), "--sysfs-root", str(tmp_path / "nowhere")])
    assert code == 2
    assert capsys.readouterr().err == (f"telemetry.agent: error: --sysfs-root {tmp_path / 'nowhere'}: there is no "
                                       "sys/ folder in it\n")


def test_creates_sent_faster_than_the_kernel_updates_its_lists_are_answered_truthfully(tmp_path):
    # The emulated kernel applies a write a few ms late: a second create that picked a VF from
    # lists not yet updated is undone by it, and the agent must not answer 201 for that one.
    with fake_host(SRIOV, tmp_path) as world:
        answers = []
        for _ in range(4):
            conn = http.client.HTTPConnection(*world.server.server_address[:2], timeout=10)
            conn.request("POST", "/v1/vgpu-devices", body=json.dumps({"gpu": SRIOV.gpu, "type": "NVIDIA L40S-48Q"}),
                         headers={"Authorization": f"Bearer {DEVICE}"})
            response = conn.getresponse()
            answers.append((response.status, json.loads(response.read())))
            conn.close()
        world.emulator.settle()
        devices = world.devices()
    assert [status for status, _ in answers] == [201, 409, 409, 409]
    assert [device["id"] for device in devices] == [answers[0][1]["id"]]
    assert {answer["reason"] for _, answer in answers[1:]} == {"no_instance"}


def test_fake_sysfs_command_builds_a_host_and_runs_its_kernel_until_interrupted(tmp_path):
    from telemetry.tests.test_agent_cli import REPO, clean_env

    root = tmp_path / "host"
    process = subprocess.Popen(
        [sys.executable, "-m", "telemetry.agent.fake_sysfs", str(root), "--layout", "mdev",
         "--gpu", "RTX6000:0000:3b:00.0", "--gpu", "T4:0000:5e:00.0"],
        cwd=REPO, env=clean_env(), stdout=subprocess.PIPE, text=True,
    )
    try:
        line = process.stdout.readline()
        devices = HostSysfs(root)
        made = devices.create("5e:00.0", "GRID T4-16Q")
        offers = {(offer.gpu, offer.name): offer.available for offer in devices.offers()}
    finally:
        process.send_signal(signal.SIGINT)
        code = process.wait(timeout=10)
        process.stdout.close()
    assert line == f"fake sysfs (mdev) in {root}; emulating its kernel until interrupted\n"
    assert code == 0
    assert made.type_id == "nvidia-234"
    assert offers[("00000000:3B:00.0", "GRID RTX6000-12Q")] == 2
    assert offers[("00000000:5E:00.0", "GRID T4-1Q")] == 0


def test_fake_sysfs_command_refuses_an_unknown_model(tmp_path, capsys):
    from telemetry.agent.fake_sysfs import main

    with pytest.raises(SystemExit) as caught:
        main([str(tmp_path), "--gpu", "A100:0000:3b:00.0"])
    assert caught.value.code == 2
    assert "--gpu 'A100:0000:3b:00.0': expected MODEL:ADDRESS with MODEL one of T4, RTX6000" in capsys.readouterr().err
