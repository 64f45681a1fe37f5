"""What runs inside a rank (torch): the measured loop, models, compute replay, timing, the
all-reduce probe, a user's script's hooks, and the node's torchrun agent."""
