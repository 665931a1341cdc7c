"""How `forge pretrain` spreads the training state over its processes (train.sharding).

ddp   Accelerate wraps the model in DistributedDataParallel: every process holds the whole model, its gradients
      and the AdamW states; the gradients are all-reduced after the last micro-batch of each step.
fsdp  PyTorch's FSDP2 (`torch.distributed.fsdp.fully_shard`): each decoder layer is one unit and the root (the
      embeddings, the final norm and the tied head) another. The layers are the modules of the classes the model
      itself names in `_no_split_modules` (models/shape.py), so any family shards the same way. Every process
      keeps 1/N of each unit's parameters, gradients and AdamW states (DTensors sharded on dim 0); a unit's whole
      weights are all-gathered just before its forward and its backward and freed after, and its gradients are
      reduce-scattered back to the shards.
      With train.precision=bf16 the gathered weights are bf16 (the shards stay fp32, the master copy) and the
      gradients are reduced in fp32. Memory per GPU: `forge plan --set train.sharding=fsdp --set plan.num_gpus=N`.

FSDP2 runs on the process group Accelerate has already set up (NCCL on GPUs, gloo on CPUs), so the code that
shards on GPUs is the code the tests run on two CPU processes. Accelerate's own FSDP is not used: Accelerate 1.16
enables it only on GPUs (a CPU run stays DDP), so no test could exercise it, and it would bring its own
checkpoint formats. Everything else (the process group, seeds, the loss and metric reductions, the optimizer
wrapper) stays Accelerate's, the same for both.
"""

from __future__ import annotations

import logging

import torch

from forge import ForgeError
from forge.config import TrainConfig

log = logging.getLogger("forge.pretrain")


def use_fsdp(tcfg: TrainConfig, processes: int, precision: str) -> bool:
    """Whether this run shards: train.sharding=fsdp over more than one process."""
    if tcfg.sharding != "fsdp":
        return False
    if processes == 1:
        # the same config then runs (or resumes) on one process, unsharded: checkpoints hold whole tensors either way
        log.warning("pretrain: train.sharding=fsdp on 1 process: nothing to shard, training unsharded (launch N "
                    "processes with torchrun or accelerate launch to shard N ways)")  # fmt: skip
        return False
    if precision == "fp16":
        raise ForgeError(
            "train.sharding=fsdp with fp16: FSDP here trains in bf16 or fp32 (fp16 needs a loss scaler that "
            "understands sharded gradients); set train.precision=bf16 (or fp32), or train.sharding=ddp"
        )
    return True


def shard(model: torch.nn.Module, device_type: str, precision: str) -> None:
    """FSDP2 in place: each decoder layer, then the root. Call it before building the optimizer, which must hold
    the sharded parameters (fully_shard replaces every parameter with a DTensor)."""
    import torch.distributed as dist
    from torch.distributed.device_mesh import DeviceMesh
    from torch.distributed.fsdp import MixedPrecisionPolicy, fully_shard

    mesh = DeviceMesh.from_group(dist.group.WORLD, device_type)  # the processes Accelerate set up
    dtype = torch.bfloat16 if precision == "bf16" else None  # None: the fp32 parameters as they are
    policy = MixedPrecisionPolicy(param_dtype=dtype, reduce_dtype=torch.float32)
    for layer in decoder_layers(model):
        fully_shard(layer, mesh=mesh, mp_policy=policy)
    fully_shard(model, mesh=mesh, mp_policy=policy)


def decoder_layers(model: torch.nn.Module) -> list[torch.nn.Module]:
    """The repeated blocks of the transformers model: the classes of its `_no_split_modules` (llama's
    LlamaDecoderLayer, gpt2's GPT2Block, qwen3's Qwen3DecoderLayer...)."""
    from models.shape import decoder_layers as blocks

    return blocks(model)


def clip_grad_norm(parameters: list[torch.nn.Parameter], max_norm: float) -> float:
    """torch's clip_grad_norm_, for sharded gradients too: under FSDP each process's norm is that of its shards
    (a DTensor pending a sum over the processes), made whole before the gradients are scaled by it."""
    from torch.distributed.tensor import DTensor

    grads = [p.grad for p in parameters if p.grad is not None]
    total = torch.nn.utils.get_total_norm(grads)
    if isinstance(total, DTensor):
        total = total.full_tensor()
    torch.nn.utils.clip_grads_with_norm_(parameters, max_norm, total)
    return float(total)


def local_parameters(model: torch.nn.Module) -> int:
    """The parameters this process holds: all of them, or its shards under FSDP."""
    from torch.distributed.tensor import DTensor

    return sum((p.to_local() if isinstance(p, DTensor) else p).numel() for p in model.parameters())
