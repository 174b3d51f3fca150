"""`manage.py backfill_demo`: give the demo fleet a history, so its heatmaps are not empty."""

from pathlib import Path

from django.core.management.base import BaseCommand, CommandError

from telemetry import history
from telemetry.demo import DEFAULT_DIR, read_manifest
from telemetry.models import Agent


class Command(BaseCommand):
    help = (
        "Store what the demo's simulated agents would have reported over the past days (every 30 minutes for "
        "--days, every 5 minutes for the last --recent-days) through the normal ingest, and what the hypervisor "
        "links would have read of the VMs' guests (CPU and memory) at the same instants, then build the rollups. "
        "Run after demo_agents. Does nothing when that history is already there (use --force to redo)."
    )

    def add_arguments(self, parser):
        parser.add_argument("--days", type=float, default=history.DEFAULT_TIERS[0][0])
        parser.add_argument("--recent-days", type=float, default=history.DEFAULT_TIERS[1][0])
        parser.add_argument("--dir", default=str(DEFAULT_DIR), help="folder of demo_agents' manifest")
        parser.add_argument("--force", action="store_true")

    def handle(self, *args, **options):
        if options["days"] < 0 or options["recent_days"] < 0 or options["days"] > 60 or options["recent_days"] > 60:
            raise CommandError("--days and --recent-days must be between 0 and 60")
        names = [agent.name for agent in read_manifest(Path(options["dir"]))]
        if not names:
            raise CommandError(f"no demo agents in {options['dir']}: run `manage.py demo_agents` first")
        agents = list(Agent.objects.filter(name__in=names).select_related("host"))
        tiers = ((options["days"], history.DEFAULT_TIERS[0][1]), (options["recent_days"], history.DEFAULT_TIERS[1][1]))
        result = history.backfill_history(agents, tiers=tiers, force=options["force"])
        if result.skipped:
            self.stdout.write("Demo history already present; nothing to do (--force redoes it).")
            return
        self.stdout.write(
            f"Back-filled {result.reports} readings of {result.agents} demo agents: {result.gpu_samples} GPU and "
            f"{result.vgpu_samples} vGPU samples, {result.guest_samples} guest samples (CPU and memory), "
            f"{result.rollups} rollups in {result.seconds:.1f} s."
        )
