"""Benchmark: the scale model (time dilation + compute replay) against what it must show.

Parts (each trains; run it under the heavy-work lock; each writes OUT/PART.json, a results
document, and `table` prints every part found in OUT side by side):

    invariance  scenarios/10gbe.toml at k = 20 and k = 40: target-time iteration, exposed comm
                and collective medians must agree within 5% (p95 and max shown beside)
    loss        scenarios/10gbe.toml with loss = "0.5%" (fp32) at k = 40 and 80, with the TCP
                clocks dilated, and as before they were ("today": the kernel's undilated 200 ms
                RTO, i.e. rto_min = 200 ms / k, and the host's bbr): p95 and max iteration
                time within 10%, and the kernel's retransmissions and timeouts per run
    replay      scenarios/default.toml with its real CPU compute, then the same scenario
                replaying that compute (a profile measured on this host by
                `netsim-ddp profile-compute`): iteration and exposed comm within 10%
    published   the RTX 3090 / 10GbE / ResNet-50 measurement (234 ms compute + 106 ms NCCL,
                efficiency ~69%) at 3 and 4 nodes (scenarios/scale/rtx3090-10gbe-*.toml)
    scale16     16 GPUs (4 x 4) on 10GbE (x40) and 25GbE (x100), fp32 / amp / amp-fp16
    jitter      2, 4, 8, 16 GPUs on 10GbE (x40), fp32 vs amp-fp16, seeded compute noise:
                the per-iteration spread of collective and iteration time; writes
                docs/scale-jitter.png
    table       print every part found in OUT

    flock /tmp/nsd-heavy.lock .venv/bin/python bench/scale_model.py invariance --out /tmp/scale
    .venv/bin/python bench/scale_model.py table --out /tmp/scale
"""

from __future__ import annotations

import argparse
import json
import statistics
import subprocess
import sys
import time
from pathlib import Path

from rich.console import Console
from rich.table import Table

from netsim_ddp import Scenario
from netsim_ddp.measure.document import ResultsDocument, ScenarioRecord, load_document, save
from netsim_ddp.report.plots import plot_jitter_by_gpus
from netsim_ddp.run.runner import run_scenario
from netsim_ddp.verdicts.scenario_report import ScenarioReport, results_document
from netsim_ddp.workload.contract.compute_profile import read_profile

ROOT = Path(__file__).resolve().parent.parent
SCENARIOS = ROOT / "scenarios"
PUBLISHED_COMPUTE_S = 0.234
PUBLISHED_COMM_S = 0.106
PUBLISHED_EFFICIENCY = 0.69
INVARIANCE_TOLERANCE = 0.05
INVARIANCE_K = (20, 40)
LOSS_K = (40, 80)
LOSS_TOLERANCE = 0.10
REPLAY_TOLERANCE = 0.10
JITTER_TOPOLOGIES = [(2, 1), (4, 1), (4, 2), (4, 4)]  # (nodes, ranks per node): 2..16 GPUs
console = Console(width=140)


def _run(scenario: Scenario, out: Path, **options) -> ScenarioReport:
    started = time.monotonic()
    report = run_scenario(scenario, out_dir=out / "runs", progress=console.print, **options)
    console.print(f"{scenario.name}: {report.status} in {time.monotonic() - started:.0f} s"
                  + (f" ({report.refused or report.error})" if report.refused or report.error
                     else ""))
    return report


def _with(scenario: Scenario, **changes) -> Scenario:
    data = scenario.model_dump(mode="json", exclude_none=True)
    for dotted, value in changes.items():
        *parents, leaf = dotted.split(".")
        node = data
        for parent in parents:
            node = node.setdefault(parent, {})
        node[leaf] = value
    return Scenario.from_dict(data, scenario.path)


def part_invariance(out: Path) -> list[ScenarioReport]:
    base = Scenario.load(SCENARIOS / "10gbe.toml")
    return [_run(_with(base, name=f"10gbe-k{k}", **{"emulation.dilation": k,
                                                     "workload.iterations": 8}), out)
            for k in INVARIANCE_K]


