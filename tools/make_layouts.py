"""Generate the shipped parameter layouts (netsim_ddp/scenario/layouts/*.json) from the real
models' definitions. Run once, in a venv of its own (torchvision and transformers are not
netsim-ddp dependencies):

    python -m venv /tmp/genvenv
    echo /path/to/netsim-ddp/.venv/lib/python3.11/site-packages > \
        /tmp/genvenv/lib/python3.11/site-packages/main_venv.pth   # reuse the project's torch
    /tmp/genvenv/bin/pip install --no-deps torchvision && /tmp/genvenv/bin/pip install transformers
    /tmp/genvenv/bin/python tools/make_layouts.py

The models are built on torch's meta device: shapes only, no weights are allocated or loaded.
A layout lists every module that owns parameters directly, in registration order (roughly the
forward order, so the reverse is the order in which backward releases their gradients), with
the shapes of its parameters; tied parameters (GPT-2's embedding and head) count once.
"""

from __future__ import annotations

import json
import sys
import types
from pathlib import Path

# torchvision registers meta kernels for its C++ ops at import; with a torch build other than
# the one it was built for those ops do not exist. The models here need none of them.
sys.modules["torchvision._meta_registrations"] = types.ModuleType("torchvision._meta_registrations")

import torch  # noqa: E402
import torchvision  # noqa: E402
import transformers  # noqa: E402

OUT = Path(__file__).resolve().parent.parent / "netsim_ddp" / "scenario" / "layouts"


def layout(model: torch.nn.Module) -> list[list[object]]:
    seen: set[int] = set()
    layers = []
    for name, module in model.named_modules():
        shapes = []
        for param in module.parameters(recurse=False):
            if id(param) in seen or not param.requires_grad:
                continue
            seen.add(id(param))
            shapes.append(list(param.shape))
        if shapes:
            layers.append([name or "(root)", shapes])
    return layers


def models() -> dict[str, tuple[str, torch.nn.Module]]:
    vision = torchvision.models
    bert_large = dict(hidden_size=1024, num_hidden_layers=24, num_attention_heads=16,
                      intermediate_size=4096)
    return {
        "resnet50": ("torchvision.models.resnet50()", vision.resnet50()),
        "resnet101": ("torchvision.models.resnet101()", vision.resnet101()),
        "vgg16": ("torchvision.models.vgg16()", vision.vgg16()),
        "inception_v3": ("torchvision.models.inception_v3(init_weights=False) (aux logits)",
                         vision.inception_v3(init_weights=False)),
        "bert-base": ("transformers.BertModel(BertConfig())",
                      transformers.BertModel(transformers.BertConfig())),
        "bert-large": ("transformers.BertModel(BertConfig(hidden_size=1024, "
                       "num_hidden_layers=24, num_attention_heads=16, intermediate_size=4096))",
                       transformers.BertModel(transformers.BertConfig(**bert_large))),
        "gpt2": ("transformers.GPT2LMHeadModel(GPT2Config())",
                 transformers.GPT2LMHeadModel(transformers.GPT2Config())),
    }


def main() -> None:
    OUT.mkdir(parents=True, exist_ok=True)
    with torch.device("meta"):
        built = models()
    for name, (source, model) in built.items():
        layers = layout(model)
        params = sum(torch.Size(shape).numel() for _, shapes in layers for shape in shapes)
        document = {"name": name, "source": source,
                    "generated_with": f"torchvision {torchvision.__version__}, transformers "
                                      f"{transformers.__version__}, tools/make_layouts.py",
                    "params": params, "layers": layers}
        (OUT / f"{name}.json").write_text(json.dumps(document, separators=(",", ":")) + "\n")
        print(f"{name}: {params:,} parameters in {len(layers)} layers")


if __name__ == "__main__":
    main()
