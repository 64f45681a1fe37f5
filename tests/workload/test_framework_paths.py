"""Framework paths that branch on the device (workload.framework_paths): Lightning's DDPStrategy
registers its comm hook only on CUDA. A scale model registers it as CUDA would; a real-time
run leaves it and says the bytes are not the target's. Checked on a stand-in module with
Lightning's names (Lightning itself: tests/ddp/test_framework_scale.py)."""

from __future__ import annotations

import types
from typing import Any

import pytest

from netsim_ddp.workload.ranks.framework_paths import lightning_patch


def _lightning_like() -> tuple[types.ModuleType, list[Any]]:
    registered: list[Any] = []
    module = types.ModuleType("pytorch_lightning.strategies.ddp")

    class DDPStrategy:
        def __init__(self, device: str, hook: Any) -> None:
            self.root_device = types.SimpleNamespace(type=device)
            self._ddp_comm_hook, self._ddp_comm_state, self._ddp_comm_wrapper = hook, None, None
            self.model = object()

        def _register_ddp_hooks(self) -> None:  # Lightning's: CUDA only
            if self.root_device.type == "cuda":
                registered.append(self._ddp_comm_hook)

    def _register_ddp_comm_hook(**kwargs: Any) -> None:
        registered.append(kwargs["ddp_comm_hook"])

    module.DDPStrategy = DDPStrategy  # type: ignore[attr-defined]
    module._register_ddp_comm_hook = _register_ddp_comm_hook  # type: ignore[attr-defined]
    return module, registered


def fp16_compress_hook() -> None: ...


@pytest.mark.parametrize("target_like", [True, False])
def test_a_cpu_rank_registers_the_hook_only_in_a_scale_model(target_like) -> None:
    module, registered = _lightning_like()
    adjusted: list[str] = []
    differs: list[str] = []
    lightning_patch(adjusted, differs, target_like)(module)
    module.DDPStrategy("cpu", fp16_compress_hook)._register_ddp_hooks()
    if target_like:
        assert registered == [fp16_compress_hook] and not differs
        assert "fp16_compress_hook" in adjusted[0] and "as CUDA would" in adjusted[0]
    else:
        assert registered == [] and not adjusted
        assert "fp16_compress_hook" in differs[0] and "uncompressed" in differs[0]


def test_cuda_and_no_hook_are_left_to_lightning() -> None:
    module, registered = _lightning_like()
    adjusted: list[str] = []
    differs: list[str] = []
    lightning_patch(adjusted, differs, True)(module)
    module.DDPStrategy("cuda", fp16_compress_hook)._register_ddp_hooks()
    module.DDPStrategy("cpu", None)._register_ddp_hooks()
    assert registered == [fp16_compress_hook] and adjusted == differs == []
