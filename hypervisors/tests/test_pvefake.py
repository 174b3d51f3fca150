"""The Proxmox VE fake (hypervisors/testing/pvefake.py) over real HTTPS: what the Proxmox backend's
tests rely on it to do as a Proxmox VE 8 cluster would (sign-in, configuration writes, vGPU
instances made at start, tasks and their failures)."""

from __future__ import annotations

import time
from collections.abc import Iterator

import pytest
import requests

from hypervisors.testing import pvefake
from hypervisors.testing.pvefake import PveFake

GPU0, GPU1 = pvefake.GPU_BUS_IDS


@pytest.fixture
def pve() -> Iterator[PveFake]:
    with PveFake() as fake:
        yield fake


class Client:
    """A bare HTTP client of the fake: a ticket (or an API token) and the CA file. The
    environment's REQUESTS_CA_BUNDLE would override a session's `verify`, so it is not read."""

    def __init__(self, pve: PveFake, *, user: str = pvefake.USERNAME, password: str = pvefake.PASSWORD,
                 token: str | None = None, csrf: bool = True):
        self.pve = pve
        self.session = requests.Session()
        self.session.trust_env = False
        self.session.verify = str(pve.ca_pem)
        if token:
            self.session.headers["Authorization"] = f"PVEAPIToken={token}"
            return
        answer = self.session.post(f"{pve.base_url}/access/ticket", data={"username": user, "password": password})
        assert answer.status_code == 200, answer.reason
        data = answer.json()["data"]
        self.session.cookies.set("PVEAuthCookie", data["ticket"])
        if csrf:
            self.session.headers["CSRFPreventionToken"] = data["CSRFPreventionToken"]

    def call(self, method: str, path: str, /, **form: object) -> requests.Response:
        if method == "GET":
            return self.session.get(self.pve.base_url + path, params=form, timeout=10)
        return self.session.request(method, self.pve.base_url + path, data=form, timeout=10)

    def get(self, path: str, /, **params: object) -> object:
        answer = self.call("GET", path, **params)
        assert answer.status_code == 200, f"{answer.status_code} {answer.reason}"
        return answer.json()["data"]

    def task(self, method: str, path: str, /, *, node: str = pvefake.NODE, wait_s: float = 10.0,
             **form: object) -> dict:
        """Run a task to its end (as a client polls it) and return its final status."""
        answer = self.call(method, path, **form)
        assert answer.status_code == 200, f"{answer.status_code} {answer.reason}"
        upid = answer.json()["data"]
        assert upid.startswith(f"UPID:{node}:")
        deadline = time.monotonic() + wait_s
        while True:
            status = self.get(f"/nodes/{node}/tasks/{upid}/status")
            if status["status"] == "stopped" or time.monotonic() > deadline:
                return status
            time.sleep(0.05)


def test_sign_in_gives_a_ticket_whose_writes_need_the_csrf_token_and_which_ends_when_tickets_expire(pve):
    bad = requests.post(f"{pve.base_url}/access/ticket", data={"username": "root@pam", "password": "nope"},
                        verify=str(pve.ca_pem))
    assert (bad.status_code, bad.reason) == (401, "authentication failure")
    anonymous = requests.get(f"{pve.base_url}/nodes", verify=str(pve.ca_pem))
    assert (anonymous.status_code, anonymous.reason, anonymous.content) == (401, "No ticket", b"")

    reader = Client(pve, csrf=False)
    assert [n["node"] for n in reader.get("/nodes")] == ["pve1", "pve2"]
    assert reader.get("/version")["version"] == "8.2.4"
    refused = reader.call("POST", f"/nodes/pve1/qemu/{pvefake.VM_BUILD}/status/start")
    assert (refused.status_code, refused.reason) == (401, "Permission denied - invalid csrf token")
    assert pve.vm(pvefake.VM_BUILD)["status"] == "stopped"

    pve.expire_tickets()
    expired = reader.call("GET", "/nodes")
    assert (expired.status_code, expired.reason) == (401, "permission denied - invalid PVE ticket")
    assert [n["node"] for n in Client(pve).get("/nodes")] == ["pve1", "pve2"]


