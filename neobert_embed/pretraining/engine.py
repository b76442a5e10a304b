"""The training engine: DeepSpeed (ZeRO 0-3, any number of processes) or plain PyTorch.

Why one small interface (:class:`TrainingEngine`): the training loop must not care whether
gradients are sharded. Both engines take a micro-batch at a time (``forward`` -> ``backward`` ->
``step``), apply the optimizer at accumulation boundaries, clip gradients, and own their checkpoint
format (complete state saved and loaded, whole fp32 weights read back). DeepSpeed is driven through
``deepspeed.initialize`` (accelerate's DeepSpeed path breaks with several CPU processes); when it
is not installed the same loop runs in plain PyTorch in one process, with a warning.

Launching: ``torchrun --nproc-per-node N -m neobert_embed.cli pretrain ...`` or
``deepspeed --num_gpus N ...``; a plain single process needs nothing (the rendezvous variables
are filled in).

Example:
    >>> engine = build_engine(recipe, MaskedLMObjective(model))
    >>> loss, correct, count = engine.forward(**batch)
    >>> engine.backward(loss); engine.step()
"""

from __future__ import annotations

import contextlib
import logging
import os
import warnings
from collections.abc import Iterator
from pathlib import Path
from typing import TYPE_CHECKING, Any, Protocol, runtime_checkable

import torch
import torch.distributed as dist

from neobert_embed.console import child_output_captured, environment
from neobert_embed.devices import default_device
from neobert_embed.distributed import current_world, free_port
from neobert_embed.errors import UserInputError
from neobert_embed.pretraining.recipe import PretrainRecipe
from neobert_embed.pretraining.schedule import build_scheduler
from neobert_embed.training_precision import resolve_training_precision

if TYPE_CHECKING:
    from torch.optim.lr_scheduler import LambdaLR

EXTENSIONS_CACHE = Path.home() / ".cache" / "neobert-embed" / "torch_extensions"
ObjectiveOutput = tuple[torch.Tensor, torch.Tensor, torch.Tensor]  # loss, correct predictions, masked tokens


@runtime_checkable
class TrainingEngine(Protocol):
    """What the loop and :mod:`checkpoint` use. ``save``/``load``: every process, one directory;
    ``consolidated_state_dict`` (for export): the whole fp32 weights saved there."""

    kind: str
    precision: str  # what the run computes in and why, e.g. "bf16 autocast: avx512_bf16"
    module: torch.nn.Module
    optimizer: torch.optim.Optimizer
    rank: int
    world_size: int

    def forward(self, **batch: torch.Tensor | int) -> ObjectiveOutput: ...
    def backward(self, loss: torch.Tensor) -> None: ...
    def step(self) -> None: ...
    def grad_norm(self) -> float | None: ...
    def all_reduce_sum(self, tensor: torch.Tensor) -> torch.Tensor: ...
    def barrier(self) -> None: ...
    def save(self, directory: Path) -> None: ...
    def load(self, directory: Path) -> None: ...
    @classmethod
    def consolidated_state_dict(cls, directory: Path) -> dict[str, torch.Tensor]: ...


def deepspeed_available() -> bool:
    """True when the ``pretrain`` extra (deepspeed) is importable."""
    try:
        import deepspeed  # noqa: F401
    except ImportError:
        return False
    return True


def fill_rendezvous_env() -> None:
    """Let a plain ``python``/``neobert-embed`` process act as a world of one (torchrun and the
    deepspeed launcher set these variables themselves)."""
    if "WORLD_SIZE" not in os.environ:
        os.environ.update(RANK="0", LOCAL_RANK="0", WORLD_SIZE="1")
        os.environ.setdefault("MASTER_ADDR", "127.0.0.1")
        os.environ.setdefault("MASTER_PORT", str(free_port()))
    os.environ.setdefault("TORCH_EXTENSIONS_DIR", str(EXTENSIONS_CACHE))


RENDEZVOUS_KEYS = ("RANK", "LOCAL_RANK", "WORLD_SIZE", "MASTER_ADDR", "MASTER_PORT")


