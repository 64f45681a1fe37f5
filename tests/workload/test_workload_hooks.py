"""Modes and their comm hooks, in this process with a one-rank gloo group (no torchrun).

With one rank the all-reduce is an identity, so what we can check here is what each mode hands
to the all-reduce (dtype, bytes) and that our amp-fp16 hook is torch's fp16_compress_hook.
"""

from __future__ import annotations

import pytest
import torch
from torch.distributed.algorithms.ddp_comm_hooks.default_hooks import (
    bf16_compress_hook,
    fp16_compress_hook,
)
from torch.nn.parallel import DistributedDataParallel

from netsim_ddp.precision.hooks import SentBytes
from netsim_ddp.precision.modes import MODES, Mode, get_mode, register_mode
from netsim_ddp.workload.ranks.loop import Trainer, param_digest
from netsim_ddp.workload.ranks.models import build_workload, count_params, make_batches
from netsim_ddp.workload.ranks.rank import resolve_backend

PARAMS = 20_000


pytestmark = pytest.mark.usefixtures("one_rank_group")  # tests/workload/conftest.py


def grads_after_one_step(mode: Mode, hook: object = None) -> tuple[list[torch.Tensor], SentBytes]:
    workload = build_workload("mlp", PARAMS, seed=0)
    ddp = DistributedDataParallel(workload.model)
    counter = SentBytes()
    if hook is None:
        mode.register_comm_hook(ddp, counter)
    else:
        ddp.register_comm_hook(None, hook)  # type: ignore[arg-type]
    inputs, targets = make_batches(workload, 8, 1, seed=0, rank=0)[0]
    with mode.autocast("cpu"):
        loss = workload.loss_fn(ddp(inputs), targets)
    loss.backward()
    return [p.grad.clone() for p in ddp.module.parameters()], counter  # type: ignore[union-attr]


@pytest.mark.parametrize(
    ("mode", "wire_dtype", "bytes_per_param"),
    [("fp32", "float32", 4), ("amp", "float32", 4), ("amp-fp16", "float16", 2),
     ("amp-bf16", "bfloat16", 2)],
)  # fmt: skip
def test_hook_counts_what_is_sent(mode: str, wire_dtype: str, bytes_per_param: int) -> None:
    grads, counter = grads_after_one_step(get_mode(mode))
    params = count_params(build_workload("mlp", PARAMS, seed=0).model)
    assert counter.dtypes == {wire_dtype}
    assert counter.bytes == bytes_per_param * params
    assert all(g.dtype == torch.float32 for g in grads)  # gradients land in FP32 params


def test_amp_fp16_is_torchs_fp16_compress_hook() -> None:
    ours, _ = grads_after_one_step(get_mode("amp-fp16"))
    torchs, _ = grads_after_one_step(get_mode("amp-fp16"), hook=fp16_compress_hook)
    uncompressed, _ = grads_after_one_step(get_mode("amp"))
    assert all(torch.equal(a, b) for a, b in zip(ours, torchs, strict=True))
    # ...and the compression really happened: FP16 rounding changed some gradient.
    assert not all(torch.equal(a, b) for a, b in zip(ours, uncompressed, strict=True))


def test_torch_bf16_hook_refuses_gloo_ours_works() -> None:
    # Why amp-bf16 has its own hook: DDP rejects torch's bf16 hook by name without NCCL.
    with pytest.raises(TypeError, match="NCCL"):
        grads_after_one_step(get_mode("amp-bf16"), hook=bf16_compress_hook)
    grads, counter = grads_after_one_step(get_mode("amp-bf16"))
    assert counter.dtypes == {"bfloat16"} and all(torch.isfinite(g).all() for g in grads)


def test_grad_scaler_is_real_on_cpu() -> None:
    scaler = get_mode("amp").grad_scaler("cpu")
    assert scaler is not None and scaler.is_enabled() and scaler.get_scale() > 1
    assert get_mode("fp32").grad_scaler("cpu") is None
    assert get_mode("amp").autocast_dtype("cpu") == torch.bfloat16
    assert get_mode("amp").autocast_dtype("cuda") == torch.float16


def test_rolled_back_step_leaves_no_trace() -> None:
    workload = build_workload("mlp", PARAMS, seed=0)
    ddp = DistributedDataParallel(workload.model)
    mode = get_mode("amp")
    mode.register_comm_hook(ddp, SentBytes())
    trainer = Trainer(
        ddp, mode, workload.loss_fn, torch.optim.SGD(ddp.parameters(), lr=0.1, momentum=0.9),
        mode.grad_scaler("cpu"), torch.device("cpu"),
    )  # fmt: skip
    batches = make_batches(workload, 8, 2, seed=0, rank=0)
    trainer.step(batches[:1], sync=True)  # creates momentum state worth restoring
    before = [t.clone() for t in ddp.module.state_dict().values()]
    momentum = [s["momentum_buffer"].clone() for s in trainer.optimizer.state.values()]
    with trainer.rolled_back():
        trainer.step(batches[1:], sync=False)
        assert not all(
            torch.equal(a, b) for a, b in zip(before, ddp.module.state_dict().values(), strict=True)
        )
    assert all(
        torch.equal(a, b) for a, b in zip(before, ddp.module.state_dict().values(), strict=True)
    )
    restored = [s["momentum_buffer"] for s in trainer.optimizer.state.values()]
    assert all(torch.equal(a, b) for a, b in zip(momentum, restored, strict=True))


def test_registry() -> None:
    assert list(MODES)[:3] == ["fp32", "amp", "amp-fp16"]
    with pytest.raises(ValueError, match="already registered"):
        register_mode(Mode())
    with pytest.raises(ValueError, match="valid modes: fp32"):
        get_mode("fp8")


def test_param_digest_sees_any_change() -> None:
    a, b = (build_workload("mlp", PARAMS, seed=0).model for _ in range(2))
    assert param_digest(a) == param_digest(b)
    with torch.no_grad():
        next(b.parameters()).view(-1)[0] += 1e-6
    assert param_digest(a) != param_digest(b)


@pytest.mark.skipif(torch.cuda.is_available(), reason="checks the CPU-only resolution")
def test_backend_resolution_without_gpus() -> None:
    assert resolve_backend("auto", 2) == "gloo"
    assert resolve_backend("gloo", 2) == "gloo"
    with pytest.raises(RuntimeError, match="'nccl' needs CUDA GPUs and NCCL.*sees 0 GPU"):
        resolve_backend("nccl", 1)
