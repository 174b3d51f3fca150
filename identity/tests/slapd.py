"""A real OpenLDAP server (slapd) for the directory tests, on loopback, with a seeded studio.

The directory (dc=studio,dc=test):
- ou=people: alice (admin), bob and carol (artists), dave (in no group), erin (artist, e-mail
  matching a local account made before the directory was connected);
- ou=groups: cn=fleet-admins, cn=artists-lighting, cn=artists-modeling (groupOfNames);
- ou=services: cn=fleet-reader, the bind account the product searches with (read only).

`slapd` (pytest fixture, one server per test worker) starts it from a slapd.conf in a temporary
folder, with TLS from a CA made here, so StartTLS and ldaps:// are tested against the same
server; tests that change the directory put it back (`restore`). Without slapd (the Debian
package) or python-ldap the tests that need it are skipped with the reason, unless
REQUIRE_SERVICES is set (CI), which makes it a failure.
"""

from __future__ import annotations

import contextlib
import datetime
import os
import shutil
import socket
import subprocess
import time
from dataclasses import dataclass
from pathlib import Path

import pytest

SUFFIX = "dc=studio,dc=test"
ROOT_DN = f"cn=admin,{SUFFIX}"
ROOT_PASSWORD = "root-secret"
BIND_DN = f"cn=fleet-reader,ou=services,{SUFFIX}"
BIND_PASSWORD = "reader-secret"
PASSWORD = "directory-pass-1"
ADMINS = f"cn=fleet-admins,ou=groups,{SUFFIX}"
LIGHTING = f"cn=artists-lighting,ou=groups,{SUFFIX}"
MODELING = f"cn=artists-modeling,ou=groups,{SUFFIX}"
SLAPD = shutil.which("slapd") or "/usr/sbin/slapd"
SLAPADD = shutil.which("slapadd") or "/usr/sbin/slapadd"
SCHEMA_DIR = Path("/etc/ldap/schema")

PEOPLE = {
    "alice": ("Alice", "Admin", "alice@studio.test"),
    "bob": ("Bob", "Lighter", "bob@studio.test"),
    "carol": ("Carol", "Modeler", "carol@studio.test"),
    "dave": ("Dave", "Nobody", "dave@studio.test"),
    "erin": ("Erin", "Comper", "erin.comp@studio.test"),
}
GROUPS = {ADMINS: ["alice"], LIGHTING: ["bob", "erin"], MODELING: ["carol"]}


def person_dn(uid: str) -> str:
    return f"uid={uid},ou=people,{SUFFIX}"


def seed_ldif() -> str:
    entries = [
        f"dn: {SUFFIX}\nobjectClass: dcObject\nobjectClass: organization\no: Studio\ndc: studio",
        f"dn: ou=people,{SUFFIX}\nobjectClass: organizationalUnit\nou: people",
        f"dn: ou=groups,{SUFFIX}\nobjectClass: organizationalUnit\nou: groups",
        f"dn: ou=services,{SUFFIX}\nobjectClass: organizationalUnit\nou: services",
        f"dn: {BIND_DN}\nobjectClass: organizationalRole\nobjectClass: simpleSecurityObject\ncn: fleet-reader\n"
        f"userPassword: {BIND_PASSWORD}",
    ]
    for uid, (first, last, mail) in PEOPLE.items():
        entries.append(f"dn: {person_dn(uid)}\nobjectClass: inetOrgPerson\nuid: {uid}\ncn: {first} {last}\n"
                       f"givenName: {first}\nsn: {last}\nmail: {mail}\nuserPassword: {PASSWORD}")
    for group, members in GROUPS.items():
        cn = group.split(",")[0].split("=")[1]
        # groupOfNames needs a member: a placeholder keeps a group valid when a test empties it
        lines = "\n".join([f"member: cn=placeholder,{SUFFIX}"] + [f"member: {person_dn(uid)}" for uid in members])
        entries.append(f"dn: {group}\nobjectClass: groupOfNames\ncn: {cn}\n{lines}")
    return "\n\n".join(entries) + "\n"