@contextlib.contextmanager
def process_scope(cpu_threads: int | None) -> Iterator[None]:
    """Run a pretraining session without leaking its process-wide settings to the caller.

    A plain (not launched) process becomes a world of one for DeepSpeed; afterwards the
    rendezvous variables and torch's thread count are put back, so later work in the same process
    is not left single-threaded or told it was launched by torchrun. The world-of-one process
    group itself stays (DeepSpeed caches it for the next run); code that must not see it, such as
    the demo's fine-tuning, runs pretraining in a child process.

    Example:
        >>> with process_scope(cpu_threads=1):
        ...     run_the_loop()
    """
    saved_threads = torch.get_num_threads()
    launched = "WORLD_SIZE" in os.environ
    if cpu_threads and default_device() == "cpu":
        torch.set_num_threads(cpu_threads)
    try:
        with environment(keep=() if launched else RENDEZVOUS_KEYS):
            fill_rendezvous_env()
            yield
    finally:
        torch.set_num_threads(saved_threads)


def init_distributed() -> None:
    """Join the process group early when launched with several processes (so process 0 can prepare
    the corpus while the others wait); a no-op for one process or without deepspeed."""
    if current_world().distributed and deepspeed_available():
        join_process_group()


def join_process_group() -> None:
    """Start DeepSpeed's process group for this process (gloo on CPU, nccl on GPUs).

    A world of one on CPU skips DeepSpeed's shared-memory all-reduce, which it would otherwise compile
    first (:func:`_skip_shared_memory_collectives`).

    Example:
        >>> fill_rendezvous_env(); join_process_group()   # then deepspeed.initialize(...)
    """
    import deepspeed

    with child_output_captured():  # DeepSpeed compiles test programs here to probe its ops
        if not current_world().distributed and default_device() == "cpu":
            _skip_shared_memory_collectives()
        deepspeed.init_distributed(dist_backend="nccl" if default_device() == "cuda" else "gloo", verbose=False)


def _skip_shared_memory_collectives() -> None:
    """Keep DeepSpeed from building its CPU shared-memory all-reduce for a world of one.

    Why: DeepSpeed compiles that C++ op (``deepspeed_shm_comm``) the first time a CPU process group
    starts, in every new virtualenv: 45-90 s on two cores, and a compiler it needs, for collectives a
    single process never runs. DeepSpeed builds only the ops it lists as compatible, so this process
    lists that one as not; several processes (torchrun) still get it.

    Example:
        >>> _skip_shared_memory_collectives()   # then deepspeed.init_distributed(dist_backend="gloo")
    """
    from deepspeed import ops
    from deepspeed.accelerator import get_accelerator

    builder = get_accelerator().create_op_builder("ShareMemCommBuilder")  # as deepspeed.comm asks for it
    if builder is not None:
        ops.__compatible_ops__[builder.NAME] = False


def _to(batch: dict[str, Any], device: torch.device) -> dict[str, Any]:
    """Move the tensors of a batch to the training device (ints such as ``max_seqlen`` stay)."""
    return {k: v.to(device, non_blocking=True) if isinstance(v, torch.Tensor) else v for k, v in batch.items()}


def build_optimizer(recipe: PretrainRecipe, model: torch.nn.Module, fused: bool = False
                    ) -> tuple[torch.optim.AdamW, LambdaLR]:
    """AdamW with the recipe's settings (norms, biases and embeddings get no weight decay) and
    its learning-rate schedule. ``fused``: one kernel per step for all parameters (needs them on
    the GPU already; the same update and state as the default multi-tensor kernel)."""
    decay, no_decay = [], []
    for name, param in model.named_parameters():
        if param.requires_grad:
            (no_decay if param.ndim < 2 or "norm" in name else decay).append(param)
    opt = recipe.optimizer
    groups = [{"params": decay, "weight_decay": opt.weight_decay}, {"params": no_decay, "weight_decay": 0.0}]
    optimizer = torch.optim.AdamW(groups, lr=opt.lr, betas=opt.betas, eps=opt.eps, fused=fused or None)
    schedule = recipe.schedule
    return optimizer, build_scheduler(optimizer, schedule.warmup_steps, recipe.training.max_steps,
                                      schedule.decay_fraction, schedule.final_lr_ratio)


