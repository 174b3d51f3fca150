"""`manage.py hypervisor_sync [--host NAME] [--apply all]`: read linked hypervisors and show (or apply) their diff."""

from django.core.management.base import BaseCommand, CommandError

from fleet import audit
from fleet.choices import AuditSource
from fleet.models import Host
from hypervisors import services
from hypervisors.models import SyncTrigger


class Command(BaseCommand):
    help = ("Read the hypervisor of every linked host (or of --host NAME), compare its domains with the inventory "
            "and print the differences; the diff is kept for the host page and the API. --apply all also applies "
            "every appliable entry (new VMs, vCPUs, RAM, vGPU device ids; never deletes). Exits 1 when a "
            "hypervisor could not be read.")

    def add_arguments(self, parser):
        parser.add_argument("--host", action="append", default=[], metavar="NAME",
                            help="only this host (repeat for several)")
        parser.add_argument("--apply", choices=[services.APPLY_ALL, services.APPLY_NONE], default=services.APPLY_NONE,
                            help="apply every appliable entry of each diff (default: none, only report)")

    def handle(self, *args, **options):
        if options["host"]:
            hosts = list(Host.objects.filter(name__in=options["host"]).order_by("name"))
            missing = sorted(set(options["host"]) - {host.name for host in hosts})
            if missing:
                raise CommandError(f"No host named {', '.join(missing)}")
            unlinked = [host.name for host in hosts if not host.hypervisor_uri]
            if unlinked:
                raise CommandError(f"No hypervisor URI on {', '.join(unlinked)}: link the host first")
        else:
            hosts = list(services.linked_hosts())
            if not hosts:
                self.stdout.write("No host is linked to a hypervisor.")
                return
        failed = 0
        with audit.acting_as(None, AuditSource.SYSTEM, "hypervisor_sync"):
            for host in hosts:
                services.check_host(host)
                report, outcomes = services.sync_and_apply(host, options["apply"], trigger=SyncTrigger.COMMAND)
                if not report.ok:
                    failed += 1
                    self.stderr.write(f"{host.name} ({report.uri}): {report.error}")
                    continue
                self._print(host, report)
                for outcome in outcomes:
                    mark = "applied" if outcome["ok"] else "partly refused"
                    self.stdout.write(f"  {outcome['name']}: {mark}: {' '.join(outcome['messages'])}")
        if failed:
            raise CommandError(f"{failed} hypervisor(s) could not be read", returncode=1)

    def _print(self, host, report):
        differences = report.differences
        if not differences:
            self.stdout.write(f"{host.name} ({report.uri}): in step with the inventory "
                              f"({len(report.entries)} domain(s))")
            return
        self.stdout.write(f"{host.name} ({report.uri}): {len(differences)} difference(s)")
        for entry in differences:
            details = [f"{c['field']} {c['inventory']} -> {c['hypervisor']}" for c in entry["changes"]]
            details += entry["vgpu_notes"] + entry["notes"]
            details += [f"device id of vGPU {d['vgpu_id']}: {d['device_id']}" for d in entry["device_ids"]]
            self.stdout.write(f"  {entry['kind']:<9} {entry['name']} ({entry['uuid']}): {'; '.join(details)}")
