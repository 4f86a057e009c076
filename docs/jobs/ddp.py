"""A first data-parallel training job: PyTorch's DistributedDataParallel over the tasks Slurm
starts (one per node, or one per GPU), NCCL between GPUs and gloo where there are none.

Each rank trains the same small model on its own shard of data; after every backward pass DDP
all-reduces the gradients, so the ranks' weights stay equal. Submit ddp.sbatch beside it.
"""

import os
import socket

import torch
import torch.distributed as dist
from torch.nn.parallel import DistributedDataParallel


def main() -> None:
    # Slurm says who this task is; MASTER_ADDR and MASTER_PORT come from ddp.sbatch
    rank = int(os.environ["SLURM_PROCID"])
    world = int(os.environ["SLURM_NTASKS"])
    local = int(os.environ.get("SLURM_LOCALID", "0"))
    gpu = torch.cuda.is_available()
    if gpu:
        torch.cuda.set_device(local)
    dist.init_process_group("nccl" if gpu else "gloo", rank=rank, world_size=world)
    device = torch.device("cuda", local) if gpu else torch.device("cpu")

    torch.manual_seed(0)  # the same model and problem on every rank
    model = torch.nn.Linear(32, 1).to(device)
    ddp = DistributedDataParallel(model, device_ids=[local] if gpu else None)
    optimizer = torch.optim.SGD(ddp.parameters(), lr=0.05)
    truth = torch.randn(32, 1, device=device)
    shard = torch.Generator(device=device).manual_seed(1000 + rank)  # each rank its own data
    losses = []
    for _ in range(100):
        x = torch.randn(64, 32, device=device, generator=shard)
        loss = torch.nn.functional.mse_loss(ddp(x), x @ truth)
        optimizer.zero_grad()
        loss.backward()  # the gradients all-reduced across the ranks here
        optimizer.step()
        losses.append(loss.item())

    # the ranks' weights are equal: their sum is the world size times this rank's
    weights = model.weight.detach().clone()
    summed = weights.clone()
    dist.all_reduce(summed)
    equal = torch.allclose(summed, weights * world)
    print(
        f"rank {rank} of {world} on {socket.gethostname()}: {dist.get_backend()}, "
        f"loss {losses[0]:.3f} -> {losses[-1]:.3g}, weights equal on every rank: {equal}",
        flush=True,
    )
    dist.destroy_process_group()


if __name__ == "__main__":
    main()
