"""Framework code that branches on the device, seen from a rank on the CPU.

PyTorch Lightning's DDPStrategy registers a configured `ddp_comm_hook` only when its root
device is CUDA (`_register_ddp_hooks`): on the CPU ranks here a script with
`DDPStrategy(ddp_comm_hook=fp16_compress_hook)` silently all-reduces fp32, so what it measures
is not what the target's GPUs run. In a scale model (its ranks stand for GPUs) the harness
registers the hook as CUDA would, and says so; in a real-time run it leaves the framework as it
is and the run's `framework:` check fails, naming the hook the script configured.

The patch is applied when the script imports the strategy's module (an import hook), so a
script that never imports Lightning pays nothing. Accelerate's CPU path is handled on the
launch side (script_launch.TARGET_LOOKALIKE_ENV).
"""

from __future__ import annotations

import importlib.abc
import importlib.machinery
import sys
from collections.abc import Callable, Sequence
from types import ModuleType
from typing import Any

LIGHTNING_DDP = ("pytorch_lightning.strategies.ddp", "lightning.pytorch.strategies.ddp")


class _AfterImport(importlib.abc.MetaPathFinder):
    """Runs `then(module)` right after one of `names` is first imported."""

    def __init__(self, names: Sequence[str], then: Callable[[ModuleType], None]) -> None:
        self.names = set(names)
        self.then = then

    def find_spec(self, fullname: str, path: Sequence[str] | None,
                  target: ModuleType | None = None) -> importlib.machinery.ModuleSpec | None:
        if fullname not in self.names:
            return None
        spec = importlib.machinery.PathFinder.find_spec(fullname, path)
        if spec is None or spec.loader is None:
            return None
        loader: Any = spec.loader
        exec_module = loader.exec_module

        def exec_then(module: ModuleType) -> None:
            exec_module(module)
            self.then(module)

        loader.exec_module = exec_then
        return spec


def _hook_name(hook: Any) -> str:
    return getattr(hook, "__qualname__", None) or repr(hook)


def lightning_patch(adjusted: list[str], differs: list[str],
                    target_like: bool) -> Callable[[ModuleType], None]:
    def patch(module: ModuleType) -> None:
        strategy = module.DDPStrategy
        original = strategy._register_ddp_hooks

        def register_ddp_hooks(self: Any) -> None:
            hook = getattr(self, "_ddp_comm_hook", None)
            if self.root_device.type == "cuda" or hook is None:
                original(self)
                return
            what = (f"Lightning's DDPStrategy(ddp_comm_hook={_hook_name(hook)}) registers its "
                    "comm hook only when its root device is CUDA")
            if target_like:
                module._register_ddp_comm_hook(
                    model=self.model, ddp_comm_state=self._ddp_comm_state,
                    ddp_comm_hook=hook, ddp_comm_wrapper=self._ddp_comm_wrapper)
                adjusted.append(f"{what}; these CPU ranks stand for the target's GPUs, so the "
                                "harness registered it as CUDA would")
            else:
                original(self)
                differs.append(f"{what}: on these CPU ranks it was not registered, so DDP "
                               "all-reduced uncompressed gradients, unlike the target's GPUs "
                               "(run it in a scale model, where the hook is registered)")

        strategy._register_ddp_hooks = register_ddp_hooks

    return patch


def install(adjusted: list[str], differs: list[str], target_like: bool) -> None:
    """Watch for the frameworks' device-dependent paths; notes go to the two lists."""
    sys.meta_path.insert(0, _AfterImport(LIGHTNING_DDP,
                                         lightning_patch(adjusted, differs, target_like)))
