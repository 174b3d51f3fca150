"""Benchmark of the fleet placement optimizer (`sizing.optimizer`) on generated fleets.

    .venv/bin/python bench/placement.py            # 2,000 GPUs, ~10,000 vGPUs
    .venv/bin/python bench/placement.py --quick    # a small equal-size fleet, with CP-SAT's optimum

Pure Python, no database. A seeded generator builds a studio fleet: hosts of 4 Quadro RTX 6000
(72 threads, 768 GiB), of 8 NVIDIA L40S (128 threads, 2 TiB; a quarter of the GPUs in
mixed-size mode), of 8 NVIDIA A16 GPUs (two boards; 128 threads, 1.5 TiB) and of 4 NVIDIA A40
(96 threads, 1 TiB; some mixed-size), vCPU overcommit 2-3, RAM not overcommitted (vGPU VMs
reserve their memory). VMs follow the sizing guide's workflows: profiles from 1B to 48Q, vCPU
and RAM growing with the frame buffer, some lighting VMs with 2-4 full-GPU vGPUs on one host.

The current layout is fragmented the way a fleet grows: VMs arrive in random order, each on
a random GPU that takes it (often a fresh one), then a share leaves at random and newcomers
arrive the same way. Every vGPU is placed through `placement.check_placement`, so the fleet is
one the inventory could hold.

Prints GPUs in use now, the lower bound, the optimizer's GPUs with `ratio` to the lower bound,
its moves and seconds, first-fit decreasing's GPUs and seconds, and what `verify` found
(must be nothing). `--quick` builds a small fleet of equal-size GPUs only and adds CP-SAT's
optimum (sizing/tests/exact.py) and the gap to it. The large case then runs again with
`--changes` pending resize requests (random VMs, new profiles drawn like a newcomer's).
"""

from __future__ import annotations

import argparse
import os
import platform
import random
import sys
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from sizing import optimizer  # noqa: E402
from sizing.tests.fleets import PROFILE_BY_NAME, FleetBuilder  # noqa: E402

# model: (GPUs per host, threads, RAM GiB, vCPU overcommit, share of GPUs in mixed-size mode,
#         {profile suffix: weight}, board code)
KINDS = {
    "Quadro RTX 6000": (4, 72, 768, 2.0, 0.0,
                        {"24Q": 2, "12Q": 5, "8Q": 5, "6Q": 8, "4Q": 20, "3Q": 18, "2Q": 28, "1Q": 14}, "RTX6000"),
    "NVIDIA L40S": (8, 128, 2048, 3.0, 0.25,
                    {"48Q": 1, "24Q": 3, "16Q": 5, "12Q": 10, "8Q": 16, "6Q": 16, "4Q": 27, "2Q": 22}, "L40S"),
    "NVIDIA A16": (8, 128, 1536, 3.0, 0.0,
                   {"16Q": 1, "8Q": 6, "4Q": 25, "2Q": 28, "2B": 20, "1B": 20}, "A16"),
    "NVIDIA A40": (4, 96, 1024, 3.0, 0.25,
                   {"48Q": 1, "24Q": 4, "16Q": 5, "12Q": 12, "8Q": 16, "4Q": 30, "1Q": 32}, "A40"),
}
GPU_SHARE = {"Quadro RTX 6000": 0.25, "NVIDIA L40S": 0.35, "NVIDIA A16": 0.2, "NVIDIA A40": 0.2}
MULTI_SHARE = 0.02
# Share of arrivals that go to any GPU (often an empty one) rather than beside their size.
FRESH = 0.15


def vm_size(fb_gib: int, vgpus: int) -> tuple[int, int]:
    """vCPUs and RAM GiB of a VM by the frame buffer it gets (vgpu-facts.md section 5: light
    4 vCPU / 16 GB, medium 8 / 32, heavy 12+ / 64)."""
    total = fb_gib * vgpus
    if total <= 2:
        return 2, 8
    if total <= 4:
        return 4, 16
    if total <= 12:
        return 8, 32
    if total <= 24:
        return 12, 64
    return 16, 128


