"""The history gate on real runs: a small `default` run again and again, its links slowed by a
fraction from the K-th run on, then `netsim-ddp history` judged on every prefix of the history.

    flock /tmp/nsd-heavy.lock python bench/history_real.py train --out /tmp/history-real \
        --clean 5 --slowed 2 --from-run 4 --slowdown 0.10
    python bench/history_real.py judge --out /tmp/history-real

How "the same scenario on a slower network" is made: the scenario file never changes (so its
digest, and the history's series, stay the same); from the K-th run on, a hook the Python API
offers (`run_scenario(on_built=...)`) rewrites every link's tbf in place, both directions, to
(1 - slowdown) x the scenario's rate before anything runs: a degraded switch port or cable that
the scenario file does not know about, which is the regression a history gate must catch. The
all-reduce fidelity probe sees the slower link like everything else; the copied scenario lowers
`fidelity.min_fraction` to 0.8 (the same in every run, and not part of the digest) so a 10%
slower link is still trusted rather than refused.

Or, with `--grow 0.10`, the change is the model's, the way a user's model factory grows while
the scenario file stays the same: the copied scenario names a factory written next to it
(`nsd_history_grow:build`: the built-in MLP at `params` x (1 + NSD_HISTORY_GROW)), and from the
K-th run on the variable says 0.10, so every gradient, and every wire byte, is 10% more. Wire
bytes are exact counts, so this change shows however loaded the host is.

`train` (HEAVY: trains; run it under the shared lock) writes run-01.json, run-02.json, ... (the
documents `netsim-ddp run --json` writes) and the slowed runs' numbers; `judge` (no training)
runs `netsim-ddp history` on runs 1..n for every n, for the unchanged history (clean runs only)
and the slowed one (clean runs up to K-1, then the slowed ones), and prints the exit codes.
"""

from __future__ import annotations

import argparse
import json
import os
import re
import subprocess
import sys
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]


GROW_MODULE = "nsd_history_grow"
GROW_FACTORY = """import os

from netsim_ddp.workload.ranks.models import build_mlp


def build(params):
    # The same scenario, a model grown by NSD_HISTORY_GROW (a user's factory changing).
    return build_mlp(int(params * (1 + float(os.environ.get("NSD_HISTORY_GROW", "0")))))
"""


def small_default(folder: Path, iterations: int, grow: bool = False) -> Path:
    """scenarios/default.toml with fewer iterations, modes fp32 and amp-fp16, copied; with
    `grow`, its model built by a factory next to it (GROW_MODULE)."""
    text = (ROOT / "scenarios" / "default.toml").read_text()
    changes = [(r"(?m)^iterations = \d+", f"iterations = {iterations}"),
               (r"(?m)^warmup = \d+", "warmup = 2"),
               (r"(?m)^modes = .*$", 'modes = ["fp32", "amp-fp16"]'),
               (r"(?m)^min_fraction = [0-9.]+", "min_fraction = 0.8")]
    if grow:
        changes.append((r'(?m)^model = "mlp"', f'model = "{GROW_MODULE}:build"'))
        (folder / f"{GROW_MODULE}.py").write_text(GROW_FACTORY)
        sys.path.insert(0, str(folder))
        os.environ["PYTHONPATH"] = os.pathsep.join(
            p for p in (str(folder), os.environ.get("PYTHONPATH", "")) if p)
    for pattern, replacement in changes:
        text, count = re.subn(pattern, replacement, text)
        assert count == 1, f"default.toml has no single line matching {pattern!r}"
    path = folder / "default-small.toml"
    path.write_text(text)
    return path


