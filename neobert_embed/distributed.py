"""The world of processes: rank, size and rank 0's work, their devices, and data-parallel encoding.

Every command asks here whether it is rank 0 (:func:`is_main_process`, the one process that writes
a run's files and draws its progress), which device a rank uses (:meth:`World.device`), and how
processes meet (:func:`init_world`, :func:`on_main`, :func:`launch_on_devices`, :func:`free_port`).

Why data-parallel encoding lives here too: encoding is the expensive part of a build and it
parallelizes perfectly across devices and machines, while training and filling the FAISS index is
one process's job. Under ``torchrun`` (or ``--devices``, which launches the same workers through
torch's own elastic launcher) rank ``r`` of
``w`` encodes the chunks ``i ≡ r (mod w)`` into the build's resumable shards; rank 0 alone writes
the document store, trains and fills the index and writes the manifest, and the other ranks wait on
it and return its result. Processes meet through ``torch.distributed`` (NCCL on GPUs, gloo
otherwise). Since every chunk is encoded alone, the index does not depend on the world size, and a
resume with any world size only encodes the chunks that no shard holds yet.

Example:
    >>> world = current_world()          # Rank 0 of 1 outside torchrun
    >>> world.my_chunks(10, finished={0, 1})
    [2, 3, 4, 5, 6, 7, 8, 9]
"""

from __future__ import annotations

import math
import os
import socket
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from datetime import timedelta
from pathlib import Path
from typing import TYPE_CHECKING, Any, TypeVar, cast

from neobert_embed.devices import default_device
from neobert_embed.errors import UserInputError

if TYPE_CHECKING:
    import numpy as np

T = TypeVar("T")
WAIT_HOURS_ENV = "NEOBERT_EMBED_DIST_TIMEOUT_HOURS"
DEFAULT_WAIT_HOURS = 24.0
ENCODE_CHUNK = 8192


@dataclass(frozen=True)
class World:
    """This process's place among the encoding processes.

    Attributes:
        rank: global rank (``RANK``), 0 when not distributed.
        size: number of processes (``WORLD_SIZE``), 1 when not distributed.
        local_rank: rank on this machine (``LOCAL_RANK``), picks the GPU.
        local_size: processes on this machine (``LOCAL_WORLD_SIZE``; ``size`` when unset).
    """

    rank: int = 0
    size: int = 1
    local_rank: int = 0
    local_size: int = 1

    @property
    def distributed(self) -> bool:
        """True when several processes share the work."""
        return self.size > 1

    @property
    def is_main(self) -> bool:
        """Rank 0 writes the store, the index and the manifest."""
        return self.rank == 0

    def my_chunks(self, n_chunks: int, finished: set[int] | frozenset[int] = frozenset()) -> list[int]:
        """Unfinished chunks this rank encodes: ``i ≡ rank (mod size)``.

        Example:
            >>> World(rank=1, size=2).my_chunks(6, finished={1})
            [3, 5]
        """
        return [c for c in range(self.rank, n_chunks, self.size) if c not in finished]

    def device(self, requested: str | None) -> str | None:
        """The device for this rank: ``cuda:LOCAL_RANK`` when a GPU is asked for (or available).

        Example:
            >>> World(rank=1, size=2, local_rank=1).device("cuda")
            'cuda:1'
        """
        if not self.distributed or (requested is not None and ":" in requested):
            return requested
        if requested == "cuda" or (requested is None and default_device() == "cuda"):
            return f"cuda:{self.local_rank}"
        return requested


def current_world() -> World:
    """Read ``RANK``/``WORLD_SIZE``/``LOCAL_RANK`` as set by ``torchrun`` (or ``--devices``).

    Example:
        >>> current_world().size
        1
    """
    try:
        size = int(os.environ.get("WORLD_SIZE", "1"))
        rank = int(os.environ.get("RANK", "0"))
        local = int(os.environ.get("LOCAL_RANK", str(rank)))
        local_size = int(os.environ.get("LOCAL_WORLD_SIZE", str(size)))
    except ValueError as exc:
        raise UserInputError(f"RANK/WORLD_SIZE/LOCAL_RANK/LOCAL_WORLD_SIZE must be integers: {exc}") from None
    return World(rank=rank, size=size, local_rank=local, local_size=local_size)


def is_main_process() -> bool:
    """True in rank 0 under torchrun, the one process that writes the run's files (or a plain process).

    Example:
        >>> is_main_process()
        True
    """
    return current_world().is_main


def init_world() -> World:
    """Join the process group when running distributed (NCCL with GPUs, else gloo); idempotent.

    Example:
        >>> world = init_world()
    """
    world = current_world()
    if not world.distributed:
        return world
    import torch.distributed as dist

    if not dist.is_initialized():
        backend = "nccl" if dist.is_nccl_available() and default_device() == "cuda" else "gloo"
        hours = float(os.environ.get(WAIT_HOURS_ENV, DEFAULT_WAIT_HOURS))
        dist.init_process_group(backend=backend, timeout=timedelta(hours=hours))
    return world


def barrier(world: World) -> None:
    """Wait for every rank (no-op in one process)."""
    if world.distributed:
        import torch.distributed as dist

        dist.barrier()


def broadcast_from_main(world: World, value: T) -> T:
    """Rank 0's ``value`` on every rank (objects are pickled; no-op in one process)."""
    if not world.distributed:
        return value
    import torch.distributed as dist

    box = [value if world.is_main else None]
    dist.broadcast_object_list(box, src=0)
    return box[0]


