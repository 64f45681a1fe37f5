"""`netsim-ddp`: the command line, one module per command group on app's group."""

from netsim_ddp.cli import clean, network, results, run  # noqa: F401  (they add the commands)
from netsim_ddp.cli.app import main

__all__ = ["main"]
