"""The commands that print a token the dashboard derives for an agent (`scheduler_write_token`,
`agent_device_token`): the admin runs one on the dashboard and puts its output in the agent's
token file, since the token itself is never stored."""

from collections.abc import Callable

from django.core.management.base import BaseCommand, CommandError

from telemetry.models import Agent


class AgentTokenCommand(BaseCommand):
    """Prints `derive(agent)` for the agent named on the command line."""

    derive: Callable[[Agent], str]

    def add_arguments(self, parser):
        parser.add_argument("agent", help="the agent's name")

    def handle(self, *args, agent: str, **options):
        try:
            row = Agent.objects.get(name=agent)
        except Agent.DoesNotExist:
            raise CommandError(f"no agent named {agent!r}") from None
        self.stdout.write(type(self).derive(row))
