"""`manage.py demo_hypervisors`: a simulated hypervisor for every demo host (run after seed_demo)."""

from django.core.management.base import BaseCommand, CommandError

from fleet import audit
from fleet.choices import AuditSource
from fleet.models import Host
from hypervisors import sim_seed


class Command(BaseCommand):
    help = ("Link every host without a hypervisor URI (or the --host NAME given) to sim://<host name> and write "
            "its simulated hypervisor from the inventory (its VMs as running domains, their vGPUs as devices, its "
            "GPUs' vGPU types from the catalog) in HYPERVISOR_SIM_DIR. A simulated hypervisor that exists keeps "
            "its state unless --reseed. Hosts linked to a real hypervisor are left alone. For the demo: run "
            "after seed_demo.")

    def add_arguments(self, parser):
        parser.add_argument("--host", action="append", default=[], metavar="NAME", help="only this host (repeatable)")
        parser.add_argument("--reseed", action="store_true", help="rewrite existing simulated hypervisors")

    def handle(self, *args, **options):
        hosts = None
        if options["host"]:
            hosts = list(Host.objects.filter(name__in=options["host"]).order_by("name"))
            missing = sorted(set(options["host"]) - {host.name for host in hosts})
            if missing:
                raise CommandError(f"No host named {', '.join(missing)}")
        with audit.acting_as(None, AuditSource.SYSTEM, "demo_hypervisors"):
            for line in sim_seed.link_demo_hosts(hosts, reseed=options["reseed"]):
                self.stdout.write(line)
