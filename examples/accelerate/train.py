"""A small training script written the way Hugging Face Accelerate's users write theirs: an
Accelerator, `prepare`, `accelerator.backward`, and nothing that knows about netsim-ddp.

    accelerate launch train.py --steps 50        (or torchrun --nproc-per-node 2 train.py)
"""

import argparse

import torch
from accelerate import Accelerator
from torch import nn
from torch.utils.data import DataLoader, TensorDataset


def parse() -> argparse.Namespace:
    parser = argparse.ArgumentParser(description=__doc__)
    parser.add_argument("--steps", type=int, default=50)
    parser.add_argument("--width", type=int, default=1024)
    parser.add_argument("--layers", type=int, default=4)
    parser.add_argument("--batch-size", type=int, default=16)
    parser.add_argument("--lr", type=float, default=1e-3)
    parser.add_argument("--log-every", type=int, default=10)
    return parser.parse_args()


def main() -> None:
    args = parse()
    accelerator = Accelerator()
    torch.manual_seed(0)
    layers: list[nn.Module] = []
    for _ in range(args.layers):
        layers += [nn.Linear(args.width, args.width), nn.GELU()]
    model = nn.Sequential(*layers, nn.Linear(args.width, 10))
    optimizer = torch.optim.AdamW(model.parameters(), lr=args.lr)
    data = TensorDataset(torch.randn(64 * args.batch_size, args.width),
                         torch.randint(0, 10, (64 * args.batch_size,)))
    loader = DataLoader(data, batch_size=args.batch_size, shuffle=True)
    model, optimizer, loader = accelerator.prepare(model, optimizer, loader)
    step = 0
    while step < args.steps:
        for inputs, labels in loader:
            loss = nn.functional.cross_entropy(model(inputs), labels)
            accelerator.backward(loss)
            optimizer.step()
            optimizer.zero_grad()
            step += 1
            if step % args.log_every == 0:
                accelerator.print(f"step {step} loss {loss.item():.4f}")
            if step >= args.steps:
                break
    accelerator.end_training()


if __name__ == "__main__":
    main()
