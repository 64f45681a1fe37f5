"""The front page's commands and scenarios still work: every `netsim-ddp` command in a shell block
parses with the real CLI (the command and each option exist), every file it names exists, every
pip extra it installs is declared, and every TOML block is a valid scenario."""

from __future__ import annotations

import re
import shlex
import tomllib
from pathlib import Path

import click
import pytest

from netsim_ddp import Scenario
from netsim_ddp.cli import main

ROOT = Path(__file__).resolve().parents[2]
FRONT_PAGE = ROOT / "README.md"


def code_blocks(text: str, language: str) -> list[str]:
    return re.findall(rf"^```{language}\n(.*?)^```", text, re.S | re.M)


def commands(block: str) -> list[list[str]]:
    """Each command of a shell block: continuations joined, comments dropped, `&&` split."""
    joined = re.sub(r"\\\n\s*", " ", block)
    found = []
    for line in joined.splitlines():
        line = line.split(" #", 1)[0].strip()
        if line and not line.startswith("#"):
            found += [shlex.split(part) for part in line.split("&&")]
    return found


def check_netsim_command(argv: list[str]) -> None:
    name, *rest = argv[1:]
    ctx = click.Context(main, info_name="netsim-ddp")
    command = main.get_command(ctx, name)
    assert command is not None, f"no command {name!r}"
    command.make_context(name, list(rest), parent=ctx)  # raises on an unknown option or value
    for arg in rest:
        if arg.endswith(".toml"):
            assert (ROOT / arg).exists(), f"{' '.join(argv)}: {arg} does not exist"


def check_pip_extras(argv: list[str]) -> None:
    declared = tomllib.loads((ROOT / "pyproject.toml").read_text())["project"][
        "optional-dependencies"]
    for arg in argv:
        match = re.fullmatch(r"\.\[(.+)\]", arg)
        if match:
            for extra in match.group(1).split(","):
                assert extra in declared, f"pip extra {extra!r} is not in pyproject.toml"


def shell_commands() -> list[list[str]]:
    return [argv for block in code_blocks(FRONT_PAGE.read_text(), "sh")
            for argv in commands(block)]


def test_the_front_page_has_commands_and_scenarios():
    netsim = [argv for argv in shell_commands() if argv[0].endswith("netsim-ddp")]
    assert len(netsim) >= 4
    assert code_blocks(FRONT_PAGE.read_text(), "toml")


@pytest.mark.parametrize("argv", shell_commands(), ids=lambda argv: " ".join(argv)[:60])
def test_a_front_page_command_is_valid(argv):
    if argv[0].endswith("netsim-ddp"):
        check_netsim_command(argv)
    elif "pip" in argv[0] and "install" in argv:
        check_pip_extras(argv)


@pytest.mark.parametrize("block", code_blocks(FRONT_PAGE.read_text(), "toml"))
def test_a_front_page_scenario_validates(block, tmp_path):
    path = tmp_path / "scenario.toml"
    path.write_text(block)
    Scenario.load(path)


def test_the_check_rejects_an_unknown_option():
    with pytest.raises(click.UsageError):
        check_netsim_command(["netsim-ddp", "run", "scenarios/default.toml", "--no-such"])
    with pytest.raises(AssertionError):
        check_netsim_command(["netsim-ddp", "run", "scenarios/missing.toml"])


def test_the_front_page_stays_a_front_page():
    """The manual lives in docs/; the README is what a newcomer reads first."""
    assert len(FRONT_PAGE.read_text().splitlines()) <= 300
