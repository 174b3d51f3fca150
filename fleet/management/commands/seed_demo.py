"""`manage.py seed_demo`: the sizing guide's proof of concept, a synthetic studio and the demo logins."""

import os

from django.core.management.base import BaseCommand, CommandError

from fleet import demo


class Command(BaseCommand):
    help = (
        "Create (or complete; safe to run again) the demo fleet: the NVIDIA sizing guide's proof of concept "
        "(host poc-rtx6000) and a synthetic studio, every vGPU placed by the placement rules. Creates the "
        "superuser DEMO_ADMIN_USER (default admin) with DEMO_ADMIN_PASSWORD or a random password, and artist "
        "accounts with DEMO_ARTIST_PASSWORD or a random password; prints the logins."
    )

    def add_arguments(self, parser):
        parser.add_argument("--hosts", type=int, default=demo.DEFAULT_HOSTS,
                            help=f"synthetic hosts (default {demo.DEFAULT_HOSTS})")
        parser.add_argument("--gpu-models", default=",".join(demo.DEFAULT_GPU_MODELS),
                            help="comma-separated GPU model names or codes, taken in turn per host "
                                 f"(default {','.join(demo.DEFAULT_GPU_MODELS)})")
        parser.add_argument("--seed", type=int, default=demo.DEFAULT_SEED,
                            help=f"random seed; the same seed gives the same studio (default {demo.DEFAULT_SEED})")
        parser.add_argument("--no-synthetic", action="store_true", help="seed only the proof of concept")

    def handle(self, *args, **options):
        try:
            report = demo.seed_demo(
                hosts=options["hosts"],
                gpu_models=[name.strip() for name in options["gpu_models"].split(",") if name.strip()],
                seed=options["seed"],
                synthetic=not options["no_synthetic"],
                admin_username=os.environ.get("DEMO_ADMIN_USER") or "admin",
                admin_password=os.environ.get("DEMO_ADMIN_PASSWORD") or None,
                artist_password=os.environ.get("DEMO_ARTIST_PASSWORD") or None,
            )
        except demo.DemoError as exc:
            raise CommandError(str(exc)) from exc
        for line in report.lines():
            self.stdout.write(line)