def part_loss(out: Path) -> list[ScenarioReport]:
    base = _with(Scenario.load(SCENARIOS / "10gbe.toml"),
                 **{"link.loss": "0.5%", "workload.modes": ["fp32"], "workload.iterations": 10})
    reports = []
    for today in (False, True):
        for k in LOSS_K:
            tcp = {"rto_min": f"{0.2 / k!r}s", "congestion_control": "bbr"} if today else {}
            scenario = _with(base, name=f"10gbe-loss-k{k}" + ("-today" if today else ""),
                             **{"emulation.dilation": k, "link.tcp": tcp})
            # The probe's all-reduce meets the loss too: it is recorded, not a refusal here.
            reports.append(_run(scenario, out, allow_untrusted=True))
    return reports


def part_replay(out: Path) -> list[ScenarioReport]:
    default = SCENARIOS / "default.toml"
    profiles = {}
    for mode in ("fp32", "amp-fp16"):  # autocast's CPU compute differs: profile it too
        profiles[mode] = out / f"default-profile-{mode}.json"
        subprocess.run([sys.executable, "-m", "netsim_ddp.cli", "profile-compute", str(default),
                        "--out", str(profiles[mode]), "--mode", mode, "--steps", "12"],
                       check=True)
    amp = read_profile(profiles["amp-fp16"])
    base = _with(Scenario.load(default), **{"workload.iterations": 12,
                                            "workload.modes": ["fp32", "amp-fp16"]})
    real = _run(_with(base, name="default-real"), out)
    replayed = _run(_with(base, name="default-replay", **{
        "workload.profile": str(profiles["fp32"]),
        "workload.compute_amp": f"{amp.compute_s!r}s"}), out)
    return [real, replayed]


def part_published(out: Path) -> list[ScenarioReport]:
    return [_run(Scenario.load(SCENARIOS / "scale" / f"rtx3090-10gbe-{n}nodes.toml"), out)
            for n in (3, 4)]


def part_scale16(out: Path) -> list[ScenarioReport]:
    return [_run(Scenario.load(SCENARIOS / "scale" / f"{rate}-16gpu.toml"), out)
            for rate in ("10gbe", "25gbe")]


def part_jitter(out: Path) -> list[ScenarioReport]:
    base = Scenario.load(SCENARIOS / "scale" / "10gbe-16gpu.toml")
    reports = []
    for nodes, ranks in JITTER_TOPOLOGIES:
        scenario = _with(base, name=f"10gbe-{nodes * ranks}gpu",
                         **{"topology.nodes": nodes, "topology.ranks_per_node": ranks,
                            "workload.modes": ["fp32", "amp-fp16"],
                            "workload.iterations": 8})
        reports.append(_run(scenario, out))
    return reports


PARTS = {"invariance": part_invariance, "loss": part_loss, "replay": part_replay,
         "published": part_published, "scale16": part_scale16, "jitter": part_jitter}


def _median(record: ScenarioRecord, mode: str, series: str) -> float | None:
    values = getattr(record.modes[mode], series) if mode in record.modes else None
    return statistics.median(values) if values else None


def _stat(record: ScenarioRecord, mode: str, series: str, stat: str) -> float | None:
    """median, p95 or max of one series of one mode."""
    values = getattr(record.modes[mode], series) if mode in record.modes else None
    if not values:
        return None
    ordered = sorted(values)
    return {"median": statistics.median(ordered), "max": ordered[-1],
            "p95": ordered[min(len(ordered) - 1, round(0.95 * (len(ordered) - 1)))]}[stat]


def _tcp(record: ScenarioRecord, mode: str) -> str:
    from netsim_ddp.measure.tcp_evidence import totals

    summed = totals(record.modes[mode].tcp_counters) if mode in record.modes else {}
    return (f"retx {summed.get('RetransSegs', 0)} rto {summed.get('TCPTimeouts', 0)} "
            f"tlp {summed.get('TCPLossProbes', 0)}")


def _ms(value: float | None) -> str:
    return "-" if value is None else f"{value * 1e3:.1f}"


