"""One emulated node's torchrun whose ranks are forked from it, torch already imported:

    python -P -m netsim_ddp.workload.ranks.forking_torchrun TORCHRUN-OPTIONS
        -m netsim_ddp.workload.ranks.rank ARGS
    python -P -m netsim_ddp.workload.ranks.forking_torchrun TORCHRUN-OPTIONS
        -m netsim_ddp.workload.ranks.script_rank SCRIPT ARGS   (a user's script: script_rank.py)

The options are torchrun's, read by torchrun's own parser into torchrun's own launch config,
and the same elastic agent runs the ranks (static rendezvous, restarts, log files, error files).
One thing differs: torchrun starts every rank as a fresh `python -m MODULE`, which imports torch
and, at the first DDP wrapper, torch._dynamo (seconds of CPU each, per rank, in every run: more
than a small scenario's measured steps on a 2-core host). Here the agent imports them once and
forks the ranks from itself ("fork" start method), which then run `rank.forked_main`.

Only for ranks on the CPU: a CUDA context does not survive a fork, so NCCL runs go through
torchrun itself (launch.torchrun_module decides).
"""

from __future__ import annotations

import gc
import os
import sys

from torch.distributed.elastic.multiprocessing.errors import record


@record
def main(argv: list[str] | None = None) -> None:
    # What every rank imports, once, before the fork. DDP's constructor imports torch._dynamo.
    import torch._dynamo  # noqa: F401
    from torch.distributed.launcher.api import elastic_launch
    from torch.distributed.run import config_from_args, parse_args

    from netsim_ddp.workload.ranks import rank, script_rank

    args = parse_args(argv)
    entries = {module.__name__: module.forked_main for module in (rank, script_rank)}
    if not args.module or args.training_script not in entries:
        raise SystemExit(f"{__name__} starts {' or '.join(entries)} only (-m MODULE)")
    config, _, _ = config_from_args(args)
    config.start_method = "fork"
    # Move everything imported so far out of the collector's reach: a rank's full collection
    # (rank.py runs one between modes) would otherwise write to every object's header and
    # copy the agent's Python heap into each rank (measured: +49 MiB per ResNet-50 rank;
    # bench/rank_costs.py parts).
    gc.freeze()
    elastic_launch(config=config, entrypoint=entries[args.training_script])(
        list(args.training_script_args))


if __name__ == "__main__":
    main(sys.argv[1:])
    # Every rank has finished, its logs are closed and the agents' exit barrier has passed:
    # skip the interpreter's teardown of torch's modules (about 1 s here, on every node, at the
    # end of every run). A failure raises above instead, and exits the usual way.
    sys.stdout.flush()
    sys.stderr.flush()
    os._exit(0)
