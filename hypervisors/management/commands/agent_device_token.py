"""Print an agent's device token, for the agent's --device-token-file.

The token is derived (HMAC of AGENT_TOKEN_KEY and the agent's salt, with its own label), never
stored; with it in --device-token-file the agent lists, creates and removes vGPU instances for
this dashboard (GET /v1/vgpu-types, GET/POST /v1/vgpu-devices, DELETE /v1/vgpu-devices/<id>).
"""

from hypervisors.agent_devices import agent_device_token
from telemetry.management.agent_token_command import AgentTokenCommand


class Command(AgentTokenCommand):
    help = "Print the device token an agent needs to create and remove vGPUs (--device-token-file)."
    derive = agent_device_token
