"""The host agent: serves NVML (or simulated) GPU and vGPU metrics over HTTP (DESIGN.md, "Agent protocol (v1)").

It runs on hypervisor hosts where only the Python standard library and nvidia-ml-py may be
installed, so nothing in this package imports Django, and `pynvml` is imported only by the
NVML backend (the simulated backend runs on the bare standard library).
"""

__version__ = "1.0.0"
PROTOCOL_VERSION = 1


class BackendUnavailable(Exception):
    """The backend cannot answer now (a simulated outage); the server says 503 with Retry-After."""

    def __init__(self, message: str, retry_after_s: int = 30):
        super().__init__(message)
        self.retry_after_s = retry_after_s