def load_tensors(path: Path, *, mmap: bool = False) -> Any:
    """``torch.load`` of a checkpoint file with ``weights_only=True``: tensors and plain data (dicts, lists,
    numbers, strings), never code. DeepSpeed's ZeRO optimizer files also hold three of its record classes
    (:func:`_deepspeed_records`), rebuilt from their fields like a dict; anything else is refused by
    torch's unpickler (``pickle.UnpicklingError``).

    Why: a checkpoint whose engine state or RNG file held a pickle payload ran it on ``pretrain export``
    and ``pretrain --resume``, although ``checkpoint.json`` pins the files (whoever can write a file can
    re-hash it). DeepSpeed itself reads its files with ``weights_only=False``, so :func:`check_tensor_files`
    reads each of them this way first.

    Example:
        >>> sorted(load_tensors(Path("runs/x/checkpoints/step-00001000/engine.pt")))
        ['module', 'optimizer', 'scheduler']
    """
    import pickle

    try:
        return torch.load(path, map_location="cpu", weights_only=True, mmap=mmap)
    except pickle.UnpicklingError:
        records = _deepspeed_records()
        if not records:
            raise
    with torch.serialization.safe_globals(records):
        return torch.load(path, map_location="cpu", weights_only=True, mmap=mmap)


def _deepspeed_records() -> list[type]:
    """The plain record classes DeepSpeed pickles into ZeRO optimizer states (none without DeepSpeed)."""
    try:
        from deepspeed.runtime.fp16.loss_scaler import LossScaler
        from deepspeed.runtime.zero.config import ZeroStageEnum
        from deepspeed.utils.tensor_fragment import fragment_address
    except ImportError:
        return []
    return [LossScaler, ZeroStageEnum, fragment_address]


def check_tensor_files(directory: Path, skip: str = "") -> None:
    """Read every ``*.pt`` file under ``directory`` (but those whose name starts with ``skip``) as
    :func:`load_tensors` does, memory-mapped (no tensor data is read): raises ``pickle.UnpicklingError`` for
    one that holds more than tensors and plain data, before an engine loads it.

    Example:
        >>> check_tensor_files(Path("runs/x/checkpoints/step-00001000"), skip="rng-")
    """
    import pickle

    for path in sorted(directory.rglob("*.pt")):
        if skip and path.name.startswith(skip):
            continue
        try:
            load_tensors(path, mmap=True)
        except pickle.UnpicklingError:
            raise pickle.UnpicklingError(f"{path}: holds more than tensors and plain data") from None


