"""The agent over real HTTP on loopback: protocol v1 shape, bearer auth, routing, keep-alive."""

from __future__ import annotations

import contextlib
import http.client
import json
import socket
from collections.abc import Iterator

import pynvml
import pytest

from telemetry.agent import __version__
from telemetry.agent.nvml_backend import NvmlBackend
from telemetry.agent.scenario import poc_scenario
from telemetry.agent.server import AgentServer
from telemetry.agent.sim_backend import SimBackend
from telemetry.tests import loopback
from telemetry.tests.fake_nvml import FakeGpu, FakeNvml, vgpu_host

TOKEN = "s3cr3t-agent-token"
AUTH = {"Authorization": f"Bearer {TOKEN}"}

GPU_FIELDS = {
    "uuid": str,
    "index": int,
    "name": str,
    "pci_bus_id": str,
    "fb_total_mib": int,
    "virtualization_mode": str,
    "util_gpu": int,
    "util_mem": int,
    "fb_used_mib": int,
    "enc_util": int,
    "dec_util": int,
    "temp_c": int,
    "power_w": float,
    "sm_clock_mhz": int,
    "clocks_event_reasons": int,
}
VGPU_FIELDS = {
    "vgpu_uuid": str,
    "vm_uuid": str,
    "vm_name": str,
    "type_name": str,
    "fb_used_mib": int,
    "util_gpu": int,
    "util_mem": int,
    "enc_util": int,
    "dec_util": int,
    "enc_sessions": int,
    "enc_fps": int,
    "enc_latency_us": int,
}


class _RecordingSocket:
    """Wraps an accepted socket to count sendall calls (one per response is the point)."""

    def __init__(self, sock: socket.socket):
        self.sock = sock
        self.sendall_calls = 0

    def sendall(self, data, *args):
        self.sendall_calls += 1
        return self.sock.sendall(data, *args)

    def __getattr__(self, name):
        return getattr(self.sock, name)


@contextlib.contextmanager
def serving(backend) -> Iterator[AgentServer]:
    """A real AgentServer on an ephemeral loopback port, recording the sockets it accepts."""
    server = AgentServer(("127.0.0.1", 0), backend, TOKEN, "test-host")
    accepted: list[_RecordingSocket] = []
    accept = server.get_request

    def recording_accept():
        sock, address = accept()
        accepted.append(_RecordingSocket(sock))
        return accepted[-1], address

    server.get_request = recording_accept
    server.accepted = accepted
    with loopback.serving(server):
        yield server


@pytest.fixture
def agent() -> Iterator[AgentServer]:
    """A real agent serving the proof-of-concept scenario on an ephemeral loopback port."""
    with serving(SimBackend(poc_scenario())) as server:
        yield server


def request(server: AgentServer, method: str, path: str, headers: dict | None = None):
    conn = http.client.HTTPConnection(*server.server_address[:2], timeout=5)
    try:
        conn.request(method, path, headers=headers or {})
        response = conn.getresponse()
        body = response.read()
        return response, (json.loads(body) if body else None)
    finally:
        conn.close()


def test_metrics_have_the_protocol_v1_shape_and_types(agent):
    response, payload = request(agent, "GET", "/v1/metrics", AUTH)

    assert response.status == 200
    assert response.getheader("Content-Type") == "application/json"
    assert payload["agent"] == {"version": __version__, "hostname": "test-host", "backend": "sim"}
    assert isinstance(payload["collected_at"], float)
    assert len(payload["gpus"]) == 3
    for index, gpu in enumerate(payload["gpus"]):
        assert gpu["index"] == index
        for field, kind in GPU_FIELDS.items():
            assert isinstance(gpu[field], kind), f"gpus[{index}].{field} = {gpu[field]!r}"
        assert gpu["scheduler"]["policy"] == "best_effort"
        assert gpu["virtualization_mode"] == "vgpu_host"
        for vgpu in gpu["vgpus"]:
            for field, kind in VGPU_FIELDS.items():
                assert isinstance(vgpu[field], kind), f"{vgpu['vm_name']}.{field} = {vgpu[field]!r}"
    assert [len(gpu["vgpus"]) for gpu in payload["gpus"]] == [2, 1, 1]