def slowed_links(fraction: float):
    """An on_built hook: every link's tbf (node egress and switch port) at (1 - fraction)."""
    from pyroute2 import IPRoute

    from netsim_ddp.fabric.namespaces import netns
    from netsim_ddp.fabric.schedule import ETH0_INDEX, FIRST_PORT_INDEX, qdisc_changes

    def slow(fabric) -> None:
        plan = fabric.plan
        for node in plan.nodes:
            link = node.link.model_copy(update={"rate": node.link.rate * (1 - fraction)})
            for role, qdisc in qdisc_changes(node, link):
                namespace, index = ((node.netns, ETH0_INDEX) if role == "node"
                                    else (plan.switch_netns, FIRST_PORT_INDEX + node.index))
                placement = {"parent": qdisc.parent} if qdisc.parent is not None else {}
                with netns.entered(namespace), IPRoute() as ipr:
                    ipr.tc("change", qdisc.kind, index=index, handle=qdisc.handle,
                           **placement, **qdisc.params)

    return slow


def train(args: argparse.Namespace) -> None:
    from netsim_ddp.measure.document import save
    from netsim_ddp.run.session import NetsimSession
    from netsim_ddp.scenario.spec import Scenario

    out = Path(args.out)
    out.mkdir(parents=True, exist_ok=True)
    scenario = Scenario.load(small_default(out, args.iterations, grow=args.grow is not None))
    changed = "grown" if args.grow is not None else "slowed"
    plan = [("clean", i) for i in range(1, args.clean + 1)]
    plan += [(changed, i) for i in range(args.from_run, args.from_run + args.slowed)]
    started = time.monotonic()
    for kind, number in plan:
        session = NetsimSession.create()
        hook = slowed_links(args.slowdown) if kind == "slowed" else None
        os.environ["NSD_HISTORY_GROW"] = str(args.grow if kind == "grown" else 0.0)
        report = session.run(scenario, on_built=hook)
        path = out / f"{kind}-{number:02d}.json"
        save(session.document(), path)
        medians = {mode: round(result.iteration.median * 1e3, 1)
                   for mode, result in report.modes.items()}
        print(f"{path.name}: {report.status}, iteration medians ms {medians}, "
              f"{time.monotonic() - started:.0f} s so far", flush=True)
        if report.error:
            print(f"  error: {report.error}", flush=True)
    (out / "params.txt").write_text(json.dumps(vars(args), indent=2))  # not *.json: no run


def judge(args: argparse.Namespace) -> None:
    out = Path(args.out)
    meta = json.loads((out / "params.txt").read_text())
    clean = sorted(out.glob("clean-*.json"))
    slowed = sorted(out.glob("slowed-*.json")) or sorted(out.glob("grown-*.json"))
    histories = {"unchanged": clean,
                 "slowed": clean[:meta["from_run"] - 1] + slowed}
    for name, files in histories.items():
        print(f"{name} history ({len(files)} runs):")
        for n in range(2, len(files) + 1):
            command = [sys.executable, "-m", "netsim_ddp.cli", "history",
                       *map(str, files[:n]), *args.history_args]
            done = subprocess.run(command, capture_output=True, text=True)
            print(f"  runs 1..{n} ({files[n - 1].name}): exit {done.returncode}")
            if args.verbose or n == len(files):
                print("    " + done.stdout.strip().replace("\n", "\n    "))


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    sub = parser.add_subparsers(dest="command", required=True)
    t = sub.add_parser("train", help="HEAVY: the runs (under the shared lock)")
    t.add_argument("--out", required=True)
    t.add_argument("--clean", type=int, default=5, help="unchanged runs")
    t.add_argument("--slowed", type=int, default=2, help="runs with slowed links (or grown)")
    t.add_argument("--grow", type=float, default=None,
                   help="instead of slowing links, grow the model by this fraction")
    t.add_argument("--from-run", type=int, default=4, help="the first slowed run's number")
    t.add_argument("--slowdown", type=float, default=0.10)
    t.add_argument("--iterations", type=int, default=8)
    j = sub.add_parser("judge", help="netsim-ddp history on every prefix (no training)")
    j.add_argument("--out", required=True)
    j.add_argument("--verbose", action="store_true")
    j.add_argument("history_args", nargs="*", help="passed to netsim-ddp history (after --)")
    args = parser.parse_args()
    train(args) if args.command == "train" else judge(args)


if __name__ == "__main__":
    main()
