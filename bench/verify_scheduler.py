"""Check the agent's scheduler write path on a real GPU: every answer of
PUT /v1/gpus/<uuid>/scheduler, and what the driver itself says.

Starts the agent (`python -m telemetry.agent --backend nvml --write-token-file ...`) on
loopback, reads the GPU's UUID and scheduler reading from /v1/metrics, then sends:

- no token (401), the read token instead of the write token (401), an unknown UUID (404),
  a body that is not JSON (400), settings the rules refuse (400);
- valid settings for every policy: the agent must answer 200 with the state read back on a
  vGPU host, or 501 with NVML's reason where the GPU has no vGPU manager (bare metal or
  passthrough), never a 500 or a dropped connection.

It also calls nvmlDeviceSetVgpuSchedulerState / nvmlDeviceGetVgpuSchedulerState directly
through pynvml (proving the structure the agent fills exists in the installed nvidia-ml-py)
and runs `nvidia-smi vgpu -i 0 -ss` for the driver's own answer. Prints one line per check
and a verdict; exits 1 on any unexpected answer.

    python bench/verify_scheduler.py [--port 9421]
"""

from __future__ import annotations

import argparse
import http.client
import json
import os
import subprocess
import sys
import tempfile
from pathlib import Path

from verify_nvml import ROOT, scrape, wait_for_agent

VALID = [
    {"policy": "best_effort"},
    {"policy": "equal_share", "arr": True, "frequency_hz": 480, "avg_factor": 33},
    {"policy": "equal_share", "arr": False, "timeslice_ms": 3},
    {"policy": "fixed_share", "arr": True},
    {"policy": "fixed_share", "arr": False, "timeslice_ms": 24},
]


def put(port: int, uuid: str, body: bytes, token: str | None) -> tuple[int, dict]:
    conn = http.client.HTTPConnection("127.0.0.1", port, timeout=10)
    headers = {"Content-Type": "application/json"}
    if token:
        headers["Authorization"] = f"Bearer {token}"
    conn.request("PUT", f"/v1/gpus/{uuid}/scheduler", body=body, headers=headers)
    response = conn.getresponse()
    raw = response.read()
    conn.close()
    try:
        return response.status, json.loads(raw or b"{}")
    except ValueError:
        return response.status, {"raw": raw[:200].decode(errors="replace")}


def direct_nvml() -> list[str]:
    """The driver's answers to the get/set calls themselves, without the agent in between."""
    import pynvml as nvml

    lines = []
    nvml.nvmlInit()
    try:
        handle = nvml.nvmlDeviceGetHandleByIndex(0)
        for name, call in (
            ("nvmlDeviceGetVirtualizationMode", lambda: nvml.nvmlDeviceGetVirtualizationMode(handle)),
            ("nvmlDeviceGetVgpuSchedulerState", lambda: nvml.nvmlDeviceGetVgpuSchedulerState(handle)),
            ("nvmlDeviceGetVgpuSchedulerCapabilities", lambda: nvml.nvmlDeviceGetVgpuSchedulerCapabilities(handle)),
            ("nvmlDeviceSetVgpuSchedulerState", lambda: _set_best_effort(nvml, handle)),
        ):
            try:
                lines.append(f"{name}: {call()!r}")
            except nvml.NVMLError as exc:
                lines.append(f"{name}: NVMLError {exc}")
            except AttributeError as exc:
                lines.append(f"{name}: missing in this nvidia-ml-py ({exc})")
    finally:
        nvml.nvmlShutdown()
    return lines


def _set_best_effort(nvml, handle):
    state = nvml.c_nvmlVgpuSchedulerSetState_t()
    state.schedulerPolicy = 1  # NVML_VGPU_SCHEDULER_POLICY_BEST_EFFORT
    state.enableARRMode = 0
    return nvml.nvmlDeviceSetVgpuSchedulerState(handle, state)


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--port", type=int, default=9421)
    args = parser.parse_args()

    read_token, write_token = "read-" + os.urandom(8).hex(), "write-" + os.urandom(8).hex()
    files = []
    for value in (read_token, write_token):
        with tempfile.NamedTemporaryFile("w", suffix=".token", delete=False) as handle:
            handle.write(value)
            files.append(handle.name)
    agent = subprocess.Popen(
        [sys.executable, "-m", "telemetry.agent", "--backend", "nvml", "--listen", f"127.0.0.1:{args.port}",
         "--token-file", files[0], "--write-token-file", files[1], "--log-level", "WARNING"],
        cwd=ROOT,
    )
    failures = 0

    def check(label: str, status: int, document: dict, expected: set[int]) -> None:
        nonlocal failures
        ok = status in expected
        failures += not ok
        print(f"{'ok ' if ok else 'BAD'} {label:<58} HTTP {status} {json.dumps(document)[:150]}")

    try:
        wait_for_agent(args.port)
        gpu = scrape(args.port, read_token)["gpus"][0]
        uuid = gpu["uuid"]
        print(f"GPU {gpu['name']} {uuid}; scheduler reading in /v1/metrics: {gpu.get('scheduler')!r}; "
              f"errors: {gpu.get('errors')}")
        body = json.dumps(VALID[0]).encode()
        check("no token", *put(args.port, uuid, body, None), {401})
        check("read token instead of the write token", *put(args.port, uuid, body, read_token), {401})
        check("unknown GPU UUID", *put(args.port, "GPU-00000000-0000-0000-0000-000000000000", body, write_token),
              {404})
        check("body not JSON", *put(args.port, uuid, b"{policy", write_token), {400})
        check("time slice with ARR (refused by the rules)",
              *put(args.port, uuid, json.dumps({"policy": "equal_share", "arr": True, "timeslice_ms": 3}).encode(),
                   write_token), {400})
        check("frequency 20 Hz (below 63)",
              *put(args.port, uuid, json.dumps({"policy": "equal_share", "arr": True, "frequency_hz": 20}).encode(),
                   write_token), {400})
        for settings in VALID:
            check(f"valid {settings}", *put(args.port, uuid, json.dumps(settings).encode(), write_token), {200, 501})
        gpu_after = scrape(args.port, read_token)["gpus"][0]
        check("agent still serves /v1/metrics after the writes", 200, {"uuid": gpu_after["uuid"]}, {200})
    finally:
        agent.terminate()
        agent.wait(timeout=10)
        for name in files:
            Path(name).unlink(missing_ok=True)

    print("\nDirect NVML calls on GPU 0:")
    for line in direct_nvml():
        print("  " + line)
    smi = subprocess.run(["nvidia-smi", "vgpu", "-i", "0", "-ss"], capture_output=True, text=True)
    print(f"\nnvidia-smi vgpu -i 0 -ss (exit {smi.returncode}):\n  {(smi.stdout + smi.stderr).strip()}")
    print(f"\nverdict: {'PASS' if not failures else f'FAIL ({failures} unexpected answers)'}")
    return 1 if failures else 0


if __name__ == "__main__":
    sys.exit(main())
