"""Real hosts and machines: `netsim-ddp host` (one agent per real host, shaping its own NIC)
and `netsim-ddp machine` (one agent per machine, each holding a share of a scale model), their
options, their control channel, and the site (run/site.py) their launches make."""
