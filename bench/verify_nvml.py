"""Check the agent's nvml backend against nvidia-smi on a real GPU, value by value.

Starts the agent (`python -m telemetry.agent --backend nvml`) on loopback, optionally puts
the GPUs under load (PyTorch matrix multiplies, when torch and CUDA are present), then takes
paired readings: one /v1/metrics scrape and one `nvidia-smi --query-gpu` taken right after,
and compares every field within the tolerances below. Prints a table per reading and a
verdict; exits 1 when any value falls outside its tolerance.

    python bench/verify_nvml.py [--pairs 5] [--load-seconds 20] [--no-load]

Needs only the standard library, nvidia-ml-py and nvidia-smi (torch for the load phase).
"""

from __future__ import annotations

import argparse
import http.client
import json
import os
import subprocess
import sys
import tempfile
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent

QUERY = [
    "uuid", "name", "pci.bus_id", "memory.total", "memory.used", "utilization.gpu", "utilization.memory",
    "utilization.encoder", "utilization.decoder", "temperature.gpu", "power.draw", "clocks.sm",
]

# field of the agent, nvidia-smi column, kind, tolerance (absolute; for "rel" a fraction)
CHECKS = [
    ("uuid", "uuid", "exact", None),
    ("name", "name", "exact", None),
    ("pci_bus_id", "pci.bus_id", "pci", None),
    ("fb_total_mib", "memory.total", "abs", 1),
    ("fb_used_mib", "memory.used", "abs", 64),
    ("util_gpu", "utilization.gpu", "abs", 15),
    ("util_mem", "utilization.memory", "abs", 15),
    ("enc_util", "utilization.encoder", "abs", 5),
    ("dec_util", "utilization.decoder", "abs", 5),
    ("temp_c", "temperature.gpu", "abs", 3),
    ("power_w", "power.draw", "rel", 0.15),
    ("sm_clock_mhz", "clocks.sm", "rel", 0.10),
]
TOLERANCE_NOTE = {
    "abs": "absolute difference at most {tol}",
    "rel": "relative difference at most {tol:.0%} (or 15 units)",
}


def smi_query() -> list[dict[str, str]]:
    out = subprocess.run(
        ["nvidia-smi", f"--query-gpu={','.join(QUERY)}", "--format=csv,noheader,nounits"],
        check=True, capture_output=True, text=True,
    ).stdout
    return [dict(zip(QUERY, (v.strip() for v in line.split(",")), strict=True)) for line in out.strip().splitlines()]


def smi_number(text: str) -> float | None:
    try:
        return float(text)
    except ValueError:  # "[N/A]", "[Not Supported]"
        return None


def compare(agent_gpu: dict, smi_gpu: dict) -> list[tuple[str, object, object, str, bool]]:
    rows = []
    for field, column, kind, tol in CHECKS:
        ours, theirs = agent_gpu.get(field), smi_gpu[column]
        if kind == "exact":
            ok = str(ours) == theirs
        elif kind == "pci":  # nvidia-smi prints 00000000:1B:00.0, NVML may too; compare case-insensitively
            ok = str(ours).upper().lstrip("0") == theirs.upper().lstrip("0")
        else:
            value = smi_number(theirs)
            if value is None or ours is None:
                ok = value is None and ours is None  # both say unsupported
            elif kind == "abs":
                ok = abs(float(ours) - value) <= tol
            else:
                ok = abs(float(ours) - value) <= max(tol * max(abs(value), 1.0), 15)
        rows.append((field, ours, theirs, kind, ok))
    return rows


def scrape(port: int, token: str) -> dict:
    conn = http.client.HTTPConnection("127.0.0.1", port, timeout=10)
    conn.request("GET", "/v1/metrics", headers={"Authorization": f"Bearer {token}"})
    response = conn.getresponse()
    body = response.read()
    conn.close()
    if response.status != 200:
        raise RuntimeError(f"agent answered {response.status}: {body[:200]!r}")
    return json.loads(body)