def _probe(record: ScenarioRecord) -> str:
    return f"{record.fidelity.fraction:.0%}" if record.fidelity else "-"


def table_invariance(doc: ResultsDocument) -> None:
    low, high = doc.scenarios
    k1, k2 = (record.emulation.dilation if record.emulation else 1 for record in (low, high))
    table = Table(title=f"dilation invariance: scenarios/10gbe.toml at k = {k1:g} and "
                        f"k = {k2:g} (target time; must agree within {INVARIANCE_TOLERANCE:.0%})")
    for column in ("mode", "series", f"k={k1:g} ms", f"k={k2:g} ms", "ratio", "within"):
        table.add_column(column, justify="right")
    for mode in low.modes:
        for series in ("iteration_s", "comm_s", "collective_s"):
            for stat in ("median", "p95", "max"):
                a, b = _stat(low, mode, series, stat), _stat(high, mode, series, stat)
                ratio = b / a if a and b else None
                bound = "yes" if ratio and abs(ratio - 1) <= INVARIANCE_TOLERANCE else "NO"
                table.add_row(mode, f"{series} {stat}", _ms(a), _ms(b),
                              f"{ratio:.3f}" if ratio else "-",
                              bound if stat == "median" else f"({bound})")
        table.add_row(mode, "tcp", _tcp(low, mode), _tcp(high, mode), "", "")
    table.caption = f"probe: {_probe(low)} at k={k1:g}, {_probe(high)} at k={k2:g}; status " \
                    f"{low.status} / {high.status}"
    console.print(table)


def table_loss(doc: ResultsDocument) -> None:
    runs = {record.name: record for record in doc.scenarios}
    table = Table(title=f"loss 0.5%: scenarios/10gbe.toml fp32 at k = {LOSS_K[0]} and "
                        f"{LOSS_K[1]}, TCP clocks dilated vs as before (today); target time, "
                        f"p95 and max within {LOSS_TOLERANCE:.0%}")
    for column in ("TCP clocks", "stat", *(f"k={k} ms" for k in LOSS_K), "ratio", "within"):
        table.add_column(column, justify="right")
    for label, suffix in (("dilated", ""), ("today", "-today")):
        pair = [runs.get(f"10gbe-loss-k{k}{suffix}") for k in LOSS_K]
        if None in pair:
            continue
        low, high = pair
        for stat in ("median", "p95", "max"):
            a, b = (_stat(r, "fp32", "iteration_s", stat) for r in (low, high))
            ratio = b / a if a and b else None
            table.add_row(label, f"iteration {stat}", _ms(a), _ms(b),
                          f"{ratio:.3f}" if ratio else "-",
                          "yes" if ratio and abs(ratio - 1) <= LOSS_TOLERANCE else "NO")
        table.add_row(label, "tcp (all nodes)", _tcp(low, "fp32"), _tcp(high, "fp32"), "", "")
        table.add_row(label, "probe", _probe(low), _probe(high), "", "")
    console.print(table)


def table_replay(doc: ResultsDocument) -> None:
    real, replay = doc.scenarios
    table = Table(title="replay vs real compute: scenarios/default.toml (real CPU compute) and "
                        "the same replaying its profile (within 10%)")
    for column in ("mode", "series", "real ms", "replay ms", "ratio", "within"):
        table.add_column(column, justify="right")
    for mode in real.modes:
        for series in ("iteration_s", "comm_s", "compute_s"):
            a, b = _median(real, mode, series), _median(replay, mode, series)
            ratio = b / a if a and b else None
            within = ratio is not None and abs(ratio - 1) <= REPLAY_TOLERANCE
            table.add_row(mode, series, _ms(a), _ms(b), f"{ratio:.3f}" if ratio else "-",
                          "yes" if within else ("-" if series == "compute_s" else "NO"))
    console.print(table)


