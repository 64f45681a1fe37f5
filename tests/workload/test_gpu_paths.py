"""The GPU side, checked where it can be without a GPU: which hook, which autocast dtype, and
that timed steps wait for the device."""

from types import SimpleNamespace

import torch
import torch.distributed as dist

from netsim_ddp.precision.modes import get_mode
from netsim_ddp.workload.ranks import loop


class CapturingDDP:
    def __init__(self):
        self.hooks = []

    def register_comm_hook(self, state, hook):
        self.hooks.append(hook)


def test_amp_bf16_uses_torchs_own_bf16_hook_under_nccl(monkeypatch):
    monkeypatch.setattr(dist, "get_backend", lambda group=None: "nccl")
    ddp = CapturingDDP()
    get_mode("amp-bf16").register_comm_hook(ddp, SimpleNamespace())
    # torch's bf16_compress_hook is bf16_compress_wrapper(allreduce_hook); DDP knows it by name
    assert ddp.hooks[0].__name__ == "bf16_compress_wrapper_hook"
    monkeypatch.setattr(dist, "get_backend", lambda group=None: "gloo")
    get_mode("amp-bf16").register_comm_hook(ddp, SimpleNamespace())
    assert ddp.hooks[1].__name__ == "cast_compress_hook"  # DDP refuses torch's on gloo


def test_autocast_dtypes_on_cuda():
    assert get_mode("amp").autocast_dtype("cuda") == torch.float16
    assert get_mode("amp-fp16").autocast_dtype("cuda") == torch.float16
    assert get_mode("amp-bf16").autocast_dtype("cuda") == torch.bfloat16
    assert get_mode("fp32").autocast_dtype("cuda") is None


def test_timed_steps_wait_for_the_gpu(monkeypatch):
    synced = []
    monkeypatch.setattr(torch.cuda, "synchronize", lambda device=None: synced.append(device))
    loop._device_sync(torch.device("cuda", 3))
    loop._device_sync(torch.device("cpu"))
    assert synced == [torch.device("cuda", 3)]