def _make_tls(folder: Path) -> tuple[Path, Path, Path]:
    """A CA and a server certificate for 127.0.0.1 / localhost signed by it (PEM files)."""
    from cryptography import x509
    from cryptography.hazmat.primitives import hashes, serialization
    from cryptography.hazmat.primitives.asymmetric import rsa
    from cryptography.x509.oid import NameOID

    now = datetime.datetime.now(datetime.UTC)

    def key():
        return rsa.generate_private_key(public_exponent=65537, key_size=2048)

    ca_key, server_key = key(), key()
    ca_name = x509.Name([x509.NameAttribute(NameOID.COMMON_NAME, "Studio Test CA")])
    ca = (x509.CertificateBuilder().subject_name(ca_name).issuer_name(ca_name).public_key(ca_key.public_key())
          .serial_number(x509.random_serial_number()).not_valid_before(now - datetime.timedelta(days=1))
          .not_valid_after(now + datetime.timedelta(days=30))
          .add_extension(x509.BasicConstraints(ca=True, path_length=None), critical=True)
          .sign(ca_key, hashes.SHA256()))
    import ipaddress

    server = (x509.CertificateBuilder()
              .subject_name(x509.Name([x509.NameAttribute(NameOID.COMMON_NAME, "localhost")]))
              .issuer_name(ca_name).public_key(server_key.public_key()).serial_number(x509.random_serial_number())
              .not_valid_before(now - datetime.timedelta(days=1)).not_valid_after(now + datetime.timedelta(days=30))
              .add_extension(x509.SubjectAlternativeName([x509.DNSName("localhost"),
                                                          x509.IPAddress(ipaddress.ip_address("127.0.0.1"))]),
                             critical=False)
              .sign(ca_key, hashes.SHA256()))
    pem = serialization.Encoding.PEM
    paths = folder / "ca.pem", folder / "server.pem", folder / "server.key"
    paths[0].write_bytes(ca.public_bytes(pem))
    paths[1].write_bytes(server.public_bytes(pem))
    paths[2].write_bytes(server_key.private_bytes(pem, serialization.PrivateFormat.TraditionalOpenSSL,
                                                  serialization.NoEncryption()))
    return paths


def _free_port() -> int:
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        return sock.getsockname()[1]


@dataclass
class Slapd:
    uri: str  # ldap://127.0.0.1:PORT (StartTLS available)
    ldaps_uri: str
    ca_file: Path
    process: subprocess.Popen

    def connect(self):
        """A python-ldap connection bound as the directory's root (to change entries)."""
        import ldap

        connection = ldap.initialize(self.uri, bytes_mode=False)
        connection.simple_bind_s(ROOT_DN, ROOT_PASSWORD)
        return connection

    def remove_member(self, group: str, uid: str) -> None:
        import ldap

        connection = self.connect()
        connection.modify_s(group, [(ldap.MOD_DELETE, "member", [person_dn(uid).encode()])])
        connection.unbind_s()

    def add_member(self, group: str, uid: str) -> None:
        import ldap

        connection = self.connect()
        with contextlib.suppress(ldap.TYPE_OR_VALUE_EXISTS):
            connection.modify_s(group, [(ldap.MOD_ADD, "member", [person_dn(uid).encode()])])
        connection.unbind_s()

    def set_attribute(self, uid: str, name: str, value: str) -> None:
        import ldap

        connection = self.connect()
        connection.modify_s(person_dn(uid), [(ldap.MOD_REPLACE, name, [value.encode()])])
        connection.unbind_s()

    def restore(self) -> None:
        """Put every seeded membership and attribute back."""
        for group, members in GROUPS.items():
            for uid in members:
                self.add_member(group, uid)
        for uid, (_first, last, mail) in PEOPLE.items():
            self.set_attribute(uid, "mail", mail)
            self.set_attribute(uid, "sn", last)

    def stop(self) -> None:
        self.process.terminate()
        try:
            self.process.wait(timeout=10)
        except subprocess.TimeoutExpired:
            self.process.kill()

    def start(self) -> None:
        """Start it again after `stop` (same folder, port and data)."""
        self.process = subprocess.Popen(self.process.args, stdout=subprocess.DEVNULL, stderr=subprocess.PIPE)
        _wait_for(self.uri, self.process)


def _missing() -> str:
    if not Path(SLAPD).exists() or not Path(SLAPADD).exists():
        return "slapd is not installed (apt-get install slapd ldap-utils)"
    try:
        import django_auth_ldap  # noqa: F401
        import ldap  # noqa: F401
    except ImportError:
        return "python-ldap / django-auth-ldap are not installed (make install-ldap)"
    return ""


