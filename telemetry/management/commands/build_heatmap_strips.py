"""`manage.py build_heatmap_strips`: write the heatmap strips of 5-minute rollups written before
strips existed (after upgrading to telemetry migration 0010), so the GPU x time heatmap reads
strips over those days too."""

from datetime import UTC, timedelta

from django.core.management.base import BaseCommand, CommandError
from django.utils import timezone

from telemetry import strips


class Command(BaseCommand):
    help = (
        "Write the heatmap strips (telemetry.strips) of the 5-minute GPU rollups of the last --days UTC days "
        "from the rollups, a day at a time, and extend the strips' coverage over them. Safe while rollups are "
        "being built; running it again rewrites the same strips."
    )

    def add_arguments(self, parser):
        parser.add_argument("--days", type=int, default=2,
                            help="UTC days back from today, today included (default 2: the page's 24 h)")

    def handle(self, *args, **options):
        days = options["days"]
        if not 1 <= days <= 400:
            raise CommandError("--days must be between 1 and 400")
        today = timezone.now().astimezone(UTC).date()
        written = strips.rebuild_days(today - timedelta(days=days - 1), today)
        since = strips.covered_since()
        self.stdout.write(f"Wrote {written:,} strips of {days} days; the heatmap reads strips for ranges from "
                          f"{since.isoformat() if since else 'nowhere yet'} on.")