def test_an_api_token_needs_no_csrf_token_and_a_wrong_secret_is_refused(pve):
    wrong = Client(pve, token=f"{pvefake.TOKEN_ID}=not-the-secret").call("GET", "/nodes")
    assert (wrong.status_code, wrong.reason) == (401, "invalid token value!")
    client = Client(pve, token=f"{pvefake.TOKEN_ID}={pvefake.TOKEN_SECRET}")
    status = client.task("POST", f"/nodes/pve1/qemu/{pvefake.VM_BUILD}/status/start")
    assert (status["exitstatus"], status["tokenid"]) == ("OK", "dash")
    assert pve.vm(pvefake.VM_BUILD)["status"] == "running"


def test_the_certificate_is_trusted_only_through_the_fakes_ca(pve):
    for verify in (True, str(pve.untrusted_ca_pem)):
        with pytest.raises(requests.exceptions.SSLError, match="CERTIFICATE_VERIFY_FAILED"):
            requests.get(f"{pve.base_url}/version", verify=verify, timeout=10)
    assert requests.get(f"{pve.base_url}/version", verify=str(pve.ca_pem), timeout=10).status_code == 401
    assert pve.uri() == (f"proxmox://root@pam@127.0.0.1:{pve.port}/?node=pve1&cafile={pve.ca_pem}")
    assert pve.uri("pve2", token=True, insecure=True).startswith(f"proxmox://{pvefake.TOKEN_ID}@127.0.0.1:")


def test_a_config_write_checks_its_digest_and_schema_and_waits_for_the_next_start_on_a_running_vm(pve):
    client = Client(pve)
    path = f"/nodes/pve1/qemu/{pvefake.VM_BUILD}/config"
    config = client.get(path)
    assert (config["cores"], config["memory"], config["smbios1"]) == (
        2, "4096", f"uuid={pvefake.vm_uuid(pvefake.VM_BUILD)}")

    status = client.task("POST", path, cores=6, memory=8192, digest=config["digest"])
    assert (status["exitstatus"], status["type"]) == ("OK", "qmconfig")
    assert (client.get(path)["cores"], client.get(path)["memory"]) == (6, "8192")
    stale = client.call("POST", path, cores=4, digest=config["digest"])
    assert (stale.status_code, stale.reason) == (500, pvefake.MODIFIED)

    wrong = client.call("POST", path, cores=0, foo="bar")
    assert (wrong.status_code, wrong.reason) == (400, "Parameter verification failed.")
    assert wrong.json()["errors"] == {"cores": "value must have a minimum value of 1", "foo": pvefake.NOT_IN_SCHEMA}

    running = f"/nodes/pve1/qemu/{pvefake.VM_ANIM}/config"
    assert client.call("PUT", running, hostpci0=f"{GPU0},mdev={pvefake.TYPE_2Q}").json() == {"data": None}
    assert client.get(running, current=1)["hostpci0"] == f"{GPU0},mdev={pvefake.TYPE_4Q}"
    assert client.get(running)["hostpci0"] == f"{GPU0},mdev={pvefake.TYPE_2Q}"  # pending changes applied
    assert pve.vm(pvefake.VM_ANIM)["instances"][0]["type"] == pvefake.TYPE_4Q


