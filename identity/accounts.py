"""Keeping product users in step with the studio's directory, for every kind of directory.

`find_user` finds the product user a directory identity belongs to: the one with the same user
name, else the one with the same e-mail address (an account an admin made by hand before the
directory was connected, under another name). `apply_identity` writes what the directory said
(name, e-mail, role) onto that user, links or creates their artist record, and records the link in
`DirectoryAccount`. Someone the directory gives no role loses access: their user is deactivated,
which refuses their sessions and API tokens at the next request.
"""

from __future__ import annotations

import logging
from dataclasses import dataclass, field

from django.contrib.auth import get_user_model
from django.db import transaction
from django.utils import timezone

from fleet import audit
from fleet.models import Artist
from identity.models import DirectoryAccount
from identity.roles import Role

logger = logging.getLogger(__name__)


@dataclass(frozen=True)
class Identity:
    """What a directory says about one person."""

    source: str  # DirectorySource value
    subject: str  # DN or `sub` claim
    username: str
    email: str = ""
    first_name: str = ""
    last_name: str = ""
    groups: tuple[str, ...] = field(default_factory=tuple)
    role: Role | None = None


def find_user(username: str, email: str = ""):
    """The product user of this directory identity, or None: same user name (case-insensitive),
    else the only user with this e-mail address who is not linked to another directory entry."""
    User = get_user_model()
    user = User.objects.filter(username__iexact=username).order_by("pk").first()
    if user is not None or not email:
        return user
    matches = list(User.objects.filter(email__iexact=email, directory_account__isnull=True).order_by("pk")[:2])
    return matches[0] if len(matches) == 1 else None


def apply_identity(user, identity: Identity, *, signed_in: bool = False, reason: str = "") -> DirectoryAccount:
    """Write `identity` onto the saved `user` and return its DirectoryAccount.

    With a role the user is active, staff exactly when an admin, and has an artist record (linked
    if they had one, else created under their name). Without one the user is deactivated and
    `reason` kept, so the admin site says why. Only fields that changed are written. A local
    account linked for the first time loses its local password, unless it is a superuser's.
    """
    with transaction.atomic():
        changed = []
        wanted = {"is_active": identity.role is not None, "is_staff": identity.role == Role.ADMIN}
        if identity.email:
            wanted["email"] = identity.email
        if identity.first_name or identity.last_name:
            wanted.update(first_name=identity.first_name[:150], last_name=identity.last_name[:150])
        for name, value in wanted.items():
            if getattr(user, name) != value:
                setattr(user, name, value)
                changed.append(name)
        before = DirectoryAccount.objects.filter(user=user).values("role", "groups").first()
        if before is None and user.has_usable_password() and not user.is_superuser:
            # A local account the directory takes over: its old password must not stay a second
            # way in that the directory cannot close. Superusers (the break-glass admin) keep it.
            user.set_unusable_password()
            changed.append("password")
        if changed:
            user.save(update_fields=changed)
        if identity.role is not None:
            _keep_artist(user)
        now = timezone.now()
        account, _ = DirectoryAccount.objects.update_or_create(user=user, defaults={
            "source": identity.source, "subject": identity.subject[:500], "groups": list(identity.groups),
            "role": identity.role or "", "last_synced_at": now,
            "refused_reason": "" if identity.role is not None else reason[:300],
        })
        if signed_in:
            DirectoryAccount.objects.filter(pk=account.pk).update(last_sign_in_at=now)
        _record_access(user, account, before, reason)
    if identity.role is None and "is_active" in changed:
        logger.warning("%s lost access to the dashboard: %s", user.get_username(), reason or "no role in the directory")
    return account


def _record_access(user, account: DirectoryAccount, before: dict | None, reason: str) -> None:
    """An audit event when the directory grants, changes or ends someone's access (not for a
    sign-in that changes nothing): "directory_account.grant", ".role" or ".refuse"."""
    after = {"role": account.role, "groups": account.groups}
    if before is not None and before["role"] == after["role"]:
        return
    if not account.role:
        action = "directory_account.refuse"
    else:
        action = "directory_account.grant" if before is None or not before["role"] else "directory_account.role"
    audit.record(action, account, before=before, after=after, object_type="directory_account",
                 object_repr=user.get_username(),
                 comment=reason or f"{account.get_source_display()}: {account.role or 'no role'}")


def _keep_artist(user) -> Artist:
    """The user's artist record, its name kept to the directory's; created when there is none."""
    name = user.get_full_name() or user.get_username()
    artist = Artist.objects.filter(user=user).first()
    if artist is None:
        return Artist.objects.create(user=user, name=name[:120])
    if artist.name != name[:120]:
        artist.name = name[:120]
        artist.save(update_fields=["name"])
    return artist
