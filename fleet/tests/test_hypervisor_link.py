"""A host's hypervisor link is checked when typed: the admin learns at once that a URI or a
secret reference cannot work, instead of when the first approval tries to use it."""

import pytest

from fleet.hypervisor_link import (
    InvalidLink,
    check_kind,
    check_secret_ref,
    check_uri,
    is_proxmox,
    is_simulated,
    is_vsphere,
)


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


@pytest.mark.parametrize(("uri", "hypervisor", "says"), [
    ("vsphere://svc@vcenter-01/", "kvm", "A vsphere:// link is for a VMware vSphere ESXi host"),
    ("proxmox://root@pam@pve-01:8006/", "esxi", "A proxmox:// link is for a Proxmox VE host"),
    ("qemu+ssh://root@pve-01/system", "proxmox", "runs Proxmox VE, which is linked through proxmox://"),
    ("qemu+ssh://root@esx-01/system", "esxi", "runs VMware vSphere ESXi, which is linked through vsphere://"),
])
def test_a_link_to_another_kind_of_hypervisor_than_the_host_runs_is_refused(uri, hypervisor, says):
    with pytest.raises(InvalidLink, match=says):
        check_kind(uri, hypervisor)


@pytest.mark.parametrize(("uri", "hypervisor"), [
    ("vsphere://svc@vcenter-01/", "esxi"), ("proxmox://root@pam@pve-01:8006/", "proxmox"),
    ("qemu+ssh://root@node-01/system", "kvm"), ("xen+ssh://root@xs-01/", "xenserver"), ("sim://node-01", "esxi"),
    ("", "proxmox"),
])
def test_a_link_of_the_hosts_own_hypervisor_is_accepted(uri, hypervisor):
    check_kind(uri, hypervisor)


@pytest.mark.django_db
def test_the_api_and_the_host_form_refuse_a_link_of_another_hypervisor_and_keep_the_host(admin_api):
    from fleet.forms import HostForm
    from fleet.tests.factories import HostFactory

    host = HostFactory(name="pve-01", hypervisor="proxmox")
    refused = admin_api.patch(f"/api/v1/hosts/{host.pk}/", {"hypervisor_uri": "vsphere://svc@vcenter-01/"},
                              format="json")
    assert refused.status_code == 400
    assert "A vsphere:// link is for a VMware vSphere ESXi host" in refused.json()["hypervisor_uri"][0]
    linked = admin_api.patch(f"/api/v1/hosts/{host.pk}/", {"hypervisor_uri": "proxmox://root@pam@pve-01:8006/"},
                             format="json")
    assert linked.status_code == 200, linked.content
    # Changing the host's hypervisor under its link is refused too, on the page as through the API.
    host.refresh_from_db()
    form = HostForm(data={"name": "pve-01", "hypervisor": "kvm", "cpu_model": "", "cpu_threads": host.cpu_threads,
                          "ram_gib": host.ram_gib, "vcpu_overcommit": 1, "ram_overcommit": 1}, instance=host)
    assert not form.is_valid()
    assert "A proxmox:// link is for a Proxmox VE host" in str(form.errors)
    assert admin_api.patch(f"/api/v1/hosts/{host.pk}/", {"hypervisor": "kvm"}, format="json").status_code == 400
    host.refresh_from_db()
    assert (host.hypervisor, host.hypervisor_uri) == ("proxmox", "proxmox://root@pam@pve-01:8006/")