class TorchEngine:
    """Single-process PyTorch engine (bf16 through autocast, fp32 master weights and optimizer; on a
    GPU the fused AdamW kernel, as the contrastive trainer uses)."""

    kind = "torch"
    STATE = "engine.pt"

    def __init__(self, recipe: PretrainRecipe, module: torch.nn.Module) -> None:
        self.device = torch.device(default_device())
        self.module = module.to(self.device)
        self.optimizer, self.scheduler = build_optimizer(recipe, module, fused=self.device.type == "cuda")
        self.accumulation = recipe.training.gradient_accumulation_steps
        self.clip = recipe.optimizer.grad_clip
        chosen = resolve_training_precision(recipe.training.precision, self.device.type)
        self.bf16, self.precision = chosen.bf16, chosen.label
        self.rank, self.world_size = 0, 1
        self._micro = 0
        self._grad_norm: float | None = None

    def forward(self, **batch: torch.Tensor | int) -> ObjectiveOutput:
        with torch.autocast(self.device.type, dtype=torch.bfloat16, enabled=self.bf16):
            return self.module(**_to(batch, self.device))

    def backward(self, loss: torch.Tensor) -> None:
        (loss / self.accumulation).backward()

    def step(self) -> None:
        self._micro += 1
        if self._micro % self.accumulation:
            return
        params = [p for p in self.module.parameters() if p.grad is not None]
        self._grad_norm = float(torch.nn.utils.clip_grad_norm_(params, self.clip if self.clip > 0 else float("inf")))
        self.optimizer.step()
        self.scheduler.step()
        self.optimizer.zero_grad(set_to_none=True)

    def grad_norm(self) -> float | None:
        return self._grad_norm

    def save(self, directory: Path) -> None:
        torch.save({"module": self.module.state_dict(), "optimizer": self.optimizer.state_dict(),
                    "scheduler": self.scheduler.state_dict()}, directory / self.STATE)

    @classmethod
    def consolidated_state_dict(cls, directory: Path) -> dict[str, torch.Tensor]:
        return load_tensors(directory / cls.STATE)["module"]

    def load(self, directory: Path) -> None:
        state = load_tensors(directory / self.STATE)
        self.module.load_state_dict(state["module"])
        self.optimizer.load_state_dict(state["optimizer"])
        self.scheduler.load_state_dict(state["scheduler"])

    def all_reduce_sum(self, tensor: torch.Tensor) -> torch.Tensor:
        return tensor

    def barrier(self) -> None:
        """Nothing to wait for in one process."""


class DeepSpeedEngine:
    """``deepspeed.initialize`` with the recipe's ZeRO stage, precision, clipping and accumulation.

    bf16 on a GPU is DeepSpeed's bf16 mode (bf16 weights, fp32 master copy in the optimizer). On the
    CPU it is ``torch.autocast`` around the forward of an fp32 DeepSpeed engine instead (fp32 weights,
    gradients and optimizer; matrix products in bf16, the loss in fp32): see :meth:`_deepspeed_bf16_mode`.
    """

    kind = "deepspeed"
    TAG = "engine"

    def __init__(self, recipe: PretrainRecipe, module: torch.nn.Module) -> None:
        import deepspeed

        fill_rendezvous_env()
        logging.getLogger("DeepSpeed").setLevel(logging.WARNING)
        join_process_group()
        training = recipe.training
        self.device_type = default_device()
        chosen = resolve_training_precision(training.precision, self.device_type)
        deepspeed_bf16 = chosen.bf16 and self._deepspeed_bf16_mode()
        self.autocast = chosen.bf16 and not deepspeed_bf16
        self.precision = f"bf16 (DeepSpeed bf16 mode): {chosen.reason}" if deepspeed_bf16 else chosen.label
        self.optimizer, scheduler = build_optimizer(recipe, module)
        config = {
            "train_micro_batch_size_per_gpu": training.micro_batch_size,
            "gradient_accumulation_steps": training.gradient_accumulation_steps,
            "gradient_clipping": recipe.optimizer.grad_clip,
            "zero_optimization": {"stage": training.zero_stage},
            "bf16": {"enabled": deepspeed_bf16},
            "zero_allow_untested_optimizer": True,
            "steps_per_print": 2**62,
            "wall_clock_breakdown": False,
        }
        self.engine, _, _, _ = deepspeed.initialize(model=module, optimizer=self.optimizer,
                                                    lr_scheduler=scheduler, config=config)
        self.module = self.engine.module
        self.device = self.engine.device
        self.rank = self.engine.global_rank
        self.world_size = self.engine.world_size
        self.zero_stage = training.zero_stage

    @staticmethod
    def _deepspeed_bf16_mode() -> bool:
        """bf16 through DeepSpeed's own bf16 mode (on a GPU, as before) rather than CPU autocast.

        Why autocast on the CPU: measured on ``recipes/pretrain-tiny.yaml`` (one thread, AMD EPYC with
        avx512_bf16, steps of the three set-ups interleaved in one process), both ran at 1.13× the fp32
        step rate (1.58× both with a 384-wide, 4-layer model), but over the same 200 steps autocast's
        loss stayed closer to fp32's (max per-step |Δ| 0.054 against 0.115; final 5.761 and 5.758
        against fp32's 5.765): its weights stay fp32, only the matrix products round to bf16.
        """
        return torch.cuda.is_available()

    def forward(self, **batch: torch.Tensor | int) -> ObjectiveOutput:
        with torch.autocast(self.device_type, dtype=torch.bfloat16, enabled=self.autocast):
            return self.engine(**_to(batch, self.device))

    def backward(self, loss: torch.Tensor) -> None:
        self.engine.backward(loss)

    def step(self) -> None:
        if self.zero_stage == 0 and self.engine.is_gradient_accumulation_boundary():
            grads = [p.grad.float().norm() for p in self.module.parameters() if p.grad is not None]
            self._stage0_norm = float(torch.linalg.vector_norm(torch.stack(grads))) if grads else None
        self.engine.step()

    def grad_norm(self) -> float | None:
        norm = self.engine.get_global_grad_norm()
        if norm is None and self.zero_stage == 0:
            return getattr(self, "_stage0_norm", None)
        return None if norm is None else float(norm)

    def save(self, directory: Path) -> None:
        self.engine.save_checkpoint(str(directory), tag=self.TAG, save_latest=False)

    def load(self, directory: Path) -> None:
        path, _ = self.engine.load_checkpoint(str(directory), tag=self.TAG, load_optimizer_states=True,
                                              load_lr_scheduler_states=True)
        if path is None:
            raise FileNotFoundError(f"{directory}: DeepSpeed found no checkpoint to load")

    @classmethod
    def consolidated_state_dict(cls, directory: Path) -> dict[str, torch.Tensor]:
        """Through DeepSpeed's own readers: ZeRO 1-3 shards merged into fp32 by
        ``get_fp32_state_dict_from_zero_checkpoint``; under ZeRO 0 the model states are whole."""
        from deepspeed.utils import zero_to_fp32

        model_states = zero_to_fp32.get_model_state_files(str(directory / cls.TAG))[0]
        states = load_tensors(Path(model_states), mmap=True)  # read the stage, not the tensors
        if states["ds_config"]["zero_optimization"]["stage"]:
            return zero_to_fp32.get_fp32_state_dict_from_zero_checkpoint(str(directory), tag=cls.TAG)
        return {key: value.float() for key, value in states["module"].items()}

    def all_reduce_sum(self, tensor: torch.Tensor) -> torch.Tensor:
        if self.world_size > 1:
            on_device = tensor.to(self.device)  # NCCL reduces only GPU tensors
            dist.all_reduce(on_device)
            return on_device.cpu()
        return tensor

    def barrier(self) -> None:
        if self.world_size > 1:
            dist.barrier()