class Generator:
    """Grows a fragmented fleet (see the module docstring) with a FleetBuilder."""

    def __init__(self, rng: random.Random, gpus: int, equal_only: bool = False):
        self.rng = rng
        self.builder = FleetBuilder()
        self.by_model: dict[str, list[int]] = {}
        for model, share in GPU_SHARE.items():
            per_host, threads, ram_gib, overcommit, mixed_share, _, _ = KINDS[model]
            count = round(gpus * share / per_host)
            for _ in range(max(count, 1)):
                host_id = self.builder.host(cpu_threads=threads, ram_gib=ram_gib, vcpu_overcommit=overcommit)
                for _ in range(per_host):
                    size_mode = "mixed" if not equal_only and rng.random() < mixed_share else "equal"
                    self.by_model.setdefault(model, []).append(self.builder.gpu(host_id, model, size_mode))
        self.on_host: dict[int, list[int]] = {}
        for gpu in self.builder.gpus.values():
            self.on_host.setdefault(gpu.host_id, []).append(gpu.id)
        self.open: dict[tuple[str, int], list[int]] = {}

    def draw(self, model: str) -> tuple[str, int]:
        """A profile name and vGPU count for a new VM on `model`."""
        weights = KINDS[model][5]
        code = KINDS[model][6]
        if self.rng.random() < MULTI_SHARE:
            full = max(weights, key=lambda s: int(s[:-1]))
            return f"{code}-{full}", self.rng.randint(2, 4 if model == "Quadro RTX 6000" else 2)
        suffix = self.rng.choices(list(weights), weights=list(weights.values()))[0]
        return f"{code}-{suffix}", 1

    def arrive(self, model: str) -> int | None:
        """A new VM placed on a random GPU that takes it: one already holding that size, except a
        share `FRESH` of the time (and when none does), any GPU of the model. Returns the VM
        id, or None if nothing took it."""
        name, count = self.draw(model)
        spec = PROFILE_BY_NAME[name]
        vcpus, ram_gib = vm_size(spec.fb_mib // 1024, count)
        b = self.builder
        vm_id = b.vm(vcpus=vcpus, ram_gib=ram_gib)
        gpu_ids = self.by_model[model]
        opened = self.open.setdefault((model, spec.fb_mib), [])
        tries = []
        if opened and self.rng.random() >= FRESH:
            tries = [self.rng.choice(opened) for _ in range(8)]
        # Then any GPU: a random sample keeps the generator fast as the fleet fills.
        tries += self.rng.sample(gpu_ids, min(len(gpu_ids), 64))
        for gpu_id in tries:
            if not b.check(vm_id, gpu_id, name).ok:
                continue
            placed = 0
            for _ in range(count):
                target = next((g for g in [gpu_id, *self.on_host[b.gpus[gpu_id].host_id]]
                               if b.check(vm_id, g, name).ok), None)
                if target is None:
                    break
                b.place(vm_id, target, name)
                placed += 1
            if placed == count:
                if gpu_id not in opened:
                    opened.append(gpu_id)
                return vm_id
            b.remove(vm_id)
        del b.vms[vm_id]
        return None

    def grow(self, vgpus: int, leave: float) -> None:
        """Place VMs until about `vgpus` vGPUs, let a share `leave` of them go, and refill."""
        live: list[int] = []
        self._fill_to(vgpus, live)
        for vm_id in self.rng.sample(live, int(len(live) * leave)):
            self.builder.remove(vm_id)
            del self.builder.vms[vm_id]
            live.remove(vm_id)
        self._fill_to(vgpus, live)

    def _fill_to(self, vgpus: int, live: list[int]) -> None:
        """New VMs until `live` VMs hold `vgpus` vGPUs (or 200 found no room)."""
        models = list(GPU_SHARE)
        weights = [GPU_SHARE[m] for m in models]
        placed = sum(len(self.builder.vms[v].vgpus) for v in live)
        misses = 0
        while placed < vgpus and misses < 200:
            vm_id = self.arrive(self.rng.choices(models, weights=weights)[0])
            if vm_id is None:
                misses += 1
                continue
            live.append(vm_id)
            placed += len(self.builder.vms[vm_id].vgpus)


def run(gpus: int, vgpus: int, seed: int, leave: float, equal_only: bool, exact: bool, time_limit_s: float,
        changes: int = 0) -> None:
    started = time.perf_counter()
    gen = Generator(random.Random(seed), gpus, equal_only=equal_only)
    gen.grow(vgpus, leave)
    snapshot = gen.builder.snapshot()
    built_s = time.perf_counter() - started
    usable = [g for g in snapshot.gpus.values() if g.mode == "vgpu"]
    mixed = sum(1 for g in usable if g.size_mode == "mixed")
    multi = sum(1 for vm in snapshot.vms.values() if len(vm.vgpus) > 1)
    n_vgpus = sum(len(vm.vgpus) for vm in snapshot.vms.values())
    print(f"fleet (seed {seed}): {len(snapshot.hosts):,} hosts, {len(usable):,} GPUs ({mixed} in mixed-size mode), "
          f"{len(snapshot.vms):,} VMs, {n_vgpus:,} vGPUs ({multi} multi-vGPU VMs); built in {built_s:.1f} s")
    for model in GPU_SHARE:
        gpus_of = [g for g in usable if g.model.name == model]
        print(f"  {model:>16}: {len(gpus_of):5,} GPUs, {sum(1 for g in gpus_of if g.vgpus):5,} in use, "
              f"{sum(len(g.vgpus) for g in gpus_of):6,} vGPUs")

    bound = optimizer.lower_bound(snapshot)
    t0 = time.perf_counter()
    ffd = optimizer.first_fit_decreasing(snapshot)
    ffd_s = time.perf_counter() - t0
    t0 = time.perf_counter()
    plan = optimizer.optimize(snapshot, time_limit_s=time_limit_s)
    opt_s = time.perf_counter() - t0
    t0 = time.perf_counter()
    violations = optimizer.verify(snapshot, plan)
    verify_s = time.perf_counter() - t0
    moved_hosts = sum(1 for m in plan.moves if m.from_host_id != m.to_host_id)

    print(f"{'GPUs in use now':>32}: {plan.gpus_before:6,}")
    print(f"{'lower bound':>32}: {bound:6,}")
    print(f"{'optimizer':>32}: {plan.gpus_after:6,}  ratio {plan.gpus_after / bound:.4f}  "
          f"{len(plan.moves):,} VMs moved ({moved_hosts:,} to another host), {len(plan.freed_gpu_ids):,} GPUs freed; "
          f"{opt_s:.2f} s ({plan.strategy})")
    print(f"{'first-fit decreasing':>32}: {ffd.gpus_after:6,}  ratio {ffd.gpus_after / bound:.4f}  "
          f"{len(ffd.moves):,} VMs moved, {len(ffd.unplaced)} left out; {ffd_s:.2f} s")
    if exact:
        from sizing.tests.exact import exact_optimum

        best = exact_optimum(snapshot, time_limit_s=20.0, size_cuts=True)
        print(f"{'CP-SAT':>32}: {best.gpus:6,}  {'optimal' if best.proven else 'best found, not proven'} in "
              f"{best.seconds:.1f} s; optimizer gap {plan.gpus_after - best.gpus:+d} GPU(s)")
    print(f"{'verify':>32}: {'clean' if not violations else f'{len(violations)} violation(s)'} ({verify_s:.2f} s)")
    if changes:
        # Pending resize requests: VMs drawn at random get a profile drawn as for a new VM.
        rng = random.Random(seed + 1)
        chosen = rng.sample(sorted(vm.id for vm in snapshot.vms.values() if vm.vgpus), changes)
        wanted = []
        for vm_id in chosen:
            name, count = gen.draw(snapshot.vms[vm_id].vgpus[0].profile.gpu_model)
            wanted.append(optimizer.Change(vm_id, PROFILE_BY_NAME[name].id, count, f"resize-request:{vm_id}"))
        t0 = time.perf_counter()
        with_changes = optimizer.optimize(snapshot, wanted, time_limit_s=time_limit_s)
        changes_s = time.perf_counter() - t0
        more = optimizer.verify(snapshot, with_changes)
        violations += more
        print(f"{f'with {changes} pending changes':>32}: {with_changes.gpus_after:6,}  lower bound "
              f"{with_changes.lower_bound:,}, ratio {with_changes.gpus_after / with_changes.lower_bound:.4f}, "
              f"{len(with_changes.unplaced)} left out, {len(with_changes.moves):,} VMs moved; {changes_s:.2f} s; "
              f"verify {'clean' if not more else f'{len(more)} violation(s)'}")
    for v in violations[:10]:
        print(f"    {v.rule}: {v.message}")
    if violations:
        raise SystemExit(1)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--quick", action="store_true", help="a small equal-size fleet, with CP-SAT's optimum")
    parser.add_argument("--gpus", type=int, help="GPUs in the fleet (default 2000, --quick 96)")
    parser.add_argument("--vgpus", type=int, help="vGPUs to place (default 10000, --quick 450)")
    parser.add_argument("--leave", type=float, default=0.3, help="share of VMs that leave before refilling")
    parser.add_argument("--seed", type=int, default=1)
    parser.add_argument("--time-limit", type=float, default=10.0, help="the optimizer's time_limit_s")
    parser.add_argument("--changes", type=int, default=200,
                        help="pending resize requests for a second run of the large case (default 200)")
    args = parser.parse_args()
    print(f"Python {platform.python_version()}, {os.cpu_count()} CPUs")
    if args.quick:
        run(args.gpus or 96, args.vgpus or 450, args.seed, args.leave, equal_only=True, exact=True,
            time_limit_s=args.time_limit)
    else:
        run(args.gpus or 2000, args.vgpus or 10000, args.seed, args.leave, equal_only=False, exact=False,
            time_limit_s=args.time_limit, changes=args.changes)


if __name__ == "__main__":
    main()