def table_published(doc: ResultsDocument) -> None:
    table = Table(title="the published case: RTX 3090 nodes on 10GbE, ResNet-50, all-reduce "
                        "after backward: 234 ms compute + 106 ms comm, efficiency ~0.69")
    for column in ("nodes", "iter ms", "comm ms", "coll ms", "eff", "comm / 106",
                   "eff / 0.69", "probe", "status"):
        table.add_column(column, justify="right")
    for record in doc.scenarios:
        comm = _median(record, "fp32", "comm_s")
        mode = record.modes.get("fp32")
        eff = mode.scaling_efficiency if mode else None
        table.add_row(str(record.scenario["topology"]["nodes"]) if record.scenario else "?",
                      _ms(_median(record, "fp32", "iteration_s")), _ms(comm),
                      _ms(_median(record, "fp32", "collective_s")),
                      f"{eff:.3f}" if eff else "-",
                      f"{comm / PUBLISHED_COMM_S:.2f}" if comm else "-",
                      f"{eff / PUBLISHED_EFFICIENCY:.2f}" if eff else "-", _probe(record),
                      record.status)
    console.print(table)


def table_modes(doc: ResultsDocument, title: str) -> None:
    table = Table(title=title)
    for column in ("scenario", "GPUs", "k", "mode", "iter ms", "iter sd", "comm ms", "coll ms",
                   "coll sd", "eff", "wire MB", "vs fp32", "probe", "replay late ms",
                   "status"):
        table.add_column(column, justify="right")
    for record in doc.scenarios:
        fp32 = record.modes.get("fp32")
        for mode, m in record.modes.items():
            late = statistics.median(m.replay_late_s) if m.replay_late_s else None
            table.add_row(
                record.name, str(m.world_size), f"{m.dilation:g}", mode,
                _ms(statistics.median(m.iteration_s)), _ms(statistics.stdev(m.iteration_s)),
                _ms(statistics.median(m.comm_s)),
                _ms(statistics.median(m.collective_s) if m.collective_s else None),
                _ms(statistics.stdev(m.collective_s) if m.collective_s else None),
                f"{m.scaling_efficiency:.2f}", f"{m.wire_bytes_per_iteration / 1e6:.1f}",
                f"{m.wire_bytes_per_iteration / fp32.wire_bytes_per_iteration:.3f}"
                if fp32 and fp32.wire_bytes_per_iteration else "-",
                _probe(record), _ms(late), record.status)
    console.print(table)


def print_tables(out: Path) -> None:
    for part, show in (("invariance", table_invariance), ("loss", table_loss),
                       ("replay", table_replay),
                       ("published", table_published),
                       ("scale16", lambda d: table_modes(d, "16 GPUs on 10GbE and 25GbE")),
                       ("jitter", lambda d: table_modes(d, "jitter: 2 -> 16 GPUs on 10GbE"))):
        path = out / f"{part}.json"
        if not path.exists():
            console.print(f"[dim]{part}: not run (no {path})[/dim]")
            continue
        document = load_document(path)
        if any(record.status in ("refused", "error") for record in document.scenarios):
            for record in document.scenarios:
                console.print(f"{part}: {record.name}: {record.status} "
                              f"{record.refused or record.error or ''}")
        try:
            show(document)
        except (KeyError, ValueError, statistics.StatisticsError) as exc:
            console.print(f"{part}: cannot tabulate ({exc})")
        if part == "jitter":
            plot = ROOT / "docs" / "scale-jitter.png"
            plot_jitter_by_gpus(document.scenarios, plot,
                                "10GbE, ResNet-50 replayed: spread and pace per iteration vs GPUs")
            console.print(f"plot: {plot}")


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__,
                                     formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("part", choices=[*PARTS, "table"])
    parser.add_argument("--out", type=Path, required=True)
    args = parser.parse_args()
    args.out.mkdir(parents=True, exist_ok=True)
    if args.part != "table":
        reports = PARTS[args.part](args.out)
        save(results_document(reports), args.out / f"{args.part}.json")
        (args.out / f"{args.part}.status").write_text(json.dumps(
            {r.scenario.name: r.status for r in reports}))
    print_tables(args.out)


if __name__ == "__main__":
    main()