def _wait_for(uri: str, process: subprocess.Popen) -> None:
    import ldap

    deadline = time.monotonic() + 20
    while True:
        if process.poll() is not None:
            raise RuntimeError(f"slapd exited with {process.returncode}: {process.stderr.read().decode()[-2000:]}")
        try:
            connection = ldap.initialize(uri, bytes_mode=False)
            connection.simple_bind_s(BIND_DN, BIND_PASSWORD)
            connection.unbind_s()
            return
        except ldap.SERVER_DOWN:
            if time.monotonic() > deadline:
                raise RuntimeError("slapd did not answer within 20 s") from None
            time.sleep(0.05)


def start_slapd(folder: Path) -> Slapd:
    folder.mkdir(parents=True, exist_ok=True)
    data = folder / "data"
    data.mkdir(exist_ok=True)
    ca, cert, key = _make_tls(folder)
    schemas = "\n".join(f"include {SCHEMA_DIR / name}.schema" for name in ("core", "cosine", "inetorgperson", "nis"))
    module_path = next((p for p in ("/usr/lib/ldap", "/usr/lib/x86_64-linux-gnu/ldap") if Path(p).exists()),
                       "/usr/lib/ldap")
    (folder / "slapd.conf").write_text(f"""{schemas}
modulepath {module_path}
moduleload back_mdb
pidfile {folder / 'slapd.pid'}
TLSCACertificateFile {ca}
TLSCertificateFile {cert}
TLSCertificateKeyFile {key}
database mdb
maxsize 10485760
suffix "{SUFFIX}"
rootdn "{ROOT_DN}"
rootpw {ROOT_PASSWORD}
directory {data}
access to attrs=userPassword by anonymous auth by * none
access to * by dn.exact="{BIND_DN}" read by self read by users read by * none
""")
    (folder / "seed.ldif").write_text(seed_ldif())
    subprocess.run([SLAPADD, "-f", str(folder / "slapd.conf"), "-l", str(folder / "seed.ldif")], check=True,
                   capture_output=True)
    port, tls_port = _free_port(), _free_port()
    uri, ldaps_uri = f"ldap://127.0.0.1:{port}", f"ldaps://127.0.0.1:{tls_port}"
    process = subprocess.Popen([SLAPD, "-d", "0", "-f", str(folder / "slapd.conf"), "-h", f"{uri}/ {ldaps_uri}/"],
                               stdout=subprocess.DEVNULL, stderr=subprocess.PIPE)
    _wait_for(uri, process)
    return Slapd(uri=uri, ldaps_uri=ldaps_uri, ca_file=ca, process=process)


@pytest.fixture(scope="session")
def slapd(tmp_path_factory):
    missing = _missing()
    if missing:
        if os.environ.get("REQUIRE_SERVICES"):
            pytest.fail(missing)
        pytest.skip(missing)
    server = start_slapd(tmp_path_factory.mktemp("slapd"))
    yield server
    server.stop()


def ldap_env(server: Slapd, **overrides: str) -> dict[str, str]:
    """The environment variables a studio would set for this directory."""
    env = {
        "AUTH_LDAP_SERVER_URI": server.uri,
        "AUTH_LDAP_BIND_DN": BIND_DN,
        "AUTH_LDAP_BIND_PASSWORD": BIND_PASSWORD,
        "AUTH_LDAP_USER_SEARCH_BASE": f"ou=people,{SUFFIX}",
        "AUTH_LDAP_GROUP_SEARCH_BASE": f"ou=groups,{SUFFIX}",
        "AUTH_LDAP_ADMIN_GROUP": ADMINS,
        "AUTH_LDAP_ARTIST_GROUP": f"{LIGHTING};{MODELING}",
        "AUTH_LDAP_DISPLAY_NAME": "Studio directory",
    }
    env.update(overrides)
    return env


@pytest.fixture
def directory(slapd, settings, monkeypatch):
    """Directory sign-in switched on (settings as config.settings derives them from the
    environment) against the test slapd; the directory is restored afterwards."""
    from config.directory import LDAP_BACKEND, ldap_settings

    for name, value in ldap_env(slapd).items():
        monkeypatch.setenv(name, value)
    for name, value in ldap_settings().items():
        setattr(settings, name, value)
    settings.AUTH_LDAP_ENABLED = True
    backends = list(settings.AUTHENTICATION_BACKENDS)
    if LDAP_BACKEND not in backends:
        backends.insert(1, LDAP_BACKEND)
    settings.AUTHENTICATION_BACKENDS = backends
    from fleet.api_tokens import presented
    from identity.apps import connect_directory

    connect_directory()
    yield slapd
    presented.disconnect(dispatch_uid="identity_ldap_tokens")
    slapd.restore()
