"""Benchmark: the article's jitter, by mechanism - which kinds of noise make step time spread
grow with the GPU count, and which of them AMP (the fp16 hook) smooths.

Mechanisms (each alone; `mix` all together), on top of a 10GbE scale model (time-dilated,
compute replayed):

    light     2% lognormal step-to-step noise only (the old scale model)
    stalls    rare heavy-tailed stalls: p = 1% per rank and step, Pareto from 50 ms
    gpu       fixed per-GPU speed (Sinha et al. SC'22: ~8%, up to 22%, 2% 1.5x outliers)
    episode   one node 30% slower for a quarter of the steps
    mix       all of the above

Parts:

    model     the noise generator alone (no network, no ranks: seconds): per mechanism and
              GPU count, median / p99 / sd of the slowest rank's compute and the slow share;
              the theory the end-to-end runs are held to
    run       end to end: per mechanism, GPU counts x modes (fp32, amp-fp16) through the
              emulated network; writes OUT/MECHANISM.json (a results document) and
              OUT/MECHANISM.png (sd and median vs GPUs, report.plots.plot_jitter_by_gpus);
              prints beside each run the generator's own prediction for the same draws (the
              slowest rank's compute, no network): what the run should show if the network
              and the host add nothing
    neighbour  a neighbour job on oversubscribed uplinks at 2, 4, 8, 16 GPUs, fp32 and
              amp-fp16 (scenarios/scale/racks-neighbour-light.toml; racks-neighbour.toml
              with --heavy): the network and the neighbour stay (2 racks, 2:1 uplinks, the
              neighbour's bytes per uplink and step), the job grows (2 x 1, 4 x 1, 4 x 2,
              4 x 4); at 2 nodes each rack's one node sends both of its rack's neighbour
              flows. Writes OUT/neighbour.json and OUT/neighbour.png (8-12 minutes a
              GPU count); with --mix, the realistic mix: the neighbour and every compute
              mechanism at once (the scaled preset's `mix`, stalls from 5 ms against 40 ms
              of compute), OUT/neighbour-mix.json and .png; with --racks R, the job grown by
              racks instead: R racks of 2 nodes at --ranks per node (1 2), each uplink
              meeting the same neighbour (OUT/neighbour-Rracks.json and .png)
    attribution  two 2-GPU runs, one with stalls only (p = 5%), one with light noise and
              link flaps only ([[link.schedule]] down 100 ms, four times): the tail table
              must name 'stall' for the first and 'network' for the second
    table     print the end-to-end documents found in OUT: median / p99 / sd / slow share,
              and the tail's causes (measure.attribution)

`run --preset`:

    small     2 and 16 GPUs, fp32 only, near-fixed 50 ms stalls at p = 1% only, a small generic
              model at x20 (minutes): the stalls' growth with N, end to end
    scaled    every mechanism, 2, 4, 8, 16 GPUs, fp32 and amp-fp16: ResNet-50 on 10GbE at a
              tenth of its time scale - a tenth of its bytes (2.56M parameters in 2.5 MiB
              buckets: 10.2 MB in four, as ResNet-50's 102 MB fill four of 25 MiB) and of its
              compute (37.5 / 23.4 ms), stalls of a tenth the size (Pareto from 5 ms), at x20
              (x40 at 16 GPUs, whose probe reached only 92% at x20 on this 2-core host);
              the network's latency (none on these links) and TCP's clocks are not scaled
              (about an hour on a 2-core host)
    resnet50  the same at full scale, ResNet-50 replayed at x40 (`--full`; hours)

Run them under the heavy-work lock:

    .venv/bin/python bench/jitter_mechanisms.py model
    flock /tmp/nsd-heavy.lock .venv/bin/python bench/jitter_mechanisms.py run --preset scaled \
        --out /tmp/jit
    flock /tmp/nsd-heavy.lock .venv/bin/python bench/jitter_mechanisms.py neighbour \
        --iterations 120 --out /tmp/jit
    .venv/bin/python bench/jitter_mechanisms.py table --out /tmp/jit
"""

