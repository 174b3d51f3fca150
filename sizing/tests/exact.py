"""The exact optimum of small equal-size fleets, by OR-Tools CP-SAT: what the optimizer's tests
and bench/placement.py compare its GPU counts with. Test and bench code only (ortools is a
development requirement).

The model covers the placement rules of equal-size GPUs exactly: a VM's vGPUs on GPUs of its
profile's model in vGPU mode, all on one host; each GPU holds vGPUs of one frame buffer size,
at most that size's equal-size maximum (which keeps the frame buffer within the GPU's); each
host's vCPU and RAM capacity (with overcommit) holds the VMs on it. It minimises the GPUs that
hold a vGPU. Mixed-size GPUs are refused (`ValueError`): their aligned slots are not modelled.
"""

from __future__ import annotations

from collections import Counter
from dataclasses import dataclass

from ortools.sat.python import cp_model

from fleet.snapshot import FleetSnapshot


@dataclass(frozen=True)
class Optimum:
    gpus: int  # GPUs holding a vGPU in the best layout found
    proven: bool  # CP-SAT proved no layout uses fewer
    seconds: float
    layout: dict  # vm_id -> sorted GPU ids of its vGPUs in that layout


def target_profiles(snapshot: FleetSnapshot, changes=()) -> dict[int, list]:
    """Each VM's profiles once `changes` are made (a later change of a VM replaces an earlier)."""
    wanted = {vm.id: [v.profile for v in vm.vgpus] for vm in snapshot.vms.values()}
    for change in changes:
        wanted[change.vm_id] = [snapshot.profiles[change.profile_id]] * change.vgpus if change.vgpus else []
    return wanted


