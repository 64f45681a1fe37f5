"""Benchmark: where a replayed rank's memory and the host's CPU go, and how they grow with ranks.

Parts:

    parts     one node's agent and its forked ranks, on loopback (no namespaces), stage by
              stage: resident (RSS) and proportional (PSS) set size from /proc/PID/
              smaps_rollup after the interpreter, `import torch`, what the agent imports before
              it forks (torch._dynamo, the rank module), the process group (gloo), the replay
              model in DDP (its buckets), after steps (gloo's buffers, a hook's copies) and
              after a full gc.collect() (which copies the agent's Python heap into each rank
              unless the agent froze it before forking, as workload/agent.py does;
              RANK_COSTS_NO_FREEZE=1 measures without)
    scaling   the 10GbE ResNet-50 scale model (scenarios/scale/10gbe-32gpu.toml, its k) at 8 and 16
              ranks (2 and 4 nodes x 4, 2 iterations) and as shipped (32 ranks, 8 x 4, 5
              iterations; its results document is OUT/scaling-runs.json): peak RSS and PSS per rank
              and per agent sampled from /proc during the run, the CPU the run took (every
              process, getrusage), and host CPU seconds per target second of training; each
              figure beside its ratio to the smallest point
    table     print what the parts wrote to OUT

    .venv/bin/python bench/rank_costs.py parts --out /tmp/costs [--layout resnet50 --ranks 4]
    flock /tmp/nsd-heavy.lock .venv/bin/python bench/rank_costs.py scaling --out /tmp/costs

`scenario/rank_costs.py` holds the per-rank figures `limits` and `plan --machine` use; this
bench is how they were measured (docs/scale-model.md, "What a rank costs").
"""

from __future__ import annotations

import argparse
import json
import os
import resource
import sys
import threading
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
MiB = 2**20
SCALING_POINTS = (8, 2, 4)  # nodes of 4 ranks: 32 (the shipped run, first), 8, 16 ranks


def smaps(pid: int | str = "self") -> dict[str, int]:
    """Rss, Pss, Pss_Anon, Pss_File, Shared_Clean ... of a process, in bytes."""
    fields = {}
    for line in Path(f"/proc/{pid}/smaps_rollup").read_text().splitlines()[1:]:
        name, value, *_ = line.split()
        fields[name.rstrip(":")] = int(value) * 1024
    return fields


# --- parts: stage by stage --------------------------------------------------------------


def _rank(rank: int, world: int, port: int, layout: str, mode: str, steps: int,
          report) -> None:  # type: ignore[no-untyped-def]
    import torch.distributed as dist

    from netsim_ddp.precision.hooks import SentBytes
    from netsim_ddp.precision.modes import get_mode
    from netsim_ddp.scenario.workload import WorkloadConfig
    from netsim_ddp.workload.ranks.rank import _replayed_trainer
    from netsim_ddp.workload.ranks.timing import BucketTimer

    def stage(name: str) -> None:
        dist.barrier() if dist.is_initialized() else None
        report.put((rank, name, smaps()))
        dist.barrier() if dist.is_initialized() else None

    stage("forked")
    os.environ.update(MASTER_ADDR="127.0.0.1", MASTER_PORT=str(port))
    dist.init_process_group("gloo", rank=rank, world_size=world)
    stage("process group")
    config = WorkloadConfig.model_validate({"layout": layout, "compute": "10ms",
                                            "modes": [mode]})
    trainer, batches, _ = _replayed_trainer(config, get_mode(mode), 1.0, SentBytes(),
                                            BucketTimer(torch_device()))
    stage("DDP (buckets)")
    trainer.begin_iteration(0)
    trainer.step(batches[:1], sync=True)
    stage("1 step")
    for index in range(1, steps):
        trainer.begin_iteration(index)
        trainer.step(batches[:1], sync=True)
    stage(f"{steps} steps")
    import gc

    gc.collect()  # a full collection touches every tracked object: copy-on-write unless frozen
    stage("gc.collect()")
    dist.destroy_process_group()