def test_a_start_creates_the_vgpu_instance_and_a_full_or_other_typed_gpu_fails_the_task(pve):
    client = Client(pve)
    mdev = f"/nodes/pve2/hardware/pci/{GPU0}/mdev"
    assert {t["type"]: t["available"] for t in client.get(mdev)}[pvefake.TYPE_2Q] == 8
    status = client.task("POST", f"/nodes/pve2/qemu/{pvefake.VM_COMP}/status/start", node="pve2")
    assert status["exitstatus"] == "OK"
    assert pve.instances("pve2", GPU0) == [
        {"uuid": "00000000-0000-0000-0000-000000000201", "type": pvefake.TYPE_2Q, "vmid": pvefake.VM_COMP}]
    available = {t["type"]: t["available"] for t in client.get(mdev)}
    assert (available[pvefake.TYPE_2Q], available[pvefake.TYPE_1Q]) == (7, 0)

    # pve1's first GPU holds a 4Q vGPU: a 1Q one does not fit beside it.
    client.task("POST", f"/nodes/pve1/qemu/{pvefake.VM_BUILD}/config", hostpci0=f"{GPU0},mdev={pvefake.TYPE_1Q}")
    status = client.task("POST", f"/nodes/pve1/qemu/{pvefake.VM_BUILD}/status/start")
    assert status["exitstatus"] == f"pci device '{GPU0}' has no available instances of '{pvefake.TYPE_1Q}'"
    assert pve.vm(pvefake.VM_BUILD)["status"] == "stopped"
    log = client.get(f"/nodes/pve1/tasks/{status['upid']}/log")
    assert log[-1] == {"n": len(log), "t": f"TASK ERROR: {status['exitstatus']}"}

    again = client.task("POST", f"/nodes/pve2/qemu/{pvefake.VM_COMP}/status/start", node="pve2")
    assert again["exitstatus"] == f"VM {pvefake.VM_COMP} already running"


def test_a_shutdown_frees_the_vgpu_and_a_stubborn_guest_fails_it_after_the_timeout(pve):
    client = Client(pve)
    status = client.task("POST", f"/nodes/pve1/qemu/{pvefake.VM_LIGHT}/status/shutdown", timeout=5, forceStop=0)
    assert status["exitstatus"] == "OK"
    assert [i["vmid"] for i in pve.instances("pve1", GPU1)] == [pvefake.VM_MODEL]

    started = time.monotonic()
    status = client.task("POST", f"/nodes/pve1/qemu/{pvefake.VM_MODEL}/status/shutdown", timeout=1, forceStop=0)
    assert status["exitstatus"] == "VM quit/powerdown failed - got timeout"
    assert time.monotonic() - started >= 1.0
    assert client.get(f"/nodes/pve1/qemu/{pvefake.VM_MODEL}/status/current")["status"] == "running"
    assert client.task("POST", f"/nodes/pve1/qemu/{pvefake.VM_MODEL}/status/stop")["exitstatus"] == "OK"
    assert pve.instances("pve1", GPU1) == []


def test_injected_failures_and_hangs_leave_the_vm_as_it_was(pve):
    client = Client(pve)
    pve.fail_next("qmstart", "start failed: QEMU exited with code 1")
    status = client.task("POST", f"/nodes/pve2/qemu/{pvefake.VM_COMP}/status/start", node="pve2")
    assert status["exitstatus"] == "start failed: QEMU exited with code 1"
    assert pve.vm(pvefake.VM_COMP)["status"] == "stopped"
    assert pve.instances("pve2", GPU0) == []

    pve.hang_next("qmstop")
    status = client.task("POST", f"/nodes/pve1/qemu/{pvefake.VM_ANIM}/status/stop", wait_s=0.3)
    assert status["status"] == "running"
    assert "exitstatus" not in status
    assert pve.vm(pvefake.VM_ANIM)["status"] == "running"


