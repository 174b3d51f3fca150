"""Creating and removing a host's vGPU instances through its host agent (the DeviceManager where
libvirt's node-device API cannot do it).

The agent does it with its device action (`telemetry.agent.vgpu_devices`: the host's sysfs, in
the mdev layout or the SR-IOV layout of vGPU 17+), which it accepts only from holders of its
device token. That token is derived like the agent's read and write tokens (HMAC of
AGENT_TOKEN_KEY and the agent's salt, with its own label), so nothing new is stored and each
credential does one thing: `python manage.py agent_device_token <agent>` prints it for the
agent's --device-token-file, and rotating the agent's token revokes it too.

The agent's refusals become the backend errors (`hypervisors.backends.base`): 409 no_instance ->
NoInstanceAvailable, 409 busy -> DeviceBusy, no answer or a refused token -> Unreachable, and
anything else a HypervisorError carrying the agent's words.
"""

from __future__ import annotations

import hashlib
import hmac
import json
import urllib.error
import urllib.parse
import urllib.request
from dataclasses import dataclass

from django.conf import settings as django_settings

from fleet.pci import InvalidPciBusId, normalize_pci_bus_id
from hypervisors.backends.base import (
    DeviceBusy,
    DeviceKind,
    HypervisorError,
    NoInstanceAvailable,
    Unreachable,
    VgpuDevice,
    VgpuType,
)
from telemetry.models import Agent, AgentKind

TYPES_PATH = "/v1/vgpu-types"
DEVICES_PATH = "/v1/vgpu-devices"
# A create waits for the kernel (and the agent up to 2 s for the device to show): longer than the
# scrape timeout of an agent row (3 s by default).
MIN_TIMEOUT_S = 10.0


def agent_device_token(agent: Agent) -> str:
    """The token an agent needs in --device-token-file to create and remove vGPUs; derived from
    AGENT_TOKEN_KEY and the agent's salt (rotating the agent's token revokes it too)."""
    key = (django_settings.AGENT_TOKEN_KEY or django_settings.SECRET_KEY).encode()
    return hmac.new(key, f"agent-devices:{agent.token_salt}".encode(), hashlib.sha256).hexdigest()


def device_agent(host) -> Agent | None:
    """The enabled host agent (kind nvml, polled) of `host`, or None: the one whose device action
    the dashboard asks."""
    return (Agent.objects.filter(host_id=host.pk, enabled=True, kind=AgentKind.NVML).exclude(url="")
            .order_by("name").first())


def install_hint(name: str) -> str:
    return (f"restart agent {name} with --device-token-file holding the output of "
            f"`python manage.py agent_device_token {name}`")


@dataclass
class _Answer:
    status: int  # 0: no answer
    document: dict


