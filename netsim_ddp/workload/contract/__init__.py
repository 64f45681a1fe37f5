"""What the launching side and the ranks agree on, importable by both without torch: the result
file one mode writes (mode_result), the measured window's signals (window), a script's steps
(steps), the compute noise's draws (noise_draws), the compute profile's file (compute_profile)
and interval arithmetic (intervals)."""
