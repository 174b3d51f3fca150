"""Benchmark of the host agent: collection cost per GPU and /v1/metrics latency over keep-alive,
with no other connection open and with --idle-sockets idle and slowloris connections open.

    python bench/agent.py --backend nvml     # on a GPU host (needs nvidia-ml-py)
    python bench/agent.py --backend sim      # anywhere: simulated host with 8 GPUs, 32 vGPUs

Why these figures: the agent's poll must cost about what the raw NVML calls cost (goal: at
most 2x the same calls made straight through pynvml, so the null-safety and caching are
nearly free), and a keep-alive scrape must not stall on delayed ACK (~40 ms per scrape when
a response leaves in two writes), nor because hundreds of connections sit idle or trickle
their headers (they must cost no thread and no worker). Needs only the standard library and
nvidia-ml-py.
Prints figures; asserts nothing.
"""

from __future__ import annotations

import argparse
import contextlib
import http.client
import json
import platform
import socket
import statistics
import sys
import threading
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from telemetry.agent import __version__  # noqa: E402
from telemetry.agent.server import AgentServer  # noqa: E402

TOKEN = "bench-token"


def sim_backend(gpus: int):
    """A simulated host of `gpus` L40S, each with four 12Q vGPUs of mixed workflows."""
    from telemetry.agent.scenario import build_scenario
    from telemetry.agent.sim_backend import SimBackend

    workflows = ["modeling", "texturing", "animation", "lighting", "shading", "rendering", "layout", "fx"]
    scenario = build_scenario(
        "bench-sim",
        [
            {
                "name": "NVIDIA L40S",
                "fb_total_mib": 49152,
                "vgpus": [
                    {
                        "vm_name": f"vws-{g:02d}-{v}",
                        "type_name": "L40S-12Q",
                        "fb_mib": 12288,
                        "workflow": workflows[(4 * g + v) % len(workflows)],
                    }
                    for v in range(4)
                ],
            }
            for g in range(gpus)
        ],
        timezone="UTC",
    )
    return SimBackend(scenario)


def raw_nvml_calls(pynvml, backend) -> list[tuple]:
    """The calls a steady-state poll makes, as plain pynvml calls, keeping those the GPUs support.

    Identity is excluded (the backend caches it). vGPU calls are included on vGPU hosts.
    nvmlDeviceGetVgpuUtilization is called with a fresh timestamp each time (incremental,
    as the backend does); its NOT_FOUND is a normal answer, so it is caught in both loops.
    """
    calls = []
    for index in range(pynvml.nvmlDeviceGetCount()):
        h = pynvml.nvmlDeviceGetHandleByIndex(index)
        candidates = [
            (pynvml.nvmlDeviceGetVirtualizationMode, (h,)),
            (pynvml.nvmlDeviceGetUtilizationRates, (h,)),
            (pynvml.nvmlDeviceGetMemoryInfo, (h,)),
            (pynvml.nvmlDeviceGetEncoderUtilization, (h,)),
            (pynvml.nvmlDeviceGetDecoderUtilization, (h,)),
            (pynvml.nvmlDeviceGetTemperature, (h, pynvml.NVML_TEMPERATURE_GPU)),
            (pynvml.nvmlDeviceGetPowerUsage, (h,)),
            (pynvml.nvmlDeviceGetClockInfo, (h, pynvml.NVML_CLOCK_SM)),
            (pynvml.nvmlDeviceGetCurrentClocksEventReasons, (h,)),
        ]
        try:
            host = pynvml.nvmlDeviceGetVirtualizationMode(h) == pynvml.NVML_GPU_VIRTUALIZATION_MODE_HOST_VGPU
        except pynvml.NVMLError:
            host = False
        if host:
            candidates.append((pynvml.nvmlDeviceGetActiveVgpus, (h,)))
            candidates.append((pynvml.nvmlDeviceGetVgpuSchedulerState, (h,)))
            try:
                instances = pynvml.nvmlDeviceGetActiveVgpus(h)
            except pynvml.NVMLError:
                instances = []
            for instance in instances:
                candidates.append((pynvml.nvmlVgpuInstanceGetFbUsage, (instance,)))
                candidates.append((pynvml.nvmlVgpuInstanceGetEncoderStats, (instance,)))
        for fn, args in candidates:
            try:
                fn(*args)
            except pynvml.NVMLError:
                continue  # NOT_SUPPORTED etc.: the backend stops calling it too
            calls.append((fn, args))
        if host:
            calls.append(("vgpu_utilization", (h,)))
    return calls