class AgentDeviceManager:
    """A DeviceManager speaking to one host agent over HTTP (`telemetry.agent.server`)."""

    def __init__(self, url: str, token: str, *, timeout_s: float = MIN_TIMEOUT_S, name: str = ""):
        self.url = url.rstrip("/")
        self.token = token
        self.timeout_s = timeout_s
        self.name = name or self.url

    @classmethod
    def for_agent(cls, agent: Agent) -> AgentDeviceManager:
        return cls(agent.url, agent_device_token(agent), timeout_s=max(agent.timeout_s, MIN_TIMEOUT_S),
                   name=agent.name)

    @classmethod
    def for_host(cls, host) -> AgentDeviceManager:
        """The manager of `host`'s agent, or Unreachable when no enabled agent polls it."""
        agent = device_agent(host)
        if agent is None:
            raise Unreachable(f"No enabled host agent polls {host.name}: register its agent (kind nvml, with a "
                              "URL) to create and remove vGPUs through it.")
        return cls.for_agent(agent)

    # -- DeviceManager --------------------------------------------------------------------------

    def vgpu_types(self) -> list[VgpuType]:
        document = self._expect(200, self._call("GET", TYPES_PATH), "list vGPU types")
        return [VgpuType(gpu_bus_id=self._bus_id(item["gpu"]), type_id=str(item["id"]), name=item["name"],
                         available=int(item["available"])) for item in self._items(document, "types")]

    def vgpu_devices(self) -> list[VgpuDevice]:
        document = self._expect(200, self._call("GET", DEVICES_PATH), "list vGPU devices")
        return [self._device(item) for item in self._items(document, "devices")]

    def create_vgpu(self, gpu_bus_id: str, type_name: str, *, device_id: str = "") -> VgpuDevice:
        body = {"gpu": gpu_bus_id, "type": type_name, **({"id": device_id} if device_id else {})}
        answer = self._call("POST", DEVICES_PATH, body)
        return self._device(self._expect(201, answer, f"create a {type_name} on GPU {gpu_bus_id}"))

    def remove_vgpu(self, device: VgpuDevice) -> None:
        answer = self._call("DELETE", f"{DEVICES_PATH}/{urllib.parse.quote(device.id, safe=':')}")
        if answer.status == 404 and answer.document.get("reason") == "no_device":
            return  # gone already: what was asked
        self._expect(204, answer, f"remove vGPU {device.id}")

    # -- HTTP -----------------------------------------------------------------------------------

    def _call(self, method: str, path: str, body: dict | None = None) -> _Answer:
        data = json.dumps(body).encode() if body is not None else None
        headers = {"Authorization": f"Bearer {self.token}", "Accept": "application/json"}
        if data is not None:
            headers["Content-Type"] = "application/json"
        request = urllib.request.Request(f"{self.url}{path}", data=data, method=method, headers=headers)
        try:
            with urllib.request.urlopen(request, timeout=self.timeout_s) as response:  # noqa: S310 (http(s) only)
                raw = response.read()
                return _Answer(response.status, json.loads(raw) if raw else {})
        except urllib.error.HTTPError as exc:
            try:
                document = json.loads(exc.read() or b"{}")
            except ValueError:
                document = {}
            return _Answer(exc.code, document if isinstance(document, dict) else {})
        except (urllib.error.URLError, TimeoutError, OSError, ValueError) as exc:
            reason = getattr(exc, "reason", exc)
            return _Answer(0, {"error": str(reason)})

    def _expect(self, status: int, answer: _Answer, action: str) -> dict:
        """The answer's document when it has `status`; otherwise the backend error it means."""
        if answer.status == status:
            return answer.document
        said = answer.document.get("error") or f"HTTP {answer.status}"
        reason = answer.document.get("reason")
        if answer.status == 0:
            raise Unreachable(f"Agent {self.name} could not be reached to {action}: {said}.")
        if answer.status == 401:
            raise Unreachable(f"Agent {self.name} refused the device token ({said}): {install_hint(self.name)}.")
        if answer.status == 403:
            raise Unreachable(f"Agent {self.name} cannot {action}: {said}. To enable it, {install_hint(self.name)}.")
        if answer.status == 409 and reason == "no_instance":
            raise NoInstanceAvailable(f"Agent {self.name} cannot {action}: {said}.")
        if answer.status == 409 and reason == "busy":
            raise DeviceBusy(f"Agent {self.name} cannot {action}: {said}.")
        if reason is None and answer.status in (404, 405):
            raise HypervisorError(f"Agent {self.name} does not know the vGPU device paths (HTTP {answer.status}): "
                                  "upgrade it to a version that manages vGPU devices.")
        raise HypervisorError(f"Agent {self.name} could not {action} (HTTP {answer.status}): {said}.")

    def _items(self, document: dict, key: str) -> list[dict]:
        items = document.get(key)
        if not isinstance(items, list) or not all(isinstance(item, dict) for item in items):
            raise HypervisorError(f"Agent {self.name} answered without a list of {key}.")
        return items

    def _bus_id(self, text: str) -> str:
        try:
            return normalize_pci_bus_id(text)
        except (InvalidPciBusId, TypeError):
            raise HypervisorError(f"Agent {self.name} named a GPU by {text!r}, which is not a PCI address.") from None

    def _device(self, item: dict) -> VgpuDevice:
        kind = item.get("kind")
        if kind not in (DeviceKind.MDEV, DeviceKind.VF):
            raise HypervisorError(f"Agent {self.name} answered a device of kind {kind!r}.")
        device_id = str(item["id"]).lower() if kind == DeviceKind.MDEV else self._bus_id(item["id"])
        return VgpuDevice(kind=kind, id=device_id, gpu_bus_id=self._bus_id(item["gpu"]),
                          type_name=item.get("type") or "")
