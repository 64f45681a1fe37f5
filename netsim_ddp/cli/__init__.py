"""`netsim-ddp`: the command line, one module per command group."""

from netsim_ddp.cli.run import main

__all__ = ["main"]
