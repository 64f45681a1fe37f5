"""A small training script of netsim-ddp's own, written the way users write theirs: torchrun
starts it, it reads its rank from the environment, and nothing in it knows about netsim-ddp
unless asked to (--marker). Each flag is one of the changes a release gate should catch or
compare: an extra per-step all-reduce, a comm hook, a bucket size, FSDP's reduce dtype.

    torchrun --nproc-per-node 2 tiny_train.py --steps 8 [--fp16-hook] [--average-weights] ...
"""

import argparse
import sys
import time

import torch
import torch.distributed as dist
from torch import nn


def parse() -> argparse.Namespace:
    parser = argparse.ArgumentParser(description=__doc__)
    parser.add_argument("--steps", type=int, default=8, help="optimizer steps, then exit")
    parser.add_argument("--width", type=int, default=1024, help="hidden width of the MLP")
    parser.add_argument("--layers", type=int, default=4)
    parser.add_argument("--batch", type=int, default=8)
    parser.add_argument("--bucket-mb", type=float, default=25.0, help="DDP bucket_cap_mb")
    parser.add_argument("--fp16-hook", action="store_true",
                        help="DDP fp16_compress_hook: gradients cross the wire as float16")
    parser.add_argument("--average-weights", action="store_true",
                        help="also all-reduce the weights after every step (a 'harmless' "
                             "consistency check that doubles the traffic)")
    parser.add_argument("--stats-floats", type=int, default=0,
                        help="also all-reduce this many floats of statistics every step (a "
                             "logging all-reduce a release may add)")
    parser.add_argument("--fsdp", action="store_true", help="FSDP2 fully_shard instead of DDP")
    parser.add_argument("--reduce-dtype", choices=("float32", "bfloat16"), default="float32",
                        help="FSDP2 MixedPrecisionPolicy(reduce_dtype=...)")
    parser.add_argument("--optimizers", type=int, default=1, choices=(0, 1, 2),
                        help="0: plain SGD by hand (no torch optimizer); 2: two optimizers")
    parser.add_argument("--marker", action="store_true", help="call netsim_ddp.step()")
    parser.add_argument("--hang-at", type=int, default=None, help="sleep forever at this step")
    return parser.parse_args()


def main() -> None:
    args = parse()
    dist.init_process_group("gloo")
    rank = dist.get_rank()
    torch.manual_seed(0)
    layers: list[nn.Module] = []
    for _ in range(args.layers):
        layers += [nn.Linear(args.width, args.width), nn.ReLU()]
    model: nn.Module = nn.Sequential(*layers)
    if args.fsdp:
        from torch.distributed.fsdp import MixedPrecisionPolicy, fully_shard

        policy = MixedPrecisionPolicy(reduce_dtype=getattr(torch, args.reduce_dtype))
        for layer in model:
            if isinstance(layer, nn.Linear):
                fully_shard(layer, mp_policy=policy)
        fully_shard(model, mp_policy=policy)
    else:
        model = nn.parallel.DistributedDataParallel(model, bucket_cap_mb=args.bucket_mb)
        if args.fp16_hook:
            from torch.distributed.algorithms.ddp_comm_hooks import default_hooks

            model.register_comm_hook(None, default_hooks.fp16_compress_hook)
    params = list(model.parameters())
    halves = [params[: len(params) // 2], params[len(params) // 2:]]
    optimizers = ([torch.optim.SGD(params, lr=1e-3)] if args.optimizers == 1 else
                  [torch.optim.SGD(half, lr=1e-3) for half in halves] if args.optimizers == 2
                  else [])
    generator = torch.Generator().manual_seed(rank)
    for step in range(args.steps):
        if step == args.hang_at:
            print(f"rank {rank}: step {step}, sleeping", flush=True)
            time.sleep(10**6)
        inputs = torch.randn(args.batch, args.width, generator=generator)
        loss = model(inputs).square().mean()
        loss.backward()
        if optimizers:
            for optimizer in optimizers:
                optimizer.step()
                optimizer.zero_grad()
        else:
            with torch.no_grad():
                for param in params:
                    param -= 1e-3 * param.grad
                    param.grad = None
        if args.average_weights:
            with torch.no_grad():
                for param in params:
                    dist.all_reduce(param.data)
                    param.data /= dist.get_world_size()
        if args.stats_floats:
            dist.all_reduce(torch.ones(args.stats_floats))
        if args.marker:
            import netsim_ddp

            netsim_ddp.step()
        if rank == 0:
            print(f"step {step} loss {loss.item():.4f}", flush=True)
    dist.destroy_process_group()


if __name__ == "__main__":
    main()
    sys.exit(0)