def exact_optimum(snapshot: FleetSnapshot, changes=(), *, time_limit_s: float = 20.0, workers: int = 2,
                  size_cuts: bool = False) -> Optimum:
    """The fewest GPUs any layout of the fleet (with `changes` made) can use.

    `size_cuts` adds, per model and frame buffer size, "the GPUs holding this size number at
    least ceil(vGPUs of this size / its maximum per GPU)": implied by the model (it changes no
    answer) but out of reach of its linear relaxation, which lets sizes share GPUs fractionally;
    without it CP-SAT finds the optimum of a few dozen GPUs quickly but seldom proves it. Tests
    that check the optimizer's lower bound against this optimum leave it out (it is that bound).
    """
    if any(g.size_mode == "mixed" and g.mode == "vgpu" for g in snapshot.gpus.values()):
        raise ValueError("the exact model covers equal-size GPUs only")
    wanted = target_profiles(snapshot, changes)
    model = cp_model.CpModel()
    gpus = [g for g in snapshot.gpus.values() if g.mode == "vgpu"]
    sizes_on: dict[int, set[int]] = {g.id: set() for g in gpus}
    load: dict[tuple[int, int], list] = {}  # (gpu, fb size) -> count variables
    caps: dict[tuple[str, int], int] = {}
    host_vcpus: dict[int, list] = {h: [] for h in snapshot.hosts}
    host_ram: dict[int, list] = {h: [] for h in snapshot.hosts}
    counts_of: dict[int, list] = {}
    for vm_id, profiles in sorted(wanted.items()):
        if not profiles:
            continue
        vm = snapshot.vms[vm_id]
        counts = Counter(profiles)
        hosts = sorted({g.host_id for g in gpus for p in counts if g.model.name == p.gpu_model})
        on_host = {h: model.new_bool_var(f"vm{vm_id}_h{h}") for h in hosts}
        model.add_exactly_one(on_host.values())
        for h, var in on_host.items():
            host_vcpus[h].append(vm.vcpus * var)
            host_ram[h].append(vm.ram_gib * var)
        for profile, k in counts.items():
            fb_mib = profile.fb_mib
            caps[(profile.gpu_model, fb_mib)] = max(caps.get((profile.gpu_model, fb_mib), 0),
                                                    min(profile.max_per_gpu,
                                                        snapshot.models[profile.gpu_model].fb_mib // fb_mib))
            placed = []
            counts_of.setdefault(vm_id, [])
            for g in gpus:
                if g.model.name != profile.gpu_model:
                    continue
                n = model.new_int_var(0, k, f"n_vm{vm_id}_p{profile.id}_g{g.id}")
                model.add(n <= k * on_host[g.host_id])
                placed.append(n)
                counts_of[vm_id].append((g.id, n))
                load.setdefault((g.id, fb_mib), []).append(n)
                sizes_on[g.id].add(fb_mib)
            model.add(sum(placed) == k)
        # Each vGPU of a VM on a GPU of its own, unless its host lets them share one.
        per_gpu: dict[int, list] = {}
        for gpu_id, n in counts_of.get(vm_id, []):
            per_gpu.setdefault(gpu_id, []).append(n)
        for gpu_id, variables in per_gpu.items():
            if not snapshot.hosts[snapshot.gpus[gpu_id].host_id].multi_vgpu_same_gpu:
                model.add(sum(variables) <= 1)
    used = []
    in_use_of: dict[int, object] = {}
    size_vars: dict[tuple[str, int], list] = {}
    for g in gpus:
        if not sizes_on[g.id]:
            continue
        classes = {s: model.new_bool_var(f"g{g.id}_s{s}") for s in sorted(sizes_on[g.id])}
        for s, var in classes.items():
            model.add(sum(load[(g.id, s)]) <= caps[(g.model.name, s)] * var)
            size_vars.setdefault((g.model.name, s), []).append(var)
        # One size per GPU, and in use is the sum of its size choices (at most one).
        model.add_at_most_one(classes.values())
        in_use = sum(classes.values())
        used.extend(classes.values())
        in_use_of[g.id] = in_use
    # Symmetry: GPUs of one model on one host are interchangeable, so some optimum uses them in
    # id order; without this CP-SAT rarely proves optimality beyond a handful of GPUs.
    alike: dict[tuple, list[int]] = {}
    for g in gpus:
        if g.id in in_use_of:
            alike.setdefault((g.host_id, g.model.name), []).append(g.id)
    for ids in alike.values():
        ids.sort()
        for first, second in zip(ids, ids[1:], strict=False):
            model.add(in_use_of[first] >= in_use_of[second])
    if size_cuts:
        demand = Counter((p.gpu_model, p.fb_mib) for profiles in wanted.values() for p in profiles)
        for key, variables in size_vars.items():
            model.add(sum(variables) >= -(-demand[key] // caps[key]))
    static_vcpus, static_ram = Counter(), Counter()
    for vm in snapshot.vms.values():
        if not vm.vgpus and not wanted[vm.id] and vm.host_id is not None:
            static_vcpus[vm.host_id] += vm.vcpus
            static_ram[vm.host_id] += vm.ram_gib
    for h, host in snapshot.hosts.items():
        if host_vcpus[h]:
            model.add(sum(host_vcpus[h]) + static_vcpus[h] <= host.vcpu_capacity)
            model.add(sum(host_ram[h]) + static_ram[h] <= host.ram_capacity_gib)
    model.minimize(sum(used))
    solver = cp_model.CpSolver()
    solver.parameters.max_time_in_seconds = time_limit_s
    solver.parameters.num_workers = workers
    # CP-SAT's presolve rewrites this objective through the VMs' exactly-one host choices, after
    # which its linear relaxation no longer sees the per-size bounds (9.15: bound 12 instead of
    # 29 on bench/placement.py --quick); without it the same model is proven optimal at once.
    solver.parameters.cp_model_presolve = False
    status = solver.solve(model)
    if status not in (cp_model.OPTIMAL, cp_model.FEASIBLE):
        raise ValueError(f"CP-SAT found no layout ({solver.status_name(status)})")
    layout = {vm_id: sorted(g for g, n in pairs for _ in range(solver.value(n))) for vm_id, pairs in counts_of.items()}
    return Optimum(gpus=round(solver.objective_value), proven=status == cp_model.OPTIMAL, seconds=solver.wall_time,
                   layout=layout)
