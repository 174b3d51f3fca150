"""Print an agent's device token, for the agent's --device-token-file.

The token is derived (HMAC of AGENT_TOKEN_KEY and the agent's salt, with its own label), never
stored; with it in --device-token-file the agent lists, creates and removes vGPU instances for
this dashboard (GET /v1/vgpu-types, GET/POST /v1/vgpu-devices, DELETE /v1/vgpu-devices/<id>).
"""

from django.core.management.base import BaseCommand, CommandError

from hypervisors.agent_devices import agent_device_token
from telemetry.models import Agent


class Command(BaseCommand):
    help = "Print the device token an agent needs to create and remove vGPUs (--device-token-file)."

    def add_arguments(self, parser):
        parser.add_argument("agent", help="the agent's name")

    def handle(self, *args, agent: str, **options):
        try:
            row = Agent.objects.get(name=agent)
        except Agent.DoesNotExist:
            raise CommandError(f"no agent named {agent!r}") from None
        self.stdout.write(agent_device_token(row))
