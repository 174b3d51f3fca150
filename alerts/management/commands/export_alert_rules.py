"""Write the dashboard's alert rules, with their current thresholds, as a Prometheus
alerting-rules file (alerts.prometheus)."""

from pathlib import Path

import yaml
from django.conf import settings
from django.core.management.base import BaseCommand, CommandError

from alerts.evaluate import ensure_rules
from alerts.prometheus import NOT_EXPORTED, rules_file


class Command(BaseCommand):
    help = "Write the alert rules as a Prometheus alerting-rules file (check it with `promtool check rules PATH`)."

    def add_arguments(self, parser):
        parser.add_argument("path", help="File to write, e.g. /etc/prometheus/rules/vgpu-fleet.yml; - for stdout")

    def handle(self, *args, path, **options):
        rows = [(row.kind, row.enabled, row.severity, row.effective_params) for row in ensure_rules().values()]
        content = rules_file(sorted(rows), settings.TELEMETRY_POLL_INTERVAL_S)
        header = ["# Written by `manage.py export_alert_rules` from the vGPU fleet dashboard's alert rules.",
                  "# Series come from the dashboard's /metrics; scrape it with a staff API token or METRICS_TOKEN.",
                  "# Judged by the dashboard only (not here):"]
        header += [f"#   {slug}: {why}" for slug, why in NOT_EXPORTED.items()]
        text = "\n".join(header) + "\n" + yaml.safe_dump(content, sort_keys=False, allow_unicode=True, width=200)
        if path == "-":
            self.stdout.write(text)
            return
        target = Path(path)
        if not target.parent.is_dir():
            raise CommandError(f"{target.parent} is not a folder: nothing was written.")
        target.write_text(text, encoding="utf-8")
        count = len(content["groups"][0]["rules"])
        self.stdout.write(f"Wrote {count} alerting rules to {target}.")