from __future__ import annotations

import argparse
import statistics
import time
from pathlib import Path
from typing import Any

from rich.console import Console
from rich.table import Table

from netsim_ddp import Scenario
from netsim_ddp.common.tails import percentile, slow_share
from netsim_ddp.measure.document import ResultsDocument, load_document, save
from netsim_ddp.report.plots import plot_jitter_by_gpus
from netsim_ddp.run.runner import run_scenario
from netsim_ddp.scenario.compute_noise import ComputeNoise
from netsim_ddp.verdicts.scenario_report import results_document
from netsim_ddp.workload.contract.noise_draws import NoiseModel

console = Console(width=140)
TOPOLOGIES = {2: (2, 1), 4: (4, 1), 8: (4, 2), 16: (4, 4)}  # GPUs: (nodes, ranks per node)
STALLS = {"probability": 0.01, "distribution": "pareto", "scale": "50ms", "shape": 1.5,
          "max": "2s"}
GPU = {"spread": 0.08, "max": 0.22, "outlier_probability": 0.02, "outlier_slowdown": 0.5}


def mechanisms(steps: int, stalls: dict[str, Any] = STALLS) -> dict[str, dict[str, Any]]:
    """Each mechanism as a [workload.noise] table."""
    episode = [{"at": steps // 2, "steps": max(steps // 4, 1), "node": 1, "slowdown": 0.3}]
    return {
        "light": {"spread": 0.02},
        "stalls": {"spread": 0.0, "stalls": stalls},
        "gpu": {"spread": 0.0, "gpu_speed": GPU},
        "episode": {"spread": 0.0, "episode": episode},
        "mix": {"spread": 0.02, "stalls": stalls, "gpu_speed": GPU, "episode": episode},
    }


# The presets' workloads and dilations (module docstring).
PRESETS: dict[str, tuple[dict[str, Any], int]] = {
    # a 4 MB model whose all-reduce is short against 50 ms of compute; x20, at which 16
    # ranks' probe is trusted on this 2-core host under load (x10 was refused)
    "small": ({"layout": "generic", "params": "1M", "compute": "50ms",
               "modes": ["fp32"]}, 20),
    "scaled": ({"layout": "generic", "params": "2.56M", "bucket_size": "2.5MiB",
                "compute": "37.5ms", "compute_amp": "23.4ms",
                "modes": ["fp32", "amp-fp16"]}, 20),
    "resnet50": ({"layout": "resnet50", "compute": "375ms", "compute_amp": "234ms",
                  "modes": ["fp32", "amp-fp16"]}, 40),
}
SCALED_STALLS = {**STALLS, "scale": "5ms", "max": "200ms"}  # a tenth of STALLS' time scale


def part_model(steps: int = 4000, compute_s: float = 0.375) -> None:
    """The generator alone: the slowest rank's compute per step, no network."""
    table = Table(title=f"noise generator alone: slowest of N ranks, {compute_s * 1e3:.0f} ms "
                        f"compute, {steps} steps (no network; a model, not a measurement)",
                  title_justify="left")
    for column in ("mechanism", "GPUs", "median ms", "p99 ms", "sd ms", "slow", "sd / sd@2"):
        table.add_column(column, justify="right")
    for name, noise in mechanisms(steps).items():
        model = NoiseModel(ComputeNoise.model_validate(noise))
        base_sd = None
        for gpus, (_, per_node) in TOPOLOGIES.items():
            series = [max(model.compute_s(compute_s, rank, rank // per_node, step)
                          for rank in range(gpus)) for step in range(steps)]
            sd = statistics.stdev(series)
            base_sd = sd if base_sd is None else base_sd
            table.add_row(name, str(gpus), f"{statistics.median(series) * 1e3:.1f}",
                          f"{percentile(series, 99) * 1e3:.1f}", f"{sd * 1e3:.1f}",
                          f"{slow_share(series):.1%}", f"{sd / base_sd:.2f}" if base_sd else "-")
    console.print(table)


def _scenario(mechanism: str, noise: dict[str, Any], gpus: int, *, preset: str,
              iterations: int) -> Scenario:
    nodes, per_node = TOPOLOGIES[gpus]
    workload, dilation = PRESETS[preset]
    if preset == "scaled" and gpus == 16:  # 16 ranks' probe reached 92% at x20 here: too close
        dilation *= 2
    return Scenario.from_dict({
        "name": f"jitter-{mechanism}-{gpus}gpu",
        "description": f"{mechanism} noise, {gpus} GPUs on 10GbE (bench/jitter_mechanisms.py "
                       f"{preset})",
        "topology": {"nodes": nodes, "ranks_per_node": per_node},
        "link": {"rate": "10gbit"}, "emulation": {"dilation": dilation},
        "workload": {**workload, "iterations": iterations, "warmup": 2,
                     "noise": {**noise, "seed": 1}}})


def predicted_sd(scenario: Scenario) -> float:
    """The sd of the slowest rank's compute over the run's measured steps, drawn by the
    generator alone (no network, no host): the run's noise-only floor."""
    workload = scenario.workload
    assert workload is not None and workload.compute is not None
    model = NoiseModel(workload.noise)
    per_node = scenario.topology.ranks_per_node
    world = scenario.topology.nodes * per_node
    series = [max(model.compute_s(workload.compute, rank, rank // per_node,
                                  workload.warmup + step) for rank in range(world))
              for step in range(workload.iterations)]
    return statistics.stdev(series)


# The small run's stalls: near-fixed 50 ms (the theory's Bernoulli case, whose sd ratio 16 / 2
# GPUs is ~2.5 at p = 1%); a Pareto tail's sd over a few hundred steps rests on its few largest
# draws and says little about the ratio.
SMALL_STALLS = {"probability": 0.01, "distribution": "lognormal", "scale": "50ms", "shape": 0.1}


def part_run(out: Path, *, preset: str, iterations: int,
             only: list[str] | None = None) -> None:
    chosen = ({"stalls": {"spread": 0.0, "stalls": SMALL_STALLS}} if preset == "small" else
              mechanisms(iterations, SCALED_STALLS if preset == "scaled" else STALLS))
    chosen = {name: noise for name, noise in chosen.items() if not only or name in only}
    counts = [2, 16] if preset == "small" else list(TOPOLOGIES)
    for mechanism, noise in chosen.items():
        scenarios = [_scenario(mechanism, noise, gpus, preset=preset, iterations=iterations)
                     for gpus in counts]
        _run_and_plot(out, mechanism, scenarios,
                      f"{mechanism}: spread and pace per iteration vs GPUs (10GbE)")


def _run_and_plot(out: Path, name: str, scenarios: list[Scenario], title: str) -> None:
    """Run each scenario (one line each: status, host time, the generator's predicted sd),
    then save OUT/NAME.json and plot OUT/NAME.png."""
    reports = []
    for scenario in scenarios:
        started = time.monotonic()
        report = run_scenario(scenario, out_dir=out / "runs", progress=console.print)
        console.print(f"{scenario.name}: {report.status} in "
                      f"{time.monotonic() - started:.0f} s "
                      f"{report.refused or report.error or ''}; the generator alone "
                      f"predicts fp32 sd {predicted_sd(scenario) * 1e3:.1f} ms")
        reports.append(report)
    document = results_document(reports)
    save(document, out / f"{name}.json")
    plot_jitter_by_gpus(document.scenarios, out / f"{name}.png", title)


NEIGHBOUR = Path(__file__).resolve().parents[1] / "scenarios" / "scale"


def _neighbour_file(iterations: int, heavy: bool) -> tuple[Scenario, dict[str, Any]]:
    """The shipped neighbour file (the heavier one with `heavy`) and its data to grow: its
    measured iterations set, its claim dropped (it is for the file's own job)."""
    base = Scenario.load(NEIGHBOUR / ("racks-neighbour.toml" if heavy
                                      else "racks-neighbour-light.toml"))
    data = base.model_dump(mode="json", exclude_none=True)
    data["workload"]["iterations"] = iterations
    data.pop("expect", None)
    return base, data


def neighbour_scenario(gpus: int, iterations: int, *, heavy: bool = False,
                       mix: bool = False) -> Scenario:
    """The neighbour file with the job grown to GPUS (TOPOLOGIES), the network and the
    neighbour's load on each uplink kept: at 2 nodes the two nodes of a rack become one, which
    sends both of its rack's neighbour flows. `mix`: every compute mechanism too."""
    base, data = _neighbour_file(iterations, heavy)
    nodes, per_node = TOPOLOGIES[gpus]
    old_racks = base.topology.node_racks
    if nodes != base.topology.nodes:  # one node per rack: each flow from and to its rack's node
        for flow in data["background"]:
            for end in ("source", "destination"):
                flow[end] = f"n{old_racks[int(flow[end][1:])]}"
    data["topology"].update(nodes=nodes, ranks_per_node=per_node)
    data["name"] = f"{base.name}{'-mix' if mix else ''}-{gpus}gpu"
    if mix:
        data["workload"]["noise"] = {**mechanisms(iterations, SCALED_STALLS)["mix"], "seed": 1}
    return Scenario.from_dict(data, base.path)


def neighbour_by_racks(racks: int, ranks_per_node: int, iterations: int, *,
                       heavy: bool = False) -> Scenario:
    """The neighbour file's racks of 2 nodes, grown to RACKS racks (`--racks`): each rack's
    uplink meets the same neighbour (two of its bursts out and two in per step: rack i's
    first node sends to rack i+1's second, its second to rack i-1's first, staggered by a
    quarter step as the file's are; at 2 racks exactly the file's four flows) and carries the
    ring's one crossing each way, as at 2 racks. What grows is the number of uplinks a step
    waits on."""
    base, data = _neighbour_file(iterations, heavy)
    template = data["background"][0]
    flows = []
    for rack in range(racks):
        first, second = 2 * rack, 2 * rack + 1
        offset = 50 * (rack % 2)
        flows.append({**template, "source": f"n{first}",
                      "destination": f"n{2 * ((rack + 1) % racks) + 1}", "start": f"{offset}ms"})
        flows.append({**template, "source": f"n{second}",
                      "destination": f"n{2 * ((rack - 1) % racks)}",
                      "start": f"{offset + 25}ms"})
    data["background"] = flows
    data["topology"].update(nodes=2 * racks, racks=racks, ranks_per_node=ranks_per_node)
    data["name"] = f"{base.name}-{racks}racks-{2 * racks * ranks_per_node}gpu"
    return Scenario.from_dict(data, base.path)


def part_neighbour(out: Path, iterations: int, *, heavy: bool, mix: bool,
                   racks: int | None = None, ranks: tuple[int, ...] = (1, 2)) -> None:
    if racks is not None:  # grown by racks: 2 nodes each
        scenarios = [neighbour_by_racks(racks, per_node, iterations, heavy=heavy)
                     for per_node in ranks]
        _run_and_plot(out, f"neighbour-{racks}racks", scenarios,
                      f"a neighbour job on 2:1 uplinks, {racks} racks: spread and pace per "
                      "iteration vs GPUs")
        return
    scenarios = [neighbour_scenario(gpus, iterations, heavy=heavy, mix=mix)
                 for gpus in TOPOLOGIES]
    _run_and_plot(out, "neighbour-mix" if mix else "neighbour", scenarios,
                  "a neighbour job on 2:1 uplinks" + (" and every compute mechanism" if mix
                                                      else "")
                  + ": spread and pace per iteration vs GPUs")


def part_attribution(out: Path, iterations: int) -> None:
    stalls = _scenario("stalls-only", {"spread": 0.0, "stalls": {**STALLS, "probability": 0.05}},
                       2, preset="small", iterations=iterations)
    flaps = Scenario.from_dict({
        **_scenario("flaps-only", {"spread": 0.02}, 2, preset="small",
                    iterations=iterations).model_dump(mode="json", exclude_none=True),
        "link": {"rate": "10gbit", "schedule": [
            {"at": f"{at}s", "down": "100ms"} for at in (0.5, 1.3, 2.1, 2.9)]}})
    reports = [run_scenario(s, out_dir=out / "runs", progress=console.print)
               for s in (stalls, flaps)]
    save(results_document(reports), out / "attribution.json")


def _table(name: str, document: ResultsDocument) -> Table:
    notices = {s.emulation.notice for s in document.scenarios if s.emulation}
    table = Table(title=f"{name}, end to end; " + "; ".join(sorted(notices)),
                  title_justify="left")
    for column in ("scenario", "mode", "GPUs", "median ms", "p99 ms", "sd ms", "cv", "slow",
                   "causes of the tail"):
        table.add_column(column, justify="right")
    for record in document.scenarios:
        for mode, m in record.modes.items():
            s = m.summary.iteration_s
            causes = (", ".join(f"{c.cause} {c.share:.0%} ({c.iterations})"
                                for c in m.attribution.shares)
                      if m.attribution else "-")
            table.add_row(record.name, mode, str(m.world_size), f"{s.median * 1e3:.1f}",
                          f"{s.p99 * 1e3:.1f}", f"{s.std * 1e3:.1f}", f"{s.cv:.1%}",
                          f"{s.slow_share:.0%}", causes or "-")
    return table


def part_table(out: Path) -> None:
    for path in sorted(out.glob("*.json")):
        console.print(_table(path.stem, load_document(path)))


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__,
                                     formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("part", choices=["model", "run", "neighbour", "attribution", "table"])
    parser.add_argument("--out", type=Path)
    parser.add_argument("--preset", choices=list(PRESETS), default="small",
                        help="what `run` runs (the module's docstring)")
    parser.add_argument("--full", action="store_true", help="--preset resnet50 (hours here)")
    parser.add_argument("--mechanisms", nargs="+", default=None,
                        help="run only these (light, stalls, gpu, episode, mix)")
    parser.add_argument("--heavy", action="store_true",
                        help="neighbour: the 20 MB neighbour (racks-neighbour.toml)")
    parser.add_argument("--mix", action="store_true",
                        help="neighbour: with every compute mechanism too (the realistic mix)")
    parser.add_argument("--racks", type=int, default=None,
                        help="neighbour: grow the job by racks instead (RACKS racks of 2 nodes, "
                             "--ranks per node; not with --mix)")
    parser.add_argument("--ranks", type=int, nargs="+", default=[1, 2],
                        help="neighbour --racks: the ranks per node to run (default 1 2)")
    parser.add_argument("--iterations", type=int, default=60)
    args = parser.parse_args()
    if args.part == "model":
        part_model()
        return
    if args.out is None:
        parser.error(f"{args.part} needs --out")
    args.out.mkdir(parents=True, exist_ok=True)
    if args.part == "run":
        part_run(args.out, preset="resnet50" if args.full else args.preset,
                 iterations=args.iterations, only=args.mechanisms)
    if args.part == "neighbour":
        if args.racks is not None and (args.mix or args.racks < 2):
            parser.error("--racks needs 2 or more racks, and not --mix")
        part_neighbour(args.out, args.iterations, heavy=args.heavy, mix=args.mix,
                       racks=args.racks, ranks=tuple(args.ranks))
    if args.part == "attribution":
        part_attribution(args.out, args.iterations)
    part_table(args.out)


if __name__ == "__main__":
    main()
