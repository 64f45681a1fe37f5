"""A small PyTorch Lightning training script written as Lightning's users write theirs: a
LightningModule, a DataLoader, a Trainer with the DDP strategy and an fp16 compression comm
hook, started by torchrun. Nothing in it knows about netsim-ddp.

    torchrun --nnodes 2 --nproc-per-node 2 ... train.py --devices 2 --num-nodes 2
"""

import argparse

import pytorch_lightning as pl
import torch
from pytorch_lightning.strategies import DDPStrategy
from torch import nn
from torch.distributed.algorithms.ddp_comm_hooks import default_hooks
from torch.utils.data import DataLoader, TensorDataset


class Classifier(pl.LightningModule):
    def __init__(self, width: int, layers: int, lr: float) -> None:
        super().__init__()
        blocks: list[nn.Module] = []
        for _ in range(layers):
            blocks += [nn.Linear(width, width), nn.ReLU()]
        self.net = nn.Sequential(*blocks, nn.Linear(width, 10))
        self.lr = lr

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.net(x)

    def training_step(self, batch, batch_idx):  # type: ignore[no-untyped-def]
        inputs, labels = batch
        loss = nn.functional.cross_entropy(self(inputs), labels)
        self.log("loss", loss)
        return loss

    def configure_optimizers(self):  # type: ignore[no-untyped-def]
        return torch.optim.SGD(self.parameters(), lr=self.lr, momentum=0.9)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__)
    parser.add_argument("--steps", type=int, default=50)
    parser.add_argument("--width", type=int, default=1024)
    parser.add_argument("--layers", type=int, default=4)
    parser.add_argument("--batch-size", type=int, default=16)
    parser.add_argument("--lr", type=float, default=0.01)
    parser.add_argument("--devices", type=int, default=1)
    parser.add_argument("--num-nodes", type=int, default=1)
    parser.add_argument("--no-fp16-hook", action="store_true")
    args = parser.parse_args()
    pl.seed_everything(0)
    data = TensorDataset(torch.randn(64 * args.batch_size, args.width),
                         torch.randint(0, 10, (64 * args.batch_size,)))
    strategy = DDPStrategy(ddp_comm_hook=None if args.no_fp16_hook
                           else default_hooks.fp16_compress_hook)
    trainer = pl.Trainer(max_steps=args.steps, devices=args.devices, num_nodes=args.num_nodes,
                         strategy=strategy, logger=False, enable_checkpointing=False,
                         enable_progress_bar=False, enable_model_summary=False)
    trainer.fit(Classifier(args.width, args.layers, args.lr),
                DataLoader(data, batch_size=args.batch_size, shuffle=True))


if __name__ == "__main__":
    main()
