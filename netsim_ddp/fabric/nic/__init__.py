"""A real host's NIC (`netsim-ddp host`): whether it may be shaped (checks), what the job's
traffic gets (job_plan), shaping it and putting it back exactly (shaping, tc_tree), and
restoring the NICs of killed agents (cleanup)."""
