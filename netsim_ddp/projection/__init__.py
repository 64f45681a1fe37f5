"""Beyond this host: the fitted DDP cost model, nccl-tests calibrations, and the cluster levels a
projection runs on."""
