"""Thunder's seed DDP example, with tracepass doing the DDP.

    torchrun --standalone --nproc-per-node 2 examples/thunder_ddp.py

The program is the example of `thunder.distributed.ddp`'s docstring, with one line changed:
`tracepass.thunder.ddp(thunder.jit(model))` instead of `thunder.distributed.ddp(...)`. It runs
on GPUs with NCCL when CUDA is there, else on the CPU with gloo. Rank 0 prints the 10 losses
(averaged over ranks) as `# i-th loss: v`.
"""

import math
import os

import torch
import torch.distributed as tdist
import torch.nn as nn
import torch.nn.functional as F

import thunder
import tracepass.thunder

LOCAL_RANK = int(os.environ["LOCAL_RANK"])
USE_CUDA = torch.cuda.is_available() and torch.cuda.device_count() > LOCAL_RANK
DEVICE = torch.device("cuda", LOCAL_RANK) if USE_CUDA else torch.device("cpu")
BATCH_SIZE = 8
IN_FEATURES = 32
OUT_FEATURES = 64
N_CLASSES = 4


def get_batch() -> tuple[torch.Tensor, torch.Tensor]:
    x = torch.randn(BATCH_SIZE, IN_FEATURES, device=DEVICE, requires_grad=True)
    y = torch.randn(BATCH_SIZE, N_CLASSES, device=DEVICE).softmax(dim=1).requires_grad_()
    return x, y


def new_gelu(a: torch.Tensor):
    return 0.5 * a * (1.0 + torch.tanh(math.sqrt(2.0 / math.pi) * (a + 0.044715 * torch.pow(a, 3.0))))


class MyModel(nn.Module):
    def __init__(self) -> None:
        super().__init__()
        self.l1 = nn.Linear(IN_FEATURES, OUT_FEATURES)
        self.l2 = nn.Linear(OUT_FEATURES, N_CLASSES)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        h = new_gelu(self.l1(x))
        return self.l2(h)


def main():
    tdist.init_process_group(backend="nccl" if USE_CUDA else "gloo")
    if USE_CUDA:
        torch.cuda.set_device(DEVICE)
    torch.manual_seed(1234 + tdist.get_rank())

    model = MyModel().to(DEVICE)
    compiled = tracepass.thunder.ddp(thunder.jit(model))
    optimizer = torch.optim.AdamW(compiled.parameters())
    losses = []
    loss_all_reduce_workers = []

    for _ in range(10):
        optimizer.zero_grad()
        x, y = get_batch()
        out = compiled(x)
        loss = F.cross_entropy(y, out)
        loss.backward()
        optimizer.step()
        with torch.no_grad():
            losses.append(loss.detach())
            op = tdist.ReduceOp.AVG if USE_CUDA else tdist.ReduceOp.SUM  # gloo has no AVG
            loss_all_reduce_workers.append(tdist.all_reduce(losses[-1], op=op, async_op=True))

    if LOCAL_RANK == 0:
        for i, (loss, worker) in enumerate(zip(losses, loss_all_reduce_workers)):
            assert worker.wait()
            value = loss.item() if USE_CUDA else loss.item() / tdist.get_world_size()
            print(f"# {i}-th loss: {value}")
    else:
        for worker in loss_all_reduce_workers:
            worker.wait()
    tdist.destroy_process_group()


if __name__ == "__main__":
    main()
