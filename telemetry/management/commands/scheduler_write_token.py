"""Print an agent's scheduler write token, for the agent's --write-token-file.

The token is derived (HMAC of AGENT_TOKEN_KEY and the agent's salt), never stored; with it in
--write-token-file the agent accepts PUT /v1/gpus/<uuid>/scheduler from this dashboard.
"""

from django.core.management.base import BaseCommand, CommandError

from telemetry.models import Agent
from telemetry.scheduler_apply import agent_write_token


class Command(BaseCommand):
    help = "Print the write token an agent needs to apply scheduler policies (--write-token-file)."

    def add_arguments(self, parser):
        parser.add_argument("agent", help="the agent's name")

    def handle(self, *args, agent: str, **options):
        try:
            row = Agent.objects.get(name=agent)
        except Agent.DoesNotExist:
            raise CommandError(f"no agent named {agent!r}") from None
        self.stdout.write(agent_write_token(row))
