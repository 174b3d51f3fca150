"""`manage.py read_guest_stats`: read the guest CPU and memory of every linked host's running VMs once."""

from django.core.management.base import BaseCommand

from hypervisors import guest_stats


class Command(BaseCommand):
    help = ("Read the guest CPU and memory of every linked host's running VMs through its hypervisor and store one "
            "sample a VM (as beat's read_guest_stats does every HYPERVISOR_GUEST_INTERVAL_S). A VM's first reading "
            "has no CPU figure: shares are taken between two readings. Exits 1 when a hypervisor could not be read.")

    def handle(self, *args, **options):
        result = guest_stats.read_all()
        if not result.hosts:
            self.stdout.write("No host is linked to a hypervisor.")
            return
        for host in result.hosts:
            if host.error:
                self.stderr.write(f"{host.host}: {host.error}")
            else:
                unknown = f", {host.unknown} running domain(s) not in the inventory" if host.unknown else ""
                self.stdout.write(f"{host.host}: {host.samples} VM(s) read{unknown}")
        if any(host.error for host in result.hosts):
            raise SystemExit(1)
