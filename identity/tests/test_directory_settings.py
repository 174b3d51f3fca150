"""Directory settings from the environment (config/directory.py): a studio's typo fails start-up
with a message naming the variable, and a machine without python-ldap says what to install."""

from __future__ import annotations

import re
import subprocess
import sys
from pathlib import Path

import pytest
from django.core.exceptions import ImproperlyConfigured

from config.directory import ldap_settings, server_label, split_dns

ROOT = Path(__file__).resolve().parents[2]
GOOD = {
    "AUTH_LDAP_SERVER_URI": "ldap://dc1.studio.example",
    "AUTH_LDAP_USER_SEARCH_BASE": "ou=people,dc=studio,dc=example",
    "AUTH_LDAP_GROUP_SEARCH_BASE": "ou=groups,dc=studio,dc=example",
    "AUTH_LDAP_ADMIN_GROUP": "cn=fleet-admins,ou=groups,dc=studio,dc=example",
}


@pytest.fixture
def env(monkeypatch):
    ldap = pytest.importorskip("ldap", reason="python-ldap is not installed (make install-ldap)")
    for name, value in GOOD.items():
        monkeypatch.setenv(name, value)

    def set_env(**values):
        for name, value in values.items():
            monkeypatch.setenv(name, value)
        return ldap_settings()

    set_env.ldap = ldap
    return set_env


def test_off_unless_a_server_is_set(monkeypatch):
    monkeypatch.delenv("AUTH_LDAP_SERVER_URI", raising=False)
    assert ldap_settings() == {}


def test_active_directory_settings(env):
    found = env(AUTH_LDAP_USER_FILTER="(sAMAccountName=%(user)s)", AUTH_LDAP_GROUP_TYPE="activeDirectory",
                AUTH_LDAP_ARTIST_GROUP="cn=Lighting,ou=groups,dc=studio,dc=example;"
                                       " cn=Modeling, ou=groups,dc=studio,dc=example",
                AUTH_LDAP_START_TLS="true", AUTH_LDAP_RECHECK_S="30")
    assert found["AUTH_LDAP_USER_SEARCH"].filterstr == "(sAMAccountName=%(user)s)"
    assert type(found["AUTH_LDAP_GROUP_TYPE"]).__name__ == "NestedActiveDirectoryGroupType"
    assert found["AUTH_LDAP_GROUP_SEARCH"].filterstr == "(objectClass=group)"
    assert found["AUTH_LDAP_ARTIST_GROUPS"] == ["cn=Lighting,ou=groups,dc=studio,dc=example",
                                                "cn=Modeling, ou=groups,dc=studio,dc=example"]
    assert found["AUTH_LDAP_START_TLS"] is True
    assert found["AUTH_LDAP_RECHECK_S"] == 30
    ldap = env.ldap
    assert found["AUTH_LDAP_CONNECTION_OPTIONS"][ldap.OPT_X_TLS_REQUIRE_CERT] == ldap.OPT_X_TLS_DEMAND
    assert found["AUTH_LDAP_SERVER_LABEL"] == "dc1.studio.example"


def test_the_bind_password_may_come_from_a_file(env, tmp_path):
    secret = tmp_path / "bind"
    secret.write_text("s3cret\n")
    found = env(AUTH_LDAP_BIND_DN="cn=reader,dc=studio,dc=example", AUTH_LDAP_BIND_PASSWORD_FILE=str(secret))
    assert found["AUTH_LDAP_BIND_PASSWORD"] == "s3cret"


@pytest.mark.parametrize(("values", "message"), [
    ({"AUTH_LDAP_SERVER_URI": "dc1.studio.example"}, "must be an ldap://, ldaps:// or ldapi:// URI"),
    ({"AUTH_LDAP_USER_SEARCH_BASE": ""}, "AUTH_LDAP_USER_SEARCH_BASE must be set"),
    ({"AUTH_LDAP_GROUP_SEARCH_BASE": ""}, "AUTH_LDAP_GROUP_SEARCH_BASE must be set"),
    ({"AUTH_LDAP_USER_FILTER": "(uid=%s)"}, "must contain %(user)s"),
    ({"AUTH_LDAP_GROUP_TYPE": "groups"}, "AUTH_LDAP_GROUP_TYPE='groups': use one of groupOfNames"),
    ({"AUTH_LDAP_ADMIN_GROUP": ""}, "Set AUTH_LDAP_ADMIN_GROUP and/or AUTH_LDAP_ARTIST_GROUP"),
    ({"AUTH_LDAP_ADMIN_GROUP": "fleet-admins"}, "AUTH_LDAP_ADMIN_GROUP='fleet-admins' is not a distinguished name"),
    ({"AUTH_LDAP_BIND_PASSWORD": "x"}, "AUTH_LDAP_BIND_PASSWORD is set without AUTH_LDAP_BIND_DN"),
    ({"AUTH_LDAP_CA_FILE": "/nonexistent/ca.pem"}, "AUTH_LDAP_CA_FILE=/nonexistent/ca.pem: no such file"),
    ({"AUTH_LDAP_START_TLS": "sometimes"}, "AUTH_LDAP_START_TLS='sometimes' is not a boolean"),
    ({"AUTH_LDAP_RECHECK_S": "-1"}, "AUTH_LDAP_RECHECK_S='-1' must be 0 or more"),
])
def test_a_mistake_fails_start_up_with_the_variable_named(env, values, message):
    with pytest.raises(ImproperlyConfigured, match=re.escape(message)):
        env(**values)


def test_without_python_ldap_start_up_says_what_to_install(monkeypatch):
    monkeypatch.setitem(sys.modules, "ldap", None)  # import ldap raises ImportError
    for name, value in GOOD.items():
        monkeypatch.setenv(name, value)
    with pytest.raises(ImproperlyConfigured, match="run `make install-ldap`"):
        ldap_settings()


def test_manage_py_refuses_to_start_with_a_broken_directory_setting():
    """The whole start-up, as an operator sees it: manage.py stops with the message."""
    pytest.importorskip("ldap", reason="python-ldap is not installed (make install-ldap)")
    env = {**GOOD, "AUTH_LDAP_ADMIN_GROUP": "admins", "DEBUG": "true", "PATH": "/usr/bin:/bin"}
    result = subprocess.run([sys.executable, "manage.py", "check"], cwd=ROOT, env=env, capture_output=True,
                            text=True, timeout=120)
    assert result.returncode != 0
    assert "AUTH_LDAP_ADMIN_GROUP='admins' is not a distinguished name" in result.stderr


def test_labels_and_dn_lists():
    assert server_label("ldaps://dc1.studio.example:636 ldaps://dc2.studio.example") == "dc1.studio.example:636"
    assert server_label("ldap://user:pw@dc1/") == "dc1"
    assert split_dns("cn=a,dc=x; ;cn=b,dc=x") == ["cn=a,dc=x", "cn=b,dc=x"]
