"""Putting it together: one scenario end to end, a session of runs, sweeps, and the agent per real
host."""