def test_rights_a_limited_user_lacks_and_raw_pci_devices_reserved_to_root(pve):
    ops = Client(pve, user=pvefake.LIMITED_USER, password=pvefake.LIMITED_PASSWORD)
    assert "VM.PowerMgmt" not in ops.get("/access/permissions")["/vms"]
    refused = ops.call("POST", f"/nodes/pve1/qemu/{pvefake.VM_BUILD}/status/start")
    assert (refused.status_code, refused.reason) == (403, f"Permission check failed (/vms/{pvefake.VM_BUILD}, "
                                                          "VM.PowerMgmt)")
    path = f"/nodes/pve1/qemu/{pvefake.VM_BUILD}/config"
    raw = ops.call("POST", path, hostpci0=f"{GPU0},mdev={pvefake.TYPE_4Q}")
    assert (raw.status_code, raw.reason) == (500, "only root can set 'hostpci0' config for non-mapped devices")
    token = Client(pve, token=f"{pvefake.TOKEN_ID}={pvefake.TOKEN_SECRET}")
    assert token.call("POST", path, hostpci0=f"{GPU0},mdev={pvefake.TYPE_4Q}").status_code == 500
    assert ops.task("POST", path, hostpci0=f"mapping={pvefake.MAPPING},mdev={pvefake.TYPE_4Q}")["exitstatus"] == "OK"

    pve.deny(pvefake.USERNAME, "VM.Migrate")
    assert "VM.Migrate" not in Client(pve).get("/access/permissions", path="/vms/101")["/vms/101"]


def test_migration_refuses_local_devices_and_running_vms_and_moves_the_others(pve):
    client = Client(pve)
    status = client.task("POST", f"/nodes/pve2/qemu/{pvefake.VM_COMP}/migrate", node="pve2", target="pve1")
    assert status["exitstatus"] == "can't migrate VM which uses local devices: hostpci0"
    running = client.call("POST", f"/nodes/pve1/qemu/{pvefake.VM_ANIM}/migrate", target="pve2")
    assert (running.status_code, running.reason) == (500, "can't migrate running VM without --online")

    assert client.task("POST", f"/nodes/pve1/qemu/{pvefake.VM_BUILD}/migrate", target="pve2")["exitstatus"] == "OK"
    assert [vm["vmid"] for vm in client.get("/nodes/pve2/qemu")] == [pvefake.VM_BUILD, pvefake.VM_COMP]
    gone = client.call("GET", f"/nodes/pve1/qemu/{pvefake.VM_BUILD}/config")
    assert (gone.status_code, gone.reason) == (500, f"Configuration file 'nodes/pve1/qemu-server/"
                                                    f"{pvefake.VM_BUILD}.conf' does not exist")


def test_unknown_paths_and_nodes_are_answered_as_proxmox_does(pve):
    client = Client(pve)
    unknown = client.call("GET", "/nodes/pve1/foo")
    assert (unknown.status_code, unknown.reason) == (501, "Method 'GET /nodes/pve1/foo' not implemented")
    assert unknown.json() == {"data": None, "message": "Method 'GET /nodes/pve1/foo' not implemented\n"}
    node = client.call("GET", "/nodes/pve9/qemu")
    assert (node.status_code, node.reason) == (500, "hostname lookup 'pve9' failed - failed to get address info "
                                                    "for: pve9: Name or service not known")


