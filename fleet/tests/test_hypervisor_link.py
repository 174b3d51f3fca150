"""A host's hypervisor link is checked when typed: the admin learns at once that a URI or a
secret reference cannot work, instead of when the first approval tries to use it."""

import pytest

from fleet.hypervisor_link import InvalidLink, check_secret_ref, check_uri, is_proxmox, is_simulated, is_vsphere


@pytest.mark.parametrize("uri", [
    "qemu+ssh://root@node-01/system", "qemu+tls://node-01.studio.lan/system", "qemu:///system",
    "test+unix:///default?socket=/tmp/x/libvirt-sock", "test:///default", "sim://node-01", "",
    "vsphere://administrator@vsphere.local@vcenter-01:443/?datacenter=DC&host=esx-01",
    "vsphere://lab@127.0.0.1:8989/?insecure=1",
    "proxmox://root@pam@pve-01:8006/", "proxmox://root@pam!vgpu-dashboard@10.0.0.5/?node=pve-01",
])
def test_libvirt_vsphere_proxmox_and_simulated_uris_are_accepted(uri):
    assert check_uri(f"  {uri} ") == uri


@pytest.mark.parametrize(("uri", "says"), [
    ("vmware://vc/", "Unknown hypervisor URI scheme"),
    ("node-01", "Unknown hypervisor URI scheme"),
    ("qemu+ssh:///system", "names its host"),
    ("sim://", "named after the host"),
    ("vsphere://vcenter-01/?datacenter=DC", "names the user and vCenter"),
    ("proxmox://pve-01:8006/", "names the user with its realm"),
    ("proxmox://root@pve-01:8006/", "root@pam@pve-01"),
    ("qemu:///system\nx", "one line"),
])
def test_a_uri_that_cannot_work_is_refused_with_what_to_type(uri, says):
    with pytest.raises(InvalidLink, match=says):
        check_uri(uri)


def test_a_secret_is_named_never_given_as_a_path():
    assert check_secret_ref("node-01-ssh-key") == "node-01-ssh-key"
    for bad in ("../etc/shadow", "/root/.ssh/id_rsa", "..", "a b"):
        with pytest.raises(InvalidLink, match="name of a file in the secrets folder"):
            check_secret_ref(bad)


def test_sim_vsphere_and_proxmox_uris_are_told_apart():
    assert is_simulated("sim://node-01")
    assert not is_simulated("qemu:///system")
    assert is_vsphere("VSphere://root@esx-01/")
    assert not is_vsphere("sim://node-01")
    assert is_proxmox("proxmox://root@pam@pve-01:8006/")
    assert not is_proxmox("vsphere://root@esx-01/")


@pytest.mark.django_db
def test_scripts_link_a_host_through_the_api_and_a_bad_link_is_refused_naming_the_field(admin_api):
    from fleet.tests.factories import HostFactory

    host = HostFactory(name="node-07")
    linked = admin_api.patch(f"/api/v1/hosts/{host.pk}/", {"hypervisor_uri": "qemu+ssh://root@node-07/system",
                                                           "hypervisor_secret_ref": "node-07-key"}, format="json")
    assert linked.status_code == 200, linked.content
    assert (linked.json()["hypervisor_uri"], linked.json()["hypervisor_secret_ref"]) == (
        "qemu+ssh://root@node-07/system", "node-07-key")
    refused = admin_api.patch(f"/api/v1/hosts/{host.pk}/", {"hypervisor_uri": "vmware://vc/",
                                                            "hypervisor_secret_ref": "../../etc/shadow"}, format="json")
    assert refused.status_code == 400
    assert set(refused.json()) >= {"hypervisor_uri", "hypervisor_secret_ref"}
    host.refresh_from_db()
    assert host.hypervisor_uri == "qemu+ssh://root@node-07/system"  # the good link is kept