def time_raw(pynvml, calls, rounds: int) -> float:
    """Seconds per round of the raw calls."""
    last_ts = {}
    start = time.perf_counter()
    for _ in range(rounds):
        for fn, args in calls:
            if fn == "vgpu_utilization":
                h = args[0]
                try:
                    samples = pynvml.nvmlDeviceGetVgpuUtilization(h, last_ts.get(id(h), 0))
                    if samples:
                        last_ts[id(h)] = max(s.timeStamp for s in samples)
                except pynvml.NVMLError:
                    pass
            else:
                fn(*args)
    return (time.perf_counter() - start) / rounds


def time_collect(backend, rounds: int) -> float:
    start = time.perf_counter()
    for _ in range(rounds):
        backend.collect()
    return (time.perf_counter() - start) / rounds


def time_encode(backend, rounds: int) -> float:
    gpus = backend.collect()
    start = time.perf_counter()
    for _ in range(rounds):
        json.dumps(gpus, separators=(",", ":")).encode()
    return (time.perf_counter() - start) / rounds


def collection_cost(args, backend, gpu_count: int) -> None:
    print(f"== collection cost per GPU ({gpu_count} GPU(s), {args.polls} polls x {args.trials} trials)")
    for _ in range(20):  # warm-up: identity cached, unsupported readers dropped
        backend.collect()
    if args.backend == "nvml":
        import pynvml

        calls = raw_nvml_calls(pynvml, backend)
        raw_means, agent_means = [], []
        for _ in range(args.trials):  # interleaved so drift (clocks, other load) hits both alike
            raw_means.append(time_raw(pynvml, calls, args.polls))
            agent_means.append(time_collect(backend, args.polls))
        raw_us = statistics.median(raw_means) * 1e6 / gpu_count
        agent_us = statistics.median(agent_means) * 1e6 / gpu_count
        print(f"raw pynvml calls      : {raw_us:8.1f} us/GPU  ({len(calls)} supported calls in all)")
        print(f"agent poll (collect)  : {agent_us:8.1f} us/GPU")
        print(f"ratio agent/raw       : {agent_us / raw_us:8.2f} x   (goal <= 2x)")
    else:
        agent_means = [time_collect(backend, args.polls) for _ in range(args.trials)]
        agent_us = statistics.median(agent_means) * 1e6 / gpu_count
        vgpus = sum(len(g["vgpus"]) for g in backend.collect())
        print("raw pynvml calls      :      n/a (simulated backend, no NVML)")
        print(f"sim poll (collect)    : {agent_us:8.1f} us/GPU  ({vgpus} vGPUs in all)")
    encode_us = time_encode(backend, args.polls) * 1e6 / gpu_count
    print(f"JSON encoding         : {encode_us:8.1f} us/GPU")


class IdleSockets:
    """`count` connections that never finish a request: a third silent, a third half a request
    line, a third slowloris (a header byte every 50 ms each, from one thread)."""

    def __init__(self, address, count: int):
        self.sockets = [socket.create_connection(address) for _ in range(count)]
        third = count // 3
        for sock in self.sockets[third:2 * third]:
            sock.sendall(b"GET /v1/met")
        self.trickling = self.sockets[2 * third:]
        for sock in self.trickling:
            sock.sendall(b"GET /v1/metrics HTTP/1.1\r\nX-Slow: ")
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._trickle, daemon=True)
        self._thread.start()

    def _trickle(self) -> None:
        while not self._stop.wait(0.05):
            for sock in self.trickling:
                with contextlib.suppress(OSError):  # closed by the agent: then it stays closed
                    sock.send(b"a")

    def still_open(self) -> int:
        count = 0
        for sock in self.sockets:
            sock.setblocking(False)
            try:
                count += sock.recv(1) != b""
            except BlockingIOError:
                count += 1
            except OSError:
                pass
        return count

    def close(self) -> None:
        self._stop.set()
        self._thread.join()
        for sock in self.sockets:
            sock.close()