def torch_device():  # type: ignore[no-untyped-def]
    import torch

    return torch.device("cpu")


def part_parts(out: Path, layout: str, ranks: int, mode: str, steps: int) -> dict:
    """Run in a fresh interpreter (this file, `_parts`), so its first stage is a bare one."""
    import subprocess

    result = subprocess.run([sys.executable, "-P", __file__, "_parts", "--out", str(out),
                             "--layout", layout, "--ranks", str(ranks), "--mode", mode,
                             "--steps", str(steps)], check=True, capture_output=True, text=True,
                            env={**os.environ, "OMP_NUM_THREADS": "1",
                                 "PYTHONPATH": str(ROOT)})
    if result.stderr.strip():
        print(result.stderr[-2000:], file=sys.stderr)
    return json.loads((out / f"parts-{layout}-{mode}.json").read_text())


def _parts_child(out: Path, layout: str, ranks: int, mode: str, steps: int) -> None:
    import multiprocessing
    import socket

    agent = [("interpreter", smaps())]
    import torch  # noqa: F401

    agent.append(("import torch", smaps()))
    import torch._dynamo  # noqa: F401  (what workload/agent.py imports before it forks)

    from netsim_ddp.workload import rank, script_rank  # noqa: F401

    agent.append(("agent imports", smaps()))
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        port = sock.getsockname()[1]
    if not os.environ.get("RANK_COSTS_NO_FREEZE"):  # what the agent does (workload/agent.py)
        import gc

        gc.freeze()
    context = multiprocessing.get_context("fork")
    queue = context.Queue()
    children = [context.Process(target=_rank, args=(r, ranks, port, layout, mode, steps, queue))
                for r in range(ranks)]
    for child in children:
        child.start()
    stages: dict[str, list[dict[str, int]]] = {}
    agent_during: dict[str, int] = {}
    expected = 6 * ranks
    for _ in range(expected):
        r, name, fields = queue.get(timeout=600)
        stages.setdefault(name, []).append(fields)
        if len(stages[name]) == ranks:
            agent_during = smaps()
    for child in children:
        child.join(timeout=120)
        if child.exitcode != 0:
            raise SystemExit(f"rank exited with {child.exitcode}")
    from netsim_ddp.scenario.layouts import named_layout

    params = named_layout(layout).params
    document = {"layout": layout, "params": params, "ranks": ranks, "mode": mode,
                "steps": steps, "agent": [{"stage": s, **f} for s, f in agent],
                "agent_after_fork": agent_during,
                "rank": [{"stage": name, **{key: max(f[key] for f in values)
                                            for key in values[0]}}
                         for name, values in stages.items()]}
    (out / f"parts-{layout}-{mode}.json").write_text(json.dumps(document, indent=1))


def table_parts(doc: dict) -> None:
    print(f"\n{doc['layout']} ({doc['params']:,} parameters, {4 * doc['params'] / MiB:.0f} MiB "
          f"fp32), {doc['ranks']} forked ranks, mode {doc['mode']}; MiB (largest rank)")
    print(f"{'process':8} {'stage':16} {'RSS':>8} {'PSS':>8} {'PSS anon':>9} {'PSS file':>9} "
          f"{'d RSS':>8} {'d PSS':>8}")
    for who, rows in (("agent", doc["agent"]), ("rank", doc["rank"])):
        last = None
        for row in rows:
            d_rss = "" if last is None else f"{(row['Rss'] - last['Rss']) / MiB:+8.1f}"
            d_pss = "" if last is None else f"{(row['Pss'] - last['Pss']) / MiB:+8.1f}"
            print(f"{who:8} {row['stage']:16} {row['Rss'] / MiB:8.1f} {row['Pss'] / MiB:8.1f} "
                  f"{row['Pss_Anon'] / MiB:9.1f} {row['Pss_File'] / MiB:9.1f} {d_rss:>8} "
                  f"{d_pss:>8}")
            last = row
    after = doc["agent_after_fork"]
    print(f"agent    after fork       {after['Rss'] / MiB:8.1f} {after['Pss'] / MiB:8.1f}")