def test_an_l40s_in_the_sriov_layout_lists_types_on_its_free_vfs_and_sets_a_vfs_type_while_its_vm_runs():
    with PveFake(inventory=pvefake.sriov_inventory()) as fake:
        client = Client(fake)
        node = pvefake.SRIOV_NODE
        pf, first, second, third = pvefake.L40S_PF, *pvefake.L40S_VFS[:3]
        rows = {row["id"]: row for row in client.get(f"/nodes/{node}/hardware/pci")}
        assert (rows[pf]["device_name"], "mdev" in rows[pf]) == ("AD102GL [L40S]", False)
        assert [rows[vf]["mdev"] for vf in pvefake.L40S_VFS] == [1] * 8
        assert client.get(f"/nodes/{node}/hardware/pci/{pf}/mdev") == []
        # ws-render-01's 12Q holds the first VF; the others offer only what fits beside it.
        assert client.get(f"/nodes/{node}/hardware/pci/{first}/mdev") == []
        assert client.get(f"/nodes/{node}/hardware/pci/{third}/mdev") == [
            {"type": pvefake.L40S_12Q, "name": "NVIDIA L40S-12Q", "description": "", "available": 1}]

        path = f"/nodes/{node}/qemu/{pvefake.VM_EDIT}"
        client.task("POST", f"{path}/config", hostpci0=f"{first},mdev={pvefake.L40S_12Q}", node=node)
        busy = client.task("POST", f"{path}/status/start", node=node)
        assert busy["exitstatus"] == f"PCI device '{first}' already in use by VMID '{pvefake.VM_RENDER}'"
        client.task("POST", f"{path}/config", hostpci0=f"{third},mdev={pvefake.L40S_24Q}", node=node)
        full = client.task("POST", f"{path}/status/start", node=node)
        assert full["exitstatus"] == f"vgpu type '1156' not available for '{third}'"
        client.task("POST", f"{path}/config", hostpci0=f"{third},mdev={pvefake.L40S_12Q}", node=node)
        assert client.task("POST", f"{path}/status/start", node=node)["exitstatus"] == "OK"
        assert fake.instances(node, third) == [{"uuid": "", "type": pvefake.L40S_12Q, "vmid": pvefake.VM_EDIT}]
        assert client.get(f"/nodes/{node}/hardware/pci/{third}/mdev") == []

        client.task("POST", f"/nodes/{node}/qemu/{pvefake.VM_RENDER}/status/stop", node=node)
        assert fake.instances(node, first) == []
        assert len(client.get(f"/nodes/{node}/hardware/pci/{first}/mdev")) == 1  # a 12Q still sits on the GPU
        assert fake.instances(node, second) == []  # ws-spare-01 names it but is stopped


def test_running_vms_report_cpu_and_memory_with_balloon_figures_only_from_a_guest_with_the_driver(pve):
    client = Client(pve)
    mib = 1024 * 1024
    brief = {row["vmid"]: row for row in client.get("/nodes/pve1/qemu")}
    assert "ballooninfo" not in brief[pvefake.VM_ANIM]  # only with full=1, as qemu-server's vmstatus
    rows = {row["vmid"]: row for row in client.get("/nodes/pve1/qemu", full=1)}
    anim = rows[pvefake.VM_ANIM]
    assert (anim["cpu"], anim["cpus"], anim["maxmem"], anim["mem"]) == (0.25, 4, 16384 * mib, 6144 * mib)
    info = anim["ballooninfo"]
    assert (info["actual"], info["max_mem"], info["total_mem"] - info["free_mem"]) == (
        16384 * mib, 16384 * mib, 6144 * mib)
    assert anim["freemem"] == info["free_mem"]
    assert anim["balloon"] == info["actual"]
    # ws-model-01 has the balloon device but no driver in its guest: no guest figures, and `mem`
    # is the QEMU process's resident memory, more than the guest's RAM.
    model = rows[pvefake.VM_MODEL]
    assert (model["cpu"], set(model["ballooninfo"])) == (0.9, {"actual", "max_mem"})
    assert model["mem"] > model["maxmem"]
    assert "freemem" not in model
    assert (rows[pvefake.VM_BUILD]["cpu"], rows[pvefake.VM_BUILD]["mem"]) == (0.0, 0)
    current = client.get(f"/nodes/pve1/qemu/{pvefake.VM_ANIM}/status/current")["ballooninfo"]
    assert current.keys() == info.keys()
    assert current["free_mem"] == info["free_mem"]

    client.call("PUT", f"/nodes/pve1/qemu/{pvefake.VM_LIGHT}/config", balloon=0)  # no balloon device at all
    client.task("POST", f"/nodes/pve1/qemu/{pvefake.VM_LIGHT}/status/stop")
    client.task("POST", f"/nodes/pve1/qemu/{pvefake.VM_LIGHT}/status/start")
    light = next(row for row in client.get("/nodes/pve1/qemu", full=1) if row["vmid"] == pvefake.VM_LIGHT)
    assert "ballooninfo" not in light
    assert light["mem"] > light["maxmem"]
