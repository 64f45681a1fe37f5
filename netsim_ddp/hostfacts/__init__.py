"""Facts about the host, decided before any network exists: its GPUs and which rank gets
which (gpus, placement), NCCL's settings and proof from its log (nccl), CPU load and steal
(hostload). No torch here: GPUs are probed in a child process."""
