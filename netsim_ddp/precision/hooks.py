"""DDP comm hooks that count the bytes each all-reduce really sends.

Counting happens in the innermost hook, on the tensor handed to `dist.all_reduce`, so any
compression wrapped around it is already applied: that is what goes on the wire (gloo and NCCL
send the tensor's own dtype). Every mode, fp32 included, goes through `counted_allreduce`, so the
Python-hook overhead is the same in all modes and never biases a comparison.

No `from __future__ import annotations` here: DDP checks hook annotations at registration and
rejects string annotations.
"""

from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any

import torch
import torch.distributed as dist
from torch.distributed import GradBucket  # type: ignore[attr-defined]  # missing from stubs
from torch.distributed.algorithms.ddp_comm_hooks.default_hooks import allreduce_hook

Hook = Callable[[Any, GradBucket], torch.futures.Future[torch.Tensor]]


@dataclass
class SentBytes:
    """Hook state: what the all-reduces sent since the last `reset()` (one rank's view)."""

    process_group: dist.ProcessGroup | None = None
    bytes: int = 0
    buckets: int = 0
    dtypes: set[str] = field(default_factory=set)

    def reset(self) -> None:
        self.bytes = 0
        self.buckets = 0

    def record(self, tensor: torch.Tensor) -> None:
        self.bytes += tensor.numel() * tensor.element_size()
        self.buckets += 1
        self.dtypes.add(str(tensor.dtype).removeprefix("torch."))


def counted_allreduce(state: SentBytes, bucket: GradBucket) -> torch.futures.Future[torch.Tensor]:
    """torch's `allreduce_hook` (same result as no hook), counting the bucket it sends."""
    state.record(bucket.buffer())
    return allreduce_hook(state.process_group, bucket)  # type: ignore[arg-type]


def cast_wrapper(dtype: torch.dtype, hook: Hook) -> Hook:
    """Send the bucket as `dtype` through `hook`, then decompress into the original buffer.

    The same as torch's fp16/bf16_compress_wrapper. We need our own for bf16 because DDP refuses
    torch's bf16 hook and wrapper by function name unless NCCL is available, while a bf16
    all-reduce on gloo itself works in torch 2.13.
    """

    def cast_compress_hook(state: Any, bucket: GradBucket) -> torch.futures.Future[torch.Tensor]:
        original = bucket.buffer()
        bucket.set_buffer(original.to(dtype))

        def decompress(fut: torch.futures.Future[torch.Tensor]) -> torch.Tensor:
            original.copy_(fut.value())
            return original

        decompressed: torch.futures.Future[torch.Tensor] = hook(state, bucket).then(decompress)
        return decompressed

    return cast_compress_hook
