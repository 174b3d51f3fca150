"""A host's hypervisor link is checked when typed: the admin learns at once that a URI or a
secret reference cannot work, instead of when the first approval tries to use it."""

import pytest

from fleet.hypervisor_link import InvalidLink, check_secret_ref, check_uri, is_simulated


@pytest.mark.parametrize("uri", [
    "qemu+ssh://root@node-01/system", "qemu+tls://node-01.studio.lan/system", "qemu:///system",
    "test+unix:///default?socket=/tmp/x/libvirt-sock", "test:///default", "sim://node-01", "",
])
def test_libvirt_and_simulated_uris_are_accepted(uri):
    assert check_uri(f"  {uri} ") == uri


@pytest.mark.parametrize(("uri", "says"), [
    ("vmware://vc/", "Unknown hypervisor URI scheme"),
    ("node-01", "Unknown hypervisor URI scheme"),
    ("qemu+ssh:///system", "names its host"),
    ("sim://", "named after the host"),
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


def test_sim_uris_are_told_apart():
    assert is_simulated("sim://node-01")
    assert not is_simulated("qemu:///system")
