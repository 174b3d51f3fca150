"""Print an agent's scheduler write token, for the agent's --write-token-file.

The token is derived (HMAC of AGENT_TOKEN_KEY and the agent's salt), never stored; with it in
--write-token-file the agent accepts PUT /v1/gpus/<uuid>/scheduler from this dashboard.
"""

from telemetry.management.agent_token_command import AgentTokenCommand
from telemetry.scheduler_apply import agent_write_token


class Command(AgentTokenCommand):
    help = "Print the write token an agent needs to apply scheduler policies (--write-token-file)."
    derive = agent_write_token
