"""Reaching a hypervisor's HTTPS API before signing in: the TLS context a URI asks for, and a
probe that says, in words, whether DNS, the network or TLS is what fails. Shared by the backends
that speak HTTPS (vSphere, Proxmox VE), so an admin reads the same sentences for the same fault."""

from __future__ import annotations

import socket
import ssl
from dataclasses import dataclass
from urllib.parse import SplitResult, parse_qsl, urlsplit

from django.conf import settings

from hypervisors.backends.base import HypervisorError, Unreachable
from hypervisors.backends.credentials import shown

#: How long connecting (TCP and TLS) may take.
CONNECT_TIMEOUT_S = 15.0


@dataclass(frozen=True)
class HttpsUri:
    """What the backends that speak HTTPS read alike from their URI: its parts, its query, the port
    (the default where none is given) and how TLS is checked (`?insecure=1`, `?cafile=PATH`, else
    HYPERVISOR_CA_FILE, else the system's CAs)."""

    parts: SplitResult
    query: dict[str, str]
    port: int
    insecure: bool
    cafile: str


def split_uri(uri: str, *, scheme: str, default_port: int, kind: str, usage: str) -> HttpsUri:
    """`uri` read as `scheme://...`; HypervisorError naming `kind` ("vSphere") and how it is
    written (`usage`) when it is not one, or its port is not a number."""
    parts = urlsplit(uri)
    if parts.scheme.lower() != scheme or not parts.hostname:
        raise HypervisorError(f"{shown(uri)} is not a {kind} URI: use {usage}.")
    query = dict(parse_qsl(parts.query, keep_blank_values=True))
    try:
        port = parts.port or default_port
    except ValueError:
        raise HypervisorError(f"{shown(uri)} has a port that is not a number.") from None
    return HttpsUri(parts=parts, query=query, port=port,
                    insecure=query.get("insecure", "").lower() in ("1", "true", "yes"),
                    cafile=query.get("cafile", "") or settings.HYPERVISOR_CA_FILE)


def ssl_context(where: str, *, insecure: bool, cafile: str) -> ssl.SSLContext:
    """Certificate checking against the system's CAs, or `cafile`'s; none at all for a lab (`insecure`)."""
    if insecure:
        context = ssl.create_default_context()
        context.check_hostname = False
        context.verify_mode = ssl.CERT_NONE
        return context
    try:
        return ssl.create_default_context(cafile=cafile or None)
    except (OSError, ssl.SSLError) as exc:
        raise Unreachable(f"The CA file {cafile} for {where} cannot be used: "
                          f"{getattr(exc, 'strerror', None) or exc}.") from None


def probe(server: str, port: int, context: ssl.SSLContext, *, service: str, default_port: int) -> None:
    """Reach `server:port` and finish a TLS handshake within CONNECT_TIMEOUT_S; Unreachable saying
    which of DNS, the network or TLS failed. `service` names what should answer there ("vCenter")."""
    where = f"{server}:{port}"
    try:
        with socket.create_connection((server, port), timeout=CONNECT_TIMEOUT_S) as raw, \
                context.wrap_socket(raw, server_hostname=server):
            return
    except socket.gaierror:
        raise Unreachable(f"Could not find {server}: the name does not resolve (DNS). Check the host name "
                          f"in the hypervisor URI, or use {service}'s IP address.") from None
    except ssl.SSLCertVerificationError as exc:
        raise Unreachable(
            f"The TLS certificate of {where} is not trusted ({exc.verify_message}). Give the CA that signed "
            "it (cafile=/path/ca.pem in the URI, or HYPERVISOR_CA_FILE), or add insecure=1 to the URI for a lab "
            "without certificate checking.") from None
    except ssl.SSLError as exc:
        raise Unreachable(f"TLS with {where} failed ({exc.reason or exc}): is this port {service}'s HTTPS "
                          f"port ({default_port})?") from None
    except ConnectionRefusedError:
        raise Unreachable(f"{where} refused the connection: nothing listens on port {port} there. "
                          f"Check the address and the port of {service} ({default_port} by default).") from None
    except TimeoutError:
        raise Unreachable(f"{where} did not answer within {CONNECT_TIMEOUT_S:g} s (a firewall, or the "
                          "wrong address).") from None
    except OSError as exc:
        raise Unreachable(f"Could not reach {where}: {exc.strerror or exc}.") from None