@pytest.mark.parametrize(
    ("headers", "error"),
    [
        ({}, "missing bearer token"),
        ({"Authorization": "Bearer wrong-token"}, "invalid bearer token"),
        ({"Authorization": f"Bearer {TOKEN}x"}, "invalid bearer token"),
        ({"Authorization": f"Basic {TOKEN}"}, "invalid bearer token"),
        ({"Authorization": "Bearer"}, "invalid bearer token"),
    ],
    ids=["missing", "wrong", "longer", "other-scheme", "empty"],
)
def test_metrics_refuse_requests_without_the_token(agent, headers, error):
    response, payload = request(agent, "GET", "/v1/metrics", headers)

    assert response.status == 401
    assert response.getheader("WWW-Authenticate").startswith("Bearer ")
    assert payload == {"error": error}


def test_bearer_scheme_is_case_insensitive(agent):
    response, _ = request(agent, "GET", "/v1/metrics", {"Authorization": f"bearer {TOKEN}"})
    assert response.status == 200


def test_healthz_needs_no_token(agent):
    response, payload = request(agent, "GET", "/healthz")
    assert response.status == 200
    assert payload == {"status": "ok"}


def test_unknown_path_is_404(agent):
    response, payload = request(agent, "GET", "/metrics", AUTH)
    assert response.status == 404
    assert "/v1/metrics" in payload["error"]


@pytest.mark.parametrize("method", ["POST", "PUT", "DELETE", "PATCH", "PROPFIND"])
def test_other_methods_are_405(agent, method):
    response, payload = request(agent, method, "/v1/metrics", AUTH)
    assert response.status == 405
    assert response.getheader("Allow") == "GET"
    assert payload == {"error": f"method {method} not allowed; use GET"}


def test_head_is_405_without_a_body(agent):
    response, payload = request(agent, "HEAD", "/healthz")
    assert response.status == 405
    assert payload is None


def test_keep_alive_scrapes_reuse_one_connection_with_one_write_per_response(agent):
    conn = http.client.HTTPConnection(*agent.server_address[:2], timeout=5)
    try:
        statuses = []
        for _ in range(50):
            conn.request("GET", "/v1/metrics", headers=AUTH)
            response = conn.getresponse()
            statuses.append(response.status)
            assert len(json.loads(response.read())["gpus"]) == 3
        assert statuses == [200] * 50
        assert len(agent.accepted) == 1, "each scrape opened a new connection"
        (accepted,) = agent.accepted
        # Headers and body in one sendall, and no Nagle: no ~40 ms delayed-ACK stall per scrape.
        assert accepted.sendall_calls == 50
        assert accepted.sock.getsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY) != 0
    finally:
        conn.close()


def test_collection_failure_is_a_500_and_the_agent_keeps_serving():
    class Broken(SimBackend):
        fail = True

        def collect(self, now=None):
            if Broken.fail:
                raise RuntimeError("boom")
            return super().collect(now)

    with serving(Broken(poc_scenario())) as server:
        conn = http.client.HTTPConnection(*server.server_address[:2], timeout=5)
        conn.request("GET", "/v1/metrics", headers=AUTH)
        failed = conn.getresponse()
        assert failed.status == 500
        assert json.loads(failed.read()) == {"error": "collection failed; see the agent's log"}
        Broken.fail = False
        conn.request("GET", "/v1/metrics", headers=AUTH)
        assert conn.getresponse().status == 200
        conn.close()


def test_unsupported_nvml_metrics_travel_as_json_null():
    nvml = FakeNvml([FakeGpu(), vgpu_host()])
    nvml.errors["nvmlDeviceGetPowerUsage"] = pynvml.NVML_ERROR_NOT_SUPPORTED
    nvml.errors["nvmlDeviceGetVgpuSchedulerState"] = pynvml.NVML_ERROR_NOT_SUPPORTED

    with serving(NvmlBackend(nvml)) as server:
        conn = http.client.HTTPConnection(*server.server_address[:2], timeout=5)
        conn.request("GET", "/v1/metrics", headers=AUTH)
        text = conn.getresponse().read().decode()
        conn.close()

    payload = json.loads(text)
    assert '"power_w":null' in text
    bare, host = payload["gpus"]
    assert payload["agent"]["backend"] == "nvml"
    assert bare["power_w"] is None
    assert host["power_w"] is None
    assert bare["util_gpu"] == 37
    assert host["scheduler"] is None
    assert [v["vgpu_uuid"] for v in host["vgpus"]] == ["vgpu-aaaa", "vgpu-bbbb"]