# --- scaling: the scale model at growing rank counts ------------------------------------


class Sampler(threading.Thread):
    """Peak RSS and PSS of every agent (workload/agent.py) and its forked ranks, sampled."""

    def __init__(self, period_s: float = 0.5):
        super().__init__(daemon=True)
        self.period_s = period_s
        self.peak: dict[int, dict[str, int | str]] = {}
        self.stop = threading.Event()

    def run(self) -> None:
        while not self.stop.wait(self.period_s):
            self.sample()

    def sample(self) -> None:
        parents = {}
        for entry in Path("/proc").iterdir():
            if entry.name.isdigit():
                try:
                    stat = (entry / "stat").read_text()
                except OSError:
                    continue
                parents[int(entry.name)] = int(stat.rsplit(")", 1)[1].split()[1])
        ours = {os.getpid()}  # this run's processes only (other work runs agents too)
        grew = True
        while grew:
            found = {pid for pid, ppid in parents.items() if ppid in ours} - ours
            grew = bool(found)
            ours |= found
        agents = {}
        for pid in ours - {os.getpid()}:
            try:
                cmdline = Path(f"/proc/{pid}/cmdline").read_bytes()
                if b"netsim_ddp.workload.ranks.forking_torchrun" in cmdline:
                    agents[pid] = parents[pid]
            except OSError:
                continue
        for pid, ppid in agents.items():
            role = "rank" if ppid in agents else "agent"
            try:
                fields = smaps(pid)
            except OSError:
                continue
            peak = self.peak.setdefault(pid, {"role": role, "Rss": 0, "Pss": 0})
            peak["Rss"] = max(int(peak["Rss"]), fields["Rss"])
            peak["Pss"] = max(int(peak["Pss"]), fields["Pss"])


def _cpu_s() -> float:
    total = 0.0
    for who in (resource.RUSAGE_SELF, resource.RUSAGE_CHILDREN):
        usage = resource.getrusage(who)
        total += usage.ru_utime + usage.ru_stime
    return total


def part_scaling(out: Path, points_nodes: tuple[int, ...] = SCALING_POINTS) -> list[dict]:
    import statistics

    from netsim_ddp import Scenario
    from netsim_ddp.measure.document import save
    from netsim_ddp.run.runner import run_scenario
    from netsim_ddp.verdicts.scenario_report import results_document

    base = Scenario.load(ROOT / "scenarios" / "scale" / "10gbe-32gpu.toml")
    points, reports = [], []
    for nodes in points_nodes:
        scenario = base
        if nodes != base.topology.nodes:  # the smaller points: 2 iterations, for time
            data = base.model_dump(mode="json", exclude_none=True)
            data["name"] = f"10gbe-{nodes * 4}gpu"
            data["topology"]["nodes"] = nodes
            data["workload"].update(iterations=2)
            scenario = Scenario.from_dict(data, base.path)
        sampler = Sampler()
        cpu0, wall0 = _cpu_s(), time.monotonic()
        sampler.start()
        report = run_scenario(scenario, out_dir=out / "runs", progress=print)
        sampler.stop.set()
        sampler.join()
        cpu, wall = _cpu_s() - cpu0, time.monotonic() - wall0
        ranks = [p for p in sampler.peak.values() if p["role"] == "rank"]
        agents = [p for p in sampler.peak.values() if p["role"] == "agent"]
        trained = sent_bits = 0.0
        (record,) = results_document([report]).scenarios
        for mode in record.modes.values():
            steps = len(mode.iteration_s) + scenario.workload.warmup
            trained += steps * statistics.median(mode.iteration_s)
            # A ring all-reduce: each of N ranks sends 2(N-1)/N of the gradient bytes.
            sent_bits += steps * 8 * mode.hook_bytes_per_iteration * 2 * (mode.world_size - 1)
        points.append({
            "ranks": nodes * 4, "nodes": nodes, "status": report.status,
            "rank_rss": max(int(p["Rss"]) for p in ranks) if ranks else None,
            "rank_pss": statistics.median(int(p["Pss"]) for p in ranks) if ranks else None,
            "agent_pss": statistics.median(int(p["Pss"]) for p in agents) if agents else None,
            "total_pss": sum(int(p["Pss"]) for p in sampler.peak.values()),
            "cpu_s": cpu, "wall_s": wall, "target_s": trained, "sent_bits": sent_bits,
            "dilation": scenario.emulation.dilation if scenario.emulation else 1,
        })
        print(json.dumps(points[-1]))
        for check in report.checks:
            if not check.passed:
                print(f"{scenario.name}: FAILED {check.name}: {check.detail}")
        if report.refused or report.error:
            print(f"{scenario.name}: {report.refused or report.error}")
        reports.append(report)
        save(results_document(reports), out / "scaling-runs.json")
        (out / "scaling.json").write_text(json.dumps(points, indent=1))

    return points