def start_load(seconds: float) -> subprocess.Popen | None:
    code = (
        "import time, torch\n"
        "if not torch.cuda.is_available(): raise SystemExit(0)\n"
        "xs = []\n"
        "for d in range(torch.cuda.device_count()):\n"
        "    a = torch.randn(8192, 8192, device=f'cuda:{d}', dtype=torch.float16); xs.append(a)\n"
        f"end = time.time() + {seconds}\n"
        "while time.time() < end:\n"
        "    for a in xs: (a @ a).sum()\n"
        "    torch.cuda.synchronize()\n"
    )
    try:
        return subprocess.Popen([sys.executable, "-c", code])
    except OSError:
        return None


def wait_for_agent(port: int, deadline_s: float = 20) -> None:
    end = time.time() + deadline_s
    while time.time() < end:
        try:
            conn = http.client.HTTPConnection("127.0.0.1", port, timeout=1)
            conn.request("GET", "/healthz")
            if conn.getresponse().status == 200:
                return
        except OSError:
            time.sleep(0.2)
    raise RuntimeError("agent did not start")


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--pairs", type=int, default=5, help="paired readings per phase")
    parser.add_argument("--load-seconds", type=float, default=20)
    parser.add_argument("--no-load", action="store_true")
    parser.add_argument("--port", type=int, default=9419)
    args = parser.parse_args()

    token = "verify-" + os.urandom(8).hex()
    with tempfile.NamedTemporaryFile("w", suffix=".token", delete=False) as handle:
        handle.write(token)
    agent = subprocess.Popen(
        [sys.executable, "-m", "telemetry.agent", "--listen", f"127.0.0.1:{args.port}",
         "--token-file", handle.name, "--backend", "nvml"], cwd=ROOT,
    )
    failures = 0
    try:
        wait_for_agent(args.port)
        print(subprocess.run(["nvidia-smi", "--query-gpu=driver_version,name", "--format=csv,noheader"],
                             capture_output=True, text=True).stdout.strip())
        phases = [("idle", None)] + ([] if args.no_load else [("load", args.load_seconds)])
        for phase, seconds in phases:
            load = start_load(seconds) if seconds else None
            if load:
                time.sleep(min(8.0, seconds / 2))  # let clocks and utilization settle
            for pair in range(args.pairs):
                payload = scrape(args.port, token)
                smi = smi_query()
                for agent_gpu, smi_gpu in zip(payload["gpus"], smi, strict=True):
                    print(f"\n[{phase} #{pair + 1}] GPU {agent_gpu['index']} {agent_gpu['uuid']}")
                    print(f"  {'field':<14}{'agent':>42}{'nvidia-smi':>42}  verdict")
                    for field, ours, theirs, _kind, ok in compare(agent_gpu, smi_gpu):
                        failures += not ok
                        print(f"  {field:<14}{str(ours):>42}{theirs:>42}  {'ok' if ok else 'MISMATCH'}")
                    nulls = [k for k, v in agent_gpu.items() if v is None]
                    print(f"  null (unsupported) fields: {nulls or 'none'}; virtualization_mode="
                          f"{agent_gpu.get('virtualization_mode')}; vgpus={len(agent_gpu.get('vgpus') or [])}; "
                          f"errors={agent_gpu.get('errors') or {}}")
                time.sleep(1.0)
            if load:
                load.wait(timeout=seconds + 30)
    finally:
        agent.terminate()
        agent.wait(timeout=10)
        os.unlink(handle.name)
    print("\nTolerances: " + "; ".join(
        f"{field} {'exact' if kind in ('exact', 'pci') else TOLERANCE_NOTE[kind].format(tol=tol)}"
        for field, _, kind, tol in CHECKS))
    print(f"\nverdict: {'PASS' if failures == 0 else f'FAIL ({failures} mismatches)'}")
    return 1 if failures else 0


if __name__ == "__main__":
    sys.exit(main())