def time_scrapes(server, scrapes: int) -> tuple[list[float], int, int, float]:
    """(sorted latencies in ms, payload bytes, non-200 answers, scrapes/s) over one keep-alive connection."""
    conn = http.client.HTTPConnection(*server.server_address[:2], timeout=10)
    headers = {"Authorization": f"Bearer {TOKEN}"}
    size = 0
    for _ in range(50):
        conn.request("GET", "/v1/metrics", headers=headers)
        size = len(conn.getresponse().read())
    latencies = []
    bad = 0
    start = time.perf_counter()
    for _ in range(scrapes):
        t0 = time.perf_counter()
        conn.request("GET", "/v1/metrics", headers=headers)
        response = conn.getresponse()
        response.read()
        latencies.append(time.perf_counter() - t0)
        bad += response.status != 200
    elapsed = time.perf_counter() - start
    conn.close()
    return sorted(x * 1e3 for x in latencies), size, bad, scrapes / elapsed


def scrape_latency(args, backend) -> None:
    # A request timeout longer than the run, so the idle sockets stay open throughout.
    server = AgentServer(("127.0.0.1", 0), backend, TOKEN, "bench-host", request_timeout_s=3600)
    thread = threading.Thread(target=server.serve_forever, daemon=True)
    thread.start()
    rows = []
    try:
        for idle_count in (0, args.idle_sockets):
            idle = IdleSockets(server.server_address[:2], idle_count)
            try:
                time.sleep(0.5)  # accepted, and trickling
                ms, size, bad, rate = time_scrapes(server, args.scrapes)
                rows.append((idle_count, ms, bad, rate, idle.still_open()))
            finally:
                idle.close()
    finally:
        server.shutdown()
        server.server_close()
    print(f"== GET /v1/metrics over one keep-alive loopback connection ({args.scrapes} scrapes, {size} B payload)")
    print("idle sockets open  mean ms  median ms  p99 ms  max ms  scrapes/s  non-200  idle still open after")
    for idle_count, ms, bad, rate, still_open in rows:
        print(f"{idle_count:17d}  {statistics.mean(ms):7.3f}  {statistics.median(ms):9.3f}  "
              f"{ms[int(0.99 * (len(ms) - 1))]:6.3f}  {ms[-1]:6.3f}  {rate:9,.0f}  {bad:7d}  {still_open:21d}")


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--backend", choices=("nvml", "sim"), required=True)
    parser.add_argument("--gpus", type=int, default=8, help="simulated GPUs (sim only; default 8)")
    parser.add_argument("--polls", type=int, default=2000, help="polls per timing trial (default 2000)")
    parser.add_argument("--trials", type=int, default=5, help="interleaved timing trials (default 5)")
    parser.add_argument("--scrapes", type=int, default=2000, help="timed HTTP scrapes (default 2000)")
    parser.add_argument("--idle-sockets", type=int, default=300,
                        help="idle and slowloris connections held open in the second scrape phase (default 300)")
    args = parser.parse_args()

    print(f"agent {__version__}, Python {platform.python_version()}, {platform.machine()}, {platform.system()}")
    if args.backend == "nvml":
        import pynvml

        from telemetry.agent.nvml_backend import NvmlBackend

        backend = NvmlBackend(pynvml)
        gpu_count = backend.gpu_count
        print(f"driver {pynvml.nvmlSystemGetDriverVersion()}, NVML {pynvml.nvmlSystemGetNVMLVersion()}")
        for gpu in backend.collect():
            print(f"GPU {gpu['index']}: {gpu['name']} ({gpu['virtualization_mode']}), {len(gpu['vgpus'])} vGPU(s)")
            unsupported = sorted(k for k, v in gpu.items() if v is None)
            print(f"  null (unsupported) fields: {', '.join(unsupported) or 'none'}")
    else:
        backend = sim_backend(args.gpus)
        gpu_count = args.gpus
        print(f"simulated host: {gpu_count} GPUs")
    try:
        collection_cost(args, backend, gpu_count)
        scrape_latency(args, backend)
    finally:
        backend.close()


if __name__ == "__main__":
    main()
