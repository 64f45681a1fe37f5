"""The command line's ground: the group, exit codes (0 ok, 1 a check failed, 2 bad input), the
consoles, option types, the session options as click options."""

from __future__ import annotations

import json
import math
import sys
from collections.abc import Iterable
from typing import Any

import click
from rich.console import Console
from rich.markup import escape

from netsim_ddp import __version__
from netsim_ddp.common.files import write_whole
from netsim_ddp.common.options import SESSION_OPTIONS
from netsim_ddp.scenario.spec import Scenario, ScenarioError

# The four outcomes (docs/verdicts.md): passed; failed (the code under test); bad input (a
# scenario, option or file the command cannot use); untrusted (this host could not emulate the
# scenario faithfully: nothing was judged, which CI must not read as a regression).
EXIT_OK, EXIT_FAILED, EXIT_BAD_INPUT, EXIT_UNTRUSTED = 0, 1, 2, 3


def exit_code(statuses: Iterable[str]) -> int:
    """One exit code for a command's runs: failed (or broke) outweighs untrusted, which
    outweighs passed."""
    seen = set(statuses)
    if seen & {"failed", "error"}:
        return EXIT_FAILED
    return EXIT_UNTRUSTED if "untrusted" in seen else EXIT_OK


# Logs (CI, files) are not terminals: give tables room rather than rich's default 80 columns.
_LOG_WIDTH = 120


out = Console(highlight=False, width=None if sys.stdout.isatty() else _LOG_WIDTH)


err = Console(stderr=True, highlight=False, width=None if sys.stderr.isatty() else _LOG_WIDTH)


def fail_command(message: str, code: int) -> None:
    """End the command: `message` on stderr as an error, exit `code` (EXIT_*)."""
    err.print(f"[bold red]error:[/] {escape(message)}", soft_wrap=True)
    sys.exit(code)


def load_scenarios(paths: tuple[str, ...], host_check: bool = True) -> list[Scenario]:
    """Every scenario, validated and checked against what this host can hold (every point of
    a sweep too), before anything is built: the first bad one ends the command."""
    from netsim_ddp.scenario.limits import HostResources, check_host

    host = HostResources.probe()
    scenarios = []
    for path in paths:
        try:
            scenario = Scenario.load(path)
            if host_check:
                check_host(scenario, host)
        except ScenarioError as exc:
            fail_command(str(exc), EXIT_BAD_INPUT)
        scenarios.append(scenario)
    return scenarios


class FiniteFloat(click.ParamType):
    """A float that is a real number (click's FLOAT takes 'nan' and 'inf'), optionally > 0."""

    name = "float"

    def __init__(self, positive: bool = False):
        self.positive = positive

    def convert(self, value, param, ctx):
        try:
            number = float(value)
        except (TypeError, ValueError):
            self.fail(f"{value!r} is not a number", param, ctx)
        if not math.isfinite(number):
            self.fail(f"{value!r} is not a finite number", param, ctx)
        if self.positive and number <= 0:
            self.fail(f"{value!r} must be greater than 0", param, ctx)
        return number


class MachineParam(click.ParamType):
    """A kind of machine, 'cores=16,memory=64GiB' (scenario.sizing.MachineSpec)."""

    name = "machine"

    def convert(self, value, param, ctx):
        from netsim_ddp.scenario.sizing import MachineSpec

        if isinstance(value, MachineSpec):
            return value
        try:
            return MachineSpec.parse(value)
        except ValueError as exc:
            self.fail(str(exc), param, ctx)


class RateParam(click.ParamType):
    """A link rate with its unit ('400gbit', '50GB/s'), in bits per second, > 0."""

    name = "rate"

    def convert(self, value, param, ctx):
        if isinstance(value, float):
            return value
        from netsim_ddp.scenario.units import parse_rate

        try:
            rate = parse_rate(value)
        except ValueError as exc:
            self.fail(str(exc), param, ctx)
        if rate <= 0:
            self.fail(f"{value!r} must be greater than 0", param, ctx)
        return rate


NICS_HELP = ("NICs in one server of the calibrated cluster (default 1; H100 servers usually "
             "have one per GPU): min(GPUs, NICs) carry a server's traffic.")


NIC_RATE_HELP = ("One NIC's line rate, e.g. 400gbit (default: typical for the calibration's "
                 "GPUs): a 2-host bus bandwidth above what a ring over the NICs reaches is "
                 "NCCL's tree, flagged.")


def human_console(json_out: str | None) -> Console:
    """Where tables go: stderr when stdout carries the JSON, so `--json -` stays parseable."""
    return err if json_out == "-" else out


def write_json(target: str | None, document: dict, quiet: bool = False) -> None:
    """`document` as JSON to `target` ('-': stdout; None: nowhere), saying where unless quiet."""
    if target is None:
        return
    text = json.dumps(document, indent=2)
    if target == "-":
        click.echo(text)
        return
    write_whole(target, text + "\n")  # never a half-written results file
    if not quiet:
        err.print(f"wrote {target}")


def session_options(*names: str):
    """The session options (session.SESSION_OPTIONS, which pytest takes too) named, as click
    options of a command."""

    def decorate(command):
        for name in reversed(names):
            option = SESSION_OPTIONS[name]
            kind = option.kind
            extra: dict[str, Any] = (
                {"is_flag": True} if kind == "flag" else
                {"multiple": True} if kind == "list" else
                {"type": click.IntRange(min=1)} if kind == "count" else
                {"type": click.Path(file_okay=False)} if kind == "folder" else
                {"type": FiniteFloat(), "default": option.default, "show_default": True}
                if kind == "fraction" else {})
            if option.metavar:
                extra["metavar"] = option.metavar
            command = click.option(f"--{option.name}", option.dest, help=option.help,
                                   **extra)(command)
        return command

    return decorate


gate_options = session_options("baseline", "save-baseline", "tolerance", "alpha")

# run, launch and host: how long the ranks of one launch may take (launch: each variant's).
timeout_option = click.option("--timeout", "timeout_s", type=FiniteFloat(positive=True),
                               help="Seconds before hung ranks are killed (launch: each "
                                    "variant's ranks).")


class NetworkCommand(click.Command):
    """A command that builds namespaces. Without root, the process enters its user namespace
    before such a command starts, while it has one thread (or is started again inside it: see
    fabric/namespaces/privilege.py); a refusal is reported where the command needs the network."""


@click.group(context_settings={"help_option_names": ["-h", "--help"]})
@click.version_option(__version__, prog_name="netsim-ddp")
@click.pass_context
def main(ctx: click.Context) -> None:
    """Emulate a cluster network on this host and test DDP training on it."""
    if ctx.invoked_subcommand in network_commands():
        from netsim_ddp.fabric.namespaces.privilege import prepare

        prepare(restart=True)


def network_commands() -> frozenset[str]:
    """The commands declared with cls=NetworkCommand: derived, never a list kept by hand."""
    return frozenset(name for name, command in main.commands.items()
                     if isinstance(command, NetworkCommand))
