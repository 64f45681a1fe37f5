"""The tables the commands print about this host and a scenario's network (`check`, `plan`,
`probe`) and about a calibration (`calibrate`); the commands only print them."""

from __future__ import annotations

from typing import Any

from rich.table import Table

from netsim_ddp.scenario.units import format_duration, format_rate, format_size


def capability_table(caps: Any, torch_info: dict[str, Any], gpus: Any) -> Table:
    """`check`: what this host can emulate, each capability with what it is used for."""
    table = Table(title="netsim-ddp check", show_header=True)
    table.add_column("capability")
    table.add_column("status")
    table.add_column("used for")
    rows = [
        ("privilege", caps.privilege, "root, or rootless through a user namespace"),
        ("network namespaces", caps.namespaces, "one per emulated node"),
        ("veth", caps.veth, "node NICs"),
        ("bridge", caps.bridge, "the switch"),
        ("tbf qdisc", caps.tbf, "rate limits"),
        ("htb qdisc", caps.htb, "(optional) class-based shaping"),
        ("netem qdisc", caps.netem, "delay, jitter, loss (in the kernel)"),
        ("delay line", caps.delay_line, "delay, jitter, loss where netem is missing"),
        ("ifb", caps.ifb, "(optional) ingress shaping"),
        ("clsact", caps.clsact, "(optional) classifiers"),
        ("torch", torch_info["torch"] or False, "DDP workloads"),
        ("gloo", torch_info["gloo"], "CPU collectives"),
        ("GPUs", gpus.count if gpus.count else False,
         ", ".join(gpus.names) or "ranks on GPUs (backend nccl)"),
        ("NCCL", gpus.nccl or False, "GPU collectives"),
        ("NCCL path", gpus.nccl_usable and caps.can_build,
         "NCCL over the emulated links" if gpus.nccl_usable and caps.can_build
         else f"not here: {gpus.missing or 'no emulated network can be built'}"),
    ]
    for name, status, use in rows:
        shown = ("[green]yes[/]" if status is True else "[red]no[/]" if status is False
                 else str(status))
        table.add_row(name, shown, use)
    return table


def plan_table(scenario: Any, fabric_plan: Any) -> Table:
    """`plan`: each node's address and link, and the qdiscs that shape it."""
    table = Table(title=f"{scenario.name}: switch {fabric_plan.bridge}, MTU {fabric_plan.mtu}"
                  + ("" if scenario.topology.subnet else " (subnet drawn per run)"))
    for column in ("node", "address", "rate", "delay", "jitter", "loss", "queue", "egress qdiscs",
                   "delay by"):
        table.add_column(column)
    for node in fabric_plan.nodes:
        link = node.link
        table.add_row(node.name, node.address, format_rate(link.rate),
                      format_duration(link.delay), format_duration(link.jitter), f"{link.loss:g}%",
                      format_size(link.queue_limit_bytes),
                      " > ".join(q.kind for q in node.egress), node.delay_backend or "-")
    return table


def rank_table(scenario: Any, fabric_plan: Any, placement: Any) -> Table:
    """`plan`: where each rank runs (node, local rank, rank, device)."""
    table = Table()
    for column in ("node", "local rank", "rank", "device"):
        table.add_column(column)
    per_node = scenario.topology.ranks_per_node
    for node in fabric_plan.nodes:
        for local in range(per_node):
            device = (f"cuda:{placement.gpus.devices[node.index][local]}" if placement.gpus
                      else "cpu")
            table.add_row(node.name, str(local), str(node.index * per_node + local), device)
    return table


def fidelity_table() -> Table:
    """`probe`: one row per probed path (fidelity_rows), every scenario in one table."""
    table = Table(title="fidelity: achieved / expected TCP goodput")
    for column in ("scenario", "path", "cap", "expected", "achieved", "fraction", "verdict"):
        table.add_column(column)
    return table


def fidelity_rows(table: Table, scenario: Any, report: Any) -> None:
    for sample in report.samples:
        ok = sample.fraction >= report.min_fraction
        table.add_row(scenario.name, f"{sample.source} -> {sample.destination}",
                      format_rate(sample.cap_bps), format_rate(sample.expected_bps),
                      format_rate(sample.goodput_bps), f"{sample.fraction:.1%}",
                      "[green]trusted[/]" if ok else "[red]untrusted[/]")


def calibration_table(label: str, document: dict[str, Any]) -> Table:
    """`calibrate`: per size the measured time and the held-out prediction (never in sample)."""
    table = Table(title=label, title_justify="left")
    for column in ("size", "measured us", "held-out us", "held-out error"):
        table.add_column(column, justify="right", no_wrap=True)
    for row in document["sizes"]:
        held_us = "-" if row["held_out_s"] is None else f"{row['held_out_s'] * 1e6:.1f}"
        table.add_row(format_size(row["size"]), f"{row['measured_s'] * 1e6:.1f}", held_us,
                      "-" if row["held_out_error"] is None
                      else f"{row['held_out_error']:+.1%}")
    table.caption = ("held out: NCCL's cost model fitted without that size, predicting it "
                     "(fitted with it, the model passes through the measurement)")
    return table
