"""The front page's commands and scenarios still work: every `netsim-ddp` command in a shell block
parses with the real CLI (the command and each option exist), every file it names exists, every
pip extra it installs is declared, every `python` command runs a script that exists or a module
that imports, and every TOML block is a valid scenario. A command of any other program fails the
test: teach the check about it rather than let it pass unread."""

from __future__ import annotations

import importlib.util
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


ENVIRONMENT_WORD = re.compile(r"[A-Za-z_][A-Za-z0-9_]*=.*")


def check_files_exist(argv: list[str], args: list[str]) -> None:
    """The checkout's own files a command names (.toml scenarios, .py scripts) exist."""
    for arg in args:
        if arg.endswith((".toml", ".py")):
            assert (ROOT / arg).exists(), f"{' '.join(argv)}: {arg} does not exist"


def check_netsim_command(argv: list[str]) -> None:
    name, *rest = argv[1:]
    ctx = click.Context(main, info_name="netsim-ddp")
    command = main.get_command(ctx, name)
    assert command is not None, f"no command {name!r}"
    command.make_context(name, list(rest), parent=ctx)  # raises on an unknown option or value
    # What follows `--` is the user's own command (train.py is theirs, not the checkout's).
    check_files_exist(argv, rest[:rest.index("--")] if "--" in rest else rest)


def check_python_command(argv: list[str]) -> None:
    """`python SCRIPT ...`: the script exists; `python -m MODULE ...`: the module imports."""
    args = argv[1:]
    assert args, f"{' '.join(argv)}: no script or module"
    if args[0] == "-m":
        assert len(args) > 1 and importlib.util.find_spec(args[1]) is not None, \
            f"{' '.join(argv)}: no module {args[1:2]}"
    else:
        assert args[0].endswith(".py"), f"{' '.join(argv)}: expected a script, got {args[0]!r}"
        check_files_exist(argv, args[:1])


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


def check_command(argv: list[str]) -> None:
    """One shell command: leading NAME=VALUE words are its environment; the program decides
    the check, and a program the check does not know fails."""
    while argv and ENVIRONMENT_WORD.fullmatch(argv[0]):
        argv = argv[1:]
    assert argv, "an environment assignment with no command"
    program = Path(argv[0]).name  # .venv/bin/python is python
    if program == "netsim-ddp":
        check_netsim_command(argv)
    elif program == "pip" and argv[1:2] == ["install"]:
        check_pip_extras(argv)
    elif re.fullmatch(r"python(3(\.\d+)?)?", program):
        check_python_command(argv)
    else:
        raise AssertionError(f"{' '.join(argv)}: the front page's check does not know "
                             f"{program!r}: check it here, or leave it off the front page")


@pytest.mark.parametrize("argv", shell_commands(), ids=lambda argv: " ".join(argv)[:60])
def test_a_front_page_command_is_valid(argv):
    check_command(argv)


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


def test_the_check_reads_past_the_environment_and_knows_every_program():
    # an environment word does not hide the command after it
    check_command(["HF_HUB_OFFLINE=1", ".venv/bin/netsim-ddp", "run", "scenarios/default.toml"])
    with pytest.raises(AssertionError, match="no command 'no-such'"):
        check_command(["HF_HUB_OFFLINE=1", "A=b", "netsim-ddp", "no-such"])
    with pytest.raises(click.UsageError):
        check_command(["HF_HUB_OFFLINE=1", "netsim-ddp", "run", "--no-such"])
    # python: a script of the checkout, or a module that imports
    check_command(["python", "examples/trl-sft/make_assets.py"])
    check_command([".venv/bin/python", "-m", "pytest"])
    with pytest.raises(AssertionError, match="examples/missing.py does not exist"):
        check_command(["python", "examples/missing.py"])
    with pytest.raises(AssertionError, match="no module"):
        check_command(["python3", "-m", "no_such_module_here"])
    # the user's own script after `--` is theirs; a .py before it is the checkout's
    check_command(["netsim-ddp", "launch", "scenarios/default.toml", "--", "train.py"])
    # a program the check does not know fails, and so does pip doing other than install
    with pytest.raises(AssertionError, match="does not know 'make'"):
        check_command(["make", "test"])
    with pytest.raises(AssertionError, match="does not know 'pip'"):
        check_command(["pip", "uninstall", "netsim-ddp"])


def test_the_front_page_stays_a_front_page():
    """The manual lives in docs/; the README is what a newcomer reads first."""
    assert len(FRONT_PAGE.read_text().splitlines()) <= 300