def table_scaling(points: list[dict]) -> None:
    points = sorted(points, key=lambda point: point["ranks"])
    first = points[0]
    print("\nscale model 10GbE ResNet-50 replayed, fp32, x4 ranks per node: peak per process "
          "(sampled) and the whole run's CPU (ratio to the first point in brackets)")
    columns = ("ranks", "status", "rank RSS MiB", "rank PSS MiB", "agent PSS MiB",
               "all PSS GiB", "CPU s", "wall s", "target s", "CPU s / target s")

    def cell(point: dict, key: str, scale: float = 1.0) -> str:
        value, base = point.get(key), first.get(key)
        if value is None:
            return "-"
        ratio = f" ({value / base:.2f})" if base else ""
        return f"{value / scale:.1f}{ratio}"

    print(" | ".join(columns))
    for point in points:
        per_target = point["cpu_s"] / point["target_s"] if point["target_s"] else None
        base = first["cpu_s"] / first["target_s"] if first["target_s"] else None
        print(" | ".join([
            str(point["ranks"]), point["status"], cell(point, "rank_rss", MiB),
            cell(point, "rank_pss", MiB), cell(point, "agent_pss", MiB),
            cell(point, "total_pss", 2**30), cell(point, "cpu_s"), cell(point, "wall_s"),
            f"{point['target_s']:.2f}",
            "-" if per_target is None else f"{per_target:.0f}"
            + (f" ({per_target / base:.2f})" if base else "")]))


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__,
                                     formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("part", choices=["parts", "scaling", "table", "_parts"])
    parser.add_argument("--out", type=Path, required=True)
    parser.add_argument("--layout", default="resnet50")
    parser.add_argument("--ranks", type=int, default=4)
    parser.add_argument("--mode", default="fp32")
    parser.add_argument("--steps", type=int, default=3)
    parser.add_argument("--nodes", type=int, nargs="+", default=list(SCALING_POINTS),
                        help="scaling: the points, in nodes of 4 ranks (default 8 2 4)")
    args = parser.parse_args()
    args.out.mkdir(parents=True, exist_ok=True)
    if args.part == "_parts":
        _parts_child(args.out, args.layout, args.ranks, args.mode, args.steps)
        return
    if args.part == "parts":
        part_parts(args.out, args.layout, args.ranks, args.mode, args.steps)
    elif args.part == "scaling":
        part_scaling(args.out, tuple(args.nodes))
    for path in sorted(args.out.glob("parts-*.json")):
        table_parts(json.loads(path.read_text()))
    if (args.out / "scaling.json").exists():
        table_scaling(json.loads((args.out / "scaling.json").read_text()))


if __name__ == "__main__":
    main()
