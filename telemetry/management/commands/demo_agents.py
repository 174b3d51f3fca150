from pathlib import Path

from django.core.management.base import BaseCommand, CommandError

from fleet.models import Host
from telemetry import demo


class Command(BaseCommand):
    help = (
        "Prepare simulated agents for the demo fleet (run seed_demo first): a scenario file and a token "
        "file (chmod 600) per host under var/agents/, built from the inventory so samples map to the demo's "
        "GPUs and VMs, and an Agent row per host polling http://127.0.0.1:9411, 9412, ... `manage.py runfleet` "
        "starts them (one process serves them all). Safe to run again: tokens are kept."
    )

    def add_arguments(self, parser):
        parser.add_argument("--hosts", default="",
                            help="comma-separated host names (default: every host with a GPU in vGPU mode)")
        parser.add_argument("--dir", default=str(demo.DEFAULT_DIR), help="output folder (default var/agents)")
        parser.add_argument("--base-port", type=int, default=demo.DEFAULT_BASE_PORT,
                            help=f"port of the first agent; the next ones follow (default {demo.DEFAULT_BASE_PORT})")
        parser.add_argument("--url-host", default=None,
                            help="host name the collector polls the agents by (default: the listen host)")
        parser.add_argument("--listen-host", default=demo.DEFAULT_LISTEN_HOST,
                            help=f"address the agents listen on (default {demo.DEFAULT_LISTEN_HOST})")

    def handle(self, *args, **options):
        names = [name.strip() for name in options["hosts"].split(",") if name.strip()]
        try:
            if names:
                hosts = {host.name: host for host in Host.objects.filter(name__in=names)}
                missing = [name for name in names if name not in hosts]
                if missing:
                    raise demo.DemoAgentsError(f"unknown host(s): {', '.join(missing)}")
                selected = [hosts[name] for name in names]
            else:
                selected = None
            agents = demo.write_demo_agents(selected, out_dir=Path(options["dir"]), base_port=options["base_port"],
                                            listen_host=options["listen_host"], url_host=options["url_host"])
        except demo.DemoAgentsError as exc:
            raise CommandError(str(exc)) from exc
        self.stdout.write(f"Simulated agents ({len(agents)}), files in {options['dir']}:")
        for agent in agents:
            self.stdout.write(f"  {agent.name:<16} {agent.url:<24} {agent.gpus} GPUs, {agent.vgpus} vGPUs")