CHECKPOINT_FORMATS: dict[str, type[TrainingEngine]] = {engine.kind: engine for engine in (TorchEngine, DeepSpeedEngine)}


def build_engine(recipe: PretrainRecipe, module: torch.nn.Module) -> TrainingEngine:
    """The engine the recipe asks for (``training.engine``: auto | deepspeed | torch).

    Example:
        >>> build_engine(recipe, objective).kind
        'deepspeed'
    """
    wanted, several = recipe.training.engine, current_world().distributed
    if wanted == "torch":
        if several:
            raise UserInputError("training.engine 'torch' runs one process; use 'deepspeed' with torchrun")
        return TorchEngine(recipe, module)
    if deepspeed_available():
        return DeepSpeedEngine(recipe, module)
    if wanted == "deepspeed" or several:
        raise UserInputError("deepspeed is not installed but training.engine 'deepspeed' or a multi-process "
                             "launch needs it; install it with `pip install neobert-embed[pretrain]`")
    ignored = f" (training.zero_stage {recipe.training.zero_stage} ignored)" if recipe.training.zero_stage else ""
    warnings.warn(f"deepspeed is not installed; training in plain PyTorch on one process{ignored}; "
                  "install neobert-embed[pretrain] for ZeRO and multi-GPU runs", stacklevel=2)
    return TorchEngine(recipe, module)
