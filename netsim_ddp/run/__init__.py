"""Putting it together: one scenario end to end (runner, on a site: emulated_site, training),
a session of runs, sweeps, and the agents of real hosts and machines (hosts/)."""
