"""Precision modes: how a run trains, and so what DDP puts on the wire.

A mode is a small stateless object that knows three things: the autocast dtype for the forward
pass (or none), whether the optimizer step goes through a GradScaler, and which comm hook DDP
uses. The training loop (`loop.py`) is the same for every mode.

THE PITFALL this registry exists to show: autocast alone ("amp") does not change what DDP
all-reduces. Parameters stay FP32, so gradients and buckets stay FP32; only a compression hook
("amp-fp16", "amp-bf16") halves the bytes. Each mode's bytes are measured by the hook, never
derived from the mode's name.

torch is imported inside methods so that config validation (which needs only the names) works
without importing torch.

Add a mode: subclass `Mode`, then `register_mode(MyMode())`. The hook must route every tensor it
sends through a `SentBytes` (see hooks.counted_allreduce) or the byte counts will be wrong. Its
`wire_dtype` is all the harness needs besides: the probe all-reduces that dtype, the wire-ratio
check holds the mode's bytes to it against fp32, and a smaller dtype joins the default claim.
"""

from __future__ import annotations

import contextlib
from typing import TYPE_CHECKING, ClassVar, Literal

if TYPE_CHECKING:
    import torch
    from torch.nn.parallel import DistributedDataParallel

    from netsim_ddp.precision.hooks import SentBytes


WireDtype = Literal["float32", "float16", "bfloat16"]
BYTES_PER_ELEMENT: dict[str, int] = {"float32": 4, "float16": 2, "bfloat16": 2}
REFERENCE_MODE = "fp32"  # what the other modes' wire bytes and comm times are judged against


class Mode:
    """FP32 everywhere: the baseline. Subclasses override the three hooks below."""

    name: ClassVar[str] = "fp32"
    summary: ClassVar[str] = "FP32 compute, FP32 all-reduce"
    # What the comm hook all-reduces: the fidelity probe times an all-reduce of this dtype,
    # since gloo reduces 16-bit floats on the CPU far slower than float32.
    wire_dtype: ClassVar[WireDtype] = "float32"
    # Whether the forward runs under autocast: compute replay takes such a mode's time from
    # workload.compute_amp (or amp_ratio).
    uses_autocast: ClassVar[bool] = False

    def autocast_dtype(self, device_type: str) -> torch.dtype | None:
        return None

    def uses_grad_scaler(self) -> bool:
        return False

    def register_comm_hook(self, ddp: DistributedDataParallel, counter: SentBytes) -> None:
        from netsim_ddp.precision.hooks import counted_allreduce

        ddp.register_comm_hook(counter, counted_allreduce)

    # Derived helpers: modes normally don't override these.
    def autocast(self, device_type: str) -> contextlib.AbstractContextManager[object]:
        import torch

        dtype = self.autocast_dtype(device_type)
        if dtype is None:
            return contextlib.nullcontext()
        return torch.autocast(device_type=device_type, dtype=dtype)

    def grad_scaler(self, device_type: str) -> torch.amp.GradScaler | None:
        import torch

        # torch.amp.GradScaler("cpu") is a real, enabled scaler in torch 2.13.
        return torch.amp.GradScaler(device_type) if self.uses_grad_scaler() else None


class AmpMode(Mode):
    """The recipe most people use: autocast + GradScaler. Gradients and buckets stay FP32."""

    name: ClassVar[str] = "amp"
    summary: ClassVar[str] = "autocast + GradScaler, FP32 all-reduce (the pitfall)"
    uses_autocast: ClassVar[bool] = True

    def autocast_dtype(self, device_type: str) -> torch.dtype | None:
        import torch

        # CPU autocast supports bfloat16 well; float16 is the CUDA recipe.
        return torch.float16 if device_type == "cuda" else torch.bfloat16

    def uses_grad_scaler(self) -> bool:
        return True


class AmpFp16Mode(AmpMode):
    """autocast + GradScaler + FP16 gradient compression: half the bytes on the wire.

    Uses torch's `fp16_compress_wrapper(allreduce_hook)`, which torch documents as equivalent to
    `fp16_compress_hook` (tests check the gradients are bitwise equal); the wrapper form lets the
    inner hook count the FP16 tensor that is actually sent.
    """

    name: ClassVar[str] = "amp-fp16"
    summary: ClassVar[str] = "autocast + GradScaler + fp16_compress_hook (FP16 all-reduce)"
    wire_dtype: ClassVar[WireDtype] = "float16"

    def register_comm_hook(self, ddp: DistributedDataParallel, counter: SentBytes) -> None:
        from torch.distributed.algorithms.ddp_comm_hooks.default_hooks import (
            fp16_compress_wrapper,
        )

        from netsim_ddp.precision.hooks import counted_allreduce

        ddp.register_comm_hook(counter, fp16_compress_wrapper(counted_allreduce))


class AmpBf16Mode(AmpMode):
    """autocast (bfloat16) + GradScaler + BF16 gradient all-reduce.

    Under NCCL through torch's own `bf16_compress_wrapper(allreduce)` (torch documents it as
    `bf16_compress_hook`; DDP allows it only with NCCL); on gloo through our `cast_wrapper`,
    the same cast, since a bf16 all-reduce on gloo works while DDP refuses torch's hook there.
    """

    name: ClassVar[str] = "amp-bf16"
    summary: ClassVar[str] = "autocast + GradScaler + BF16 all-reduce hook"
    wire_dtype: ClassVar[WireDtype] = "bfloat16"

    def autocast_dtype(self, device_type: str) -> torch.dtype | None:
        import torch

        return torch.bfloat16  # the bf16 recipe on CUDA too (amp uses float16 there)

    def register_comm_hook(self, ddp: DistributedDataParallel, counter: SentBytes) -> None:
        import torch
        import torch.distributed as dist

        from netsim_ddp.precision.hooks import cast_wrapper, counted_allreduce

        if dist.get_backend() == "nccl":
            from torch.distributed.algorithms.ddp_comm_hooks.default_hooks import (
                bf16_compress_wrapper,
            )

            ddp.register_comm_hook(counter, bf16_compress_wrapper(counted_allreduce))
        else:
            ddp.register_comm_hook(counter, cast_wrapper(torch.bfloat16, counted_allreduce))


MODES: dict[str, Mode] = {}


def register_mode(mode: Mode) -> Mode:
    if mode.name in MODES:
        raise ValueError(f"mode {mode.name!r} is already registered")
    MODES[mode.name] = mode
    return mode


def mode_names() -> list[str]:
    return list(MODES)


def get_mode(name: str) -> Mode:
    try:
        return MODES[name]
    except KeyError:
        raise ValueError(f"unknown mode {name!r}; valid modes: {', '.join(MODES)}") from None


def wire_ratio(name: str, reference: str = REFERENCE_MODE) -> float:
    """The wire bytes `name` promises relative to `reference`: its hook sends the same
    elements in its wire dtype (the wire-ratio checks hold each mode to it)."""
    return (BYTES_PER_ELEMENT[get_mode(name).wire_dtype]
            / BYTES_PER_ELEMENT[get_mode(reference).wire_dtype])


def compresses(name: str, reference: str = REFERENCE_MODE) -> bool:
    """Does `name` put fewer bytes on the wire than `reference` (the default claim: then its
    comm time must be shorter too)? False for a mode this process has not registered."""
    return name in MODES and wire_ratio(name, reference) < 1


for _mode in (Mode(), AmpMode(), AmpFp16Mode(), AmpBf16Mode()):
    register_mode(_mode)
