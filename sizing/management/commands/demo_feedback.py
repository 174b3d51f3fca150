"""`manage.py demo_feedback`: two working weeks of ratings from the demo's artists (sizing.demo_feedback)."""

from django.core.management.base import BaseCommand

from sizing.demo_feedback import seed_feedback


class Command(BaseCommand):
    help = ("Give every demo VM with an artist two working weeks of the artist's ratings, as their workflow makes "
            "them feel (animators' viewports stutter, modelers are content). A second run adds nothing.")

    def handle(self, *args, **options):
        self.stdout.write(f"Demo feedback: {seed_feedback()} rating(s) written.")