def on_main(world: World, work: Callable[[], T]) -> T:
    """Run ``work`` on rank 0 only and hand its result, or its error, to every rank.

    Why: when rank 0 refuses the input (an existing index, a changed corpus) or fails, the other
    ranks must stop with the same message instead of waiting on a barrier forever.

    Example:
        >>> total = on_main(world, lambda: import_corpus(store))
    """
    if not world.distributed:
        return work()
    outcome: tuple[str, object] = ("ok", None)
    if world.is_main:
        try:
            outcome = ("ok", work())
        except BaseException as exc:
            user = isinstance(exc, UserInputError)
            broadcast_from_main(world, ("user", str(exc)) if user else ("error", f"{type(exc).__name__}: {exc}"))
            raise
    kind, payload = broadcast_from_main(world, outcome)
    if kind == "user":
        raise UserInputError(payload)
    if kind == "error":
        raise RuntimeError(f"rank 0 failed: {payload}")
    return cast("T", payload)  # the work's own result, through the broadcast


def encode_across_ranks(world: World, n_texts: int, encode: Callable[[int, int], np.ndarray], scratch: Path,
                        chunk_size: int = ENCODE_CHUNK) -> np.ndarray | None:
    """Encode rows ``[0, n_texts)`` data-parallel; rank 0 gets the whole matrix, the others ``None``.

    ``encode(start, stop)`` encodes one slice. Chunk ``i`` goes to rank ``i mod size`` and is written
    to ``scratch`` as a shard; rank 0 concatenates them in order once every rank is done.

    Example:
        >>> matrix = encode_across_ranks(world, len(texts), lambda a, b: model.encode(texts[a:b]), Path("out.parts"))
    """
    if not world.distributed:
        return encode(0, n_texts)
    from neobert_embed.shards import ShardDirectory

    size = max(1, min(chunk_size, math.ceil(n_texts / world.size)))
    n_chunks = math.ceil(n_texts / size)
    shards = on_main(world, lambda: ShardDirectory(scratch))
    shards.directory.mkdir(parents=True, exist_ok=True)
    for chunk in world.my_chunks(n_chunks):
        shards.write(chunk, encode(chunk * size, min(n_texts, (chunk + 1) * size)))
    barrier(world)
    import numpy as np

    matrix = np.concatenate([np.asarray(shards.load(c)) for c in range(n_chunks)]) if world.is_main else None
    barrier(world)
    if world.is_main:
        shards.remove()
    return matrix


def parse_devices(devices: str) -> list[str]:
    """Split ``--devices cuda:0,cuda:1`` (or ``cpu,cpu``) into a list, refusing empty entries and
    devices this machine does not have (:func:`~neobert_embed.devices.check_device`), before any work.

    Example:
        >>> parse_devices("cuda:0, cuda:1")
        ['cuda:0', 'cuda:1']
    """
    from neobert_embed.devices import check_device

    names = [name.strip() for name in devices.split(",")]
    if not all(names):
        raise UserInputError(f"--devices {devices!r}: give a comma-separated list such as cuda:0,cuda:1 or cpu,cpu")
    return [check_device(name, "--devices") for name in names]


def free_port() -> int:
    """A TCP port on 127.0.0.1 that was free a moment ago (for the launcher's rendezvous)."""
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as sock:
        sock.bind(("127.0.0.1", 0))
        return int(sock.getsockname()[1])


def _device_worker(devices: Sequence[str], work: Callable[..., T], kwargs: dict[str, Any]) -> T:
    """One spawned worker: pin its device, then run ``work`` like a torchrun rank would."""
    world = current_world()
    if "cpu" in devices[world.local_rank]:
        import torch

        torch.set_num_threads(max(1, (os.cpu_count() or 1) // len(devices)))
    return work(**kwargs, device=devices[world.local_rank])


def launch_on_devices(devices: Sequence[str], work: Callable[..., T], **kwargs: Any) -> T:
    """Run ``work(**kwargs, device=d)`` in one process per device and return rank 0's result.

    Uses torch's elastic launcher (what ``torchrun`` runs) on 127.0.0.1 with a free port, so the
    workers are exactly torchrun ranks. ``work`` must be an importable module-level function.

    Example:
        >>> manifest = launch_on_devices(["cuda:0", "cuda:1"], build_index, model=m, corpus=c, output=o)
    """
    if any(entry in os.environ for entry in ("RANK", "WORLD_SIZE")) and current_world().distributed:
        raise UserInputError("--devices cannot be combined with torchrun: pass one or the other")
    if len(devices) == 1:
        return work(**kwargs, device=devices[0])
    import uuid

    from torch.distributed.launcher.api import LaunchConfig, elastic_launch

    config = LaunchConfig(min_nodes=1, max_nodes=1, nproc_per_node=len(devices), run_id=uuid.uuid4().hex,
                          rdzv_backend="c10d", rdzv_endpoint=f"127.0.0.1:{free_port()}", max_restarts=0,
                          monitor_interval=0.2, start_method="spawn")
    try:
        results = elastic_launch(config, _device_worker)(list(devices), work, kwargs)
    except Exception as exc:  # ChildFailedError carries each rank's error file and traceback
        if "UserInputError" not in str(exc):
            raise
        detail = next((line.split("UserInputError:", 1)[1].strip() for line in str(exc).splitlines()
                       if "UserInputError:" in line), str(exc).strip())
        raise UserInputError(detail) from None
    return results[0]
