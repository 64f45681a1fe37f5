"""The command line's groups: the commands that need the network are found from their class."""

from netsim_ddp.cli import main
from netsim_ddp.cli.app import network_commands


def test_the_network_commands_are_derived_from_the_commands():
    assert network_commands() == {"check", "plan", "probe", "run"}
    assert network_commands() <= set(main.commands)


def test_timeout_is_one_option_on_each_command_that_launches_ranks():
    helps = {name: next(p.help for p in main.commands[name].params if p.name == "timeout_s")
             for name in ("run", "launch", "host")}
    assert len(set(helps.values())) == 1
