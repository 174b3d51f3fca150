"""Set up the demo's alerting: every rule with its defaults, an in-app channel for the admins,
and licence pools sized to the demo fleet (a little headroom for vWS, none for vPC), so the
first minutes of `make run` show alerts, notifications and the licence page at work. Leaves
alone what an admin has already set up."""

from django.core.management.base import BaseCommand
from django.db.models import Count

from alerts.evaluate import ensure_rules
from alerts.models import EDITION_OF_SERIES, LicencePool
from fleet.models import Vgpu
from notify import services as notify_services
from notify.models import NotificationChannel

HEADROOM = {"vws": 2, "vpc": 0}


class Command(BaseCommand):
    help = "Alert rules, an in-app notification channel and licence pools for the demo fleet."

    def handle(self, *args, **options):
        ensure_rules()
        if not NotificationChannel.objects.exists():
            notify_services.save_channel(NotificationChannel(), name="Admins in the app", kind="in_app",
                                         min_severity="warning")
            self.stdout.write("Created the in-app channel \"Admins in the app\" (warning and above).")
        if not LicencePool.objects.exists():
            counts = Vgpu.objects.values("profile__series").annotate(n=Count("id"))
            by_edition: dict[str, int] = {}
            for row in counts:
                edition = EDITION_OF_SERIES.get(row["profile__series"])
                if edition:
                    by_edition[str(edition)] = by_edition.get(str(edition), 0) + row["n"]
            for edition, used in sorted(by_edition.items()):
                owned = used + HEADROOM.get(edition, 2)
                LicencePool.objects.create(edition=edition, owned=owned, note="demo pool")
                self.stdout.write(f"Licence pool {edition}: {owned} owned for {used} vGPUs.")
