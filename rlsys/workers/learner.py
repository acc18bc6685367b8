"""Learner ranks (Ray actors) and the driver-side group that fans calls out to them."""

from __future__ import annotations

import contextlib
import socket
import threading

import numpy as np
import ray

from rlsys.algorithms.objectives import PolicyObjective, needs_old_logprobs
from rlsys.config.learner import LearnerConfig
from rlsys.config.schema import LoraConfig
from rlsys.placement.resources import ActorResources
from rlsys.runtime import abort_if_asked
from rlsys.types import TrainBatch
from rlsys.weight_sync.base import SendResult, SyncAddress, WeightTransport
from rlsys.workers.calls import get_all


def _free_port() -> int:
    with socket.socket() as sock:
        sock.bind(("", 0))
        return sock.getsockname()[1]


@ray.remote
class LearnerWorker:
    """One data-parallel rank: a process-group member holding a training backend."""

    def __init__(self, rank: int, world_size: int, threads: int, num_gpus: float) -> None:
        from rlsys.runtime import limit_threads, pick_device, quiet_libraries

        quiet_libraries()
        limit_threads(threads)
        self.rank, self.world_size = rank, world_size
        self.device_type = pick_device(num_gpus)
        self.backend = None
        self.transport: WeightTransport | None = None  # rank 0 only: sends to the engines

    def node_id(self) -> str:
        """The Ray node this rank runs on."""
        return ray.get_runtime_context().get_node_id()

    def devices(self) -> dict:
        """The GPUs Ray gave this rank and the device it trains on
        (``gpu_slots.device_report``)."""
        from rlsys.placement.gpu_slots import device_report

        return device_report(self.device_type)

    def pid(self) -> int:
        """The rank's process id (benchmarks read its peak memory)."""
        import os

        return os.getpid()

    def machine_peak(self, dtype: str, again: bool = False):
        """This rank's measured matmul peak in ``dtype`` and copy bandwidth, with its
        threads (``rlsys.perf.machine.measure``: once per process; ``again``: measured anew,
        the cached figure kept, as a benchmark checks whether the machine slowed)."""
        from rlsys.perf.machine import measure

        fresh = measure.__wrapped__  # functools.cache's undecorated function
        return (fresh if again else measure)(dtype, self.device_type)

    def address(self) -> tuple[str, int]:
        """Where rank 0 hosts the process-group rendezvous."""
        return ray.util.get_node_ip_address(), _free_port()

    def setup(
        self,
        addr: str,
        port: int,
        model_path: str,
        dtype: str,
        cfg: LearnerConfig,
        temperature: float,
        role: str = "policy",
        trainable: bool = True,
        lora: LoraConfig | None = None,
        freeze_vision: bool = False,
    ) -> None:
        """Join the learners' process group and build the backend ``cfg.backend`` names
        (``trainable=False``: forward passes only, no optimizer; ``lora``: adapters only;
        ``freeze_vision``: a VL model's vision tower stays as loaded)."""
        import torch
        import torch.distributed as dist

        from rlsys.backends import build_backend

        device = torch.device(self.device_type)
        if device.type == "cuda":
            torch.cuda.set_device(0)  # Ray exposes this actor's GPU as device 0
        dist.init_process_group(
            _process_group_backend(device, cfg),
            init_method=f"tcp://{addr}:{port}",
            rank=self.rank,
            world_size=self.world_size,
        )
        self.backend = build_backend(
            cfg, model_path, dtype, temperature, device, role, trainable, lora, freeze_vision
        )

    def forward_logprobs(self, batch: TrainBatch):
        return self.backend.forward_logprobs(batch)

    def forward_base_logprobs(self, batch: TrainBatch):
        return self.backend.forward_base_logprobs(batch)

    def forward_values(self, batch: TrainBatch):
        return self.backend.forward_values(batch)

    def greedy_tokens(self, batch: TrainBatch):
        return self.backend.greedy_tokens(batch)

    def forward_scores(self, batch: TrainBatch):
        return self.backend.forward_scores(batch)

    def train_step(
        self, batch: TrainBatch, objective, num_mini_batches: int, epochs: int, seed: int
    ) -> dict[str, float]:
        abort_if_asked("train_step", self.rank)
        return self.backend.train_step(batch, objective, num_mini_batches, epochs, seed)

    def set_lr(self, lr: float, decay_steps: int | None = None) -> None:
        self.backend.set_lr(lr, decay_steps)

    def release_memory(self) -> dict[str, float]:
        """Hand memory this rank holds but does not use back, before colocated engines wake
        into it: the CUDA caching allocator's free blocks (a later step could otherwise grow
        into what a sleeping engine freed), or the C heap's free pages on a CPU. Returns what
        the rank holds after it and what it released; on a GPU also its peak since the last
        call."""
        import gc

        import torch

        from rlsys.runtime import release_free_memory, resident_bytes

        gc.collect()
        if self.device_type == "cuda":
            before = torch.cuda.memory_reserved()
            torch.cuda.empty_cache()
            out = {
                "allocated_bytes": float(torch.cuda.memory_allocated()),
                "peak_bytes": float(torch.cuda.max_memory_allocated()),
                "reserved_bytes": float(torch.cuda.memory_reserved()),
                "released_bytes": float(before - torch.cuda.memory_reserved()),
            }
            torch.cuda.reset_peak_memory_stats()
            return out
        before = resident_bytes()
        release_free_memory()
        after = resident_bytes()
        if before is None or after is None:
            return {}
        return {"resident_bytes": float(after), "released_bytes": float(before - after)}

    def sync_address(self) -> SyncAddress:
        """Where this rank (rank 0) hosts the weight-sync group."""
        from rlsys.weight_sync.group import free_address

        return free_address()

    def connect_weight_sync(
        self, transport: WeightTransport, world_size: int, address: SyncAddress
    ) -> None:
        """Rank 0 joins the weight-sync group as its sender (rank 0 of that group), leaving
        the group it was in (the group is re-formed after a member is replaced)."""
        if self.transport is not None:
            self.transport.close()
        self.transport = transport
        transport.connect(0, world_size, address, self.device_type)

    def publish_weights(self, version: int, bucket_bytes: int) -> SendResult | None:
        """Gather full tensors bucket by bucket; rank 0 sends them to the engines."""
        abort_if_asked("publish_weights", self.rank)
        buckets = self.backend.iter_weight_buckets(bucket_bytes)
        if self.rank == 0:
            return self.transport.send(buckets, version)
        for _ in buckets:  # take part in the gathers
            pass
        return None

    def weights_digest(self, bucket_bytes: int, dtype: str) -> dict[str, str] | None:
        """Rank 0: ``weight_sync.base.digests`` of the full weights a sync would send, cast
        to ``dtype`` (the engines'); the other ranks take part in the gathers, return None."""
        import torch

        from rlsys.weight_sync.base import digests

        named = (
            item
            for bucket in self.backend.iter_weight_buckets(bucket_bytes)
            for item in bucket.items()
        )
        out = digests(named, getattr(torch, dtype))
        return out if self.rank == 0 else None

    def save_hf(self, path: str) -> None:
        abort_if_asked("save_hf", self.rank)
        self.backend.save_hf(path)

    def save_checkpoint(self, path: str) -> None:
        """This rank's part of a sharded checkpoint in the directory ``path``."""
        abort_if_asked("save_checkpoint", self.rank)
        self.backend.save_checkpoint(path)

    def load_checkpoint(self, path: str) -> None:
        """This rank's part of loading the checkpoint in the directory ``path``."""
        self.backend.load_checkpoint(path)

    def shutdown(self) -> None:
        import torch.distributed as dist

        if self.transport is not None:
            self.transport.close()
        if dist.is_initialized():
            dist.destroy_process_group()


class LearnerGroup:
    """``world_size`` learner ranks driven as one: every call goes to every rank. The policy
    learner has ``role="policy"``; a critic is a learner group with ``role="value"``, and
    ``rlsys rm`` trains a reward model in one with ``role="reward"``. The frozen reference
    policy is an inference-only group (``trainable=False``): sharded the same way, placed,
    probed and replaced like learner ranks, with no optimizer."""

    def __init__(
        self,
        cfg: LearnerConfig,
        resources: ActorResources,
        model_path: str,
        dtype: str,
        temperature: float,
        role: str = "policy",
        trainable: bool = True,
        lora: LoraConfig | None = None,
        freeze_vision: bool = False,
    ) -> None:
        self.cfg = cfg
        self.lora = lora if lora is not None and lora.enabled and trainable else None
        # Calls may come from two driver threads (the controller trains while the scoring
        # loop asks a LoRA learner for reference log-probs): each call reaches every rank
        # before the next one starts to, so all ranks run them in one order (their
        # collectives would deadlock otherwise).
        self._submit = threading.Lock()
        self.workers = [
            LearnerWorker.options(**resources.actor_options(rank)).remote(
                rank, cfg.world_size, resources.threads, resources.num_gpus
            )
            for rank in range(cfg.world_size)
        ]
        try:
            addr, port = ray.get(self.workers[0].address.remote())
            ray.get(
                [
                    w.setup.remote(
                        addr,
                        port,
                        model_path,
                        dtype,
                        cfg,
                        temperature,
                        role,
                        trainable,
                        lora,
                        freeze_vision,
                    )
                    for w in self.workers
                ]
            )
        except BaseException:  # a rank that failed to build its model: none stays behind
            for w in self.workers:
                ray.kill(w)
            raise

    def _fan_out(self, batch: TrainBatch) -> list[tuple]:
        """(rank's actor, what to pass it) for a call on ``batch``: put once in the object
        store for several ranks; passed inline to a single rank (the scoring loop calls a one-rank
        reference per group, and a put cost it about 1.5 ms of each 6.5 ms 8-row call)."""
        ref = batch if len(self.workers) == 1 else ray.put(batch)
        return [(w, ref) for w in self.workers]

    def _each(self, method: str, *args) -> list[ray.ObjectRef]:
        """Start ``method(*args)`` on every rank (atomically: see ``_submit``)."""
        with self._submit:
            return [getattr(w, method).remote(*args) for w in self.workers]

    def _call(self, method: str, batch: TrainBatch, *args) -> list[ray.ObjectRef]:
        """Start ``method(batch, *args)`` on every rank (atomically: see ``_submit``)."""
        fan_out = self._fan_out(batch)
        with self._submit:
            return [getattr(w, method).remote(ref, *args) for w, ref in fan_out]

    def _gather_rows(self, method: str, batch: TrainBatch, dtype, shape=None) -> np.ndarray:
        parts = get_all(self._call(method, batch))
        out = np.zeros(batch.loss_mask.shape if shape is None else shape, dtype=dtype)
        for rows, values in parts:
            if len(rows):
                out[rows] = values
        return out

    def forward_logprobs(self, batch: TrainBatch) -> np.ndarray:
        """(B, T-1) log-probabilities of ``batch`` under the current policy."""
        return self._gather_rows("forward_logprobs", batch, np.float32)

    def forward_base_logprobs(self, batch: TrainBatch) -> np.ndarray:
        """(B, T-1) log-probabilities of ``batch`` under the base model, LoRA adapters off:
        a LoRA run's reference policy."""
        return self._gather_rows("forward_base_logprobs", batch, np.float32)

    def forward_values(self, batch: TrainBatch) -> np.ndarray:
        """(B, T-1) critic values of ``batch`` (a ``role="value"`` group)."""
        return self._gather_rows("forward_values", batch, np.float32)

    def greedy_tokens(self, batch: TrainBatch) -> np.ndarray:
        """(B, T-1) argmax next tokens under the current policy."""
        return self._gather_rows("greedy_tokens", batch, np.int64)

    def forward_scores(self, batch: TrainBatch) -> np.ndarray:
        """(B,) sequence scores of ``batch`` (a ``role="reward"`` group)."""
        return self._gather_rows("forward_scores", batch, np.float32, (len(batch),))

    def train_step(
        self,
        batch: TrainBatch,
        objective,
        seed: int,
        num_mini_batches: int | None = None,
        epochs: int | None = None,
    ):
        """One PPO-style update on ``batch``; returns metrics averaged over ranks.

        Mini-batches and epochs default to ``learner.num_mini_batches`` / ``ppo_epochs``.
        """
        mini = num_mini_batches or self.cfg.num_mini_batches
        epochs = epochs or self.cfg.ppo_epochs
        if (
            isinstance(objective, PolicyObjective)
            and batch.old_logprobs is None
            and needs_old_logprobs(epochs, mini, "none", False)
        ):
            raise ValueError(
                f"a policy update of {epochs} epoch(s) x {mini} mini-batch(es) needs the batch's "
                "old_logprobs (forward_logprobs before training): only a single optimizer step "
                "can take them from its own training pass"
            )
        metrics = get_all(self._call("train_step", batch, objective, mini, epochs, seed))
        return metrics[0]

    def node_ids(self) -> list[str]:
        """The Ray node of every rank."""
        return ray.get([w.node_id.remote() for w in self.workers])

    def devices(self) -> list[dict]:
        """Every rank's GPUs and device (``LearnerWorker.devices``)."""
        return ray.get([w.devices.remote() for w in self.workers])

    def machine_peak(self, dtype: str, again: bool = False):
        """The ranks' roofline in ``dtype``: each rank measures at once, as it trains, and
        the peaks and bandwidths add up (``rlsys.perf.machine.MachinePeak``); ``again``:
        measured anew (``LearnerWorker.machine_peak``)."""
        import dataclasses

        peaks = ray.get(self._each("machine_peak", dtype, again))
        published = [p.published_tflops for p in peaks]
        return dataclasses.replace(
            peaks[0],
            threads=sum(p.threads for p in peaks),
            matmul_tflops=sum(p.matmul_tflops for p in peaks),
            copy_gbps=sum(p.copy_gbps for p in peaks),
            published_tflops=None if None in published else sum(published),
        )

    def set_lr(self, lr: float, decay_steps: int | None = None) -> None:
        """Peak learning rate, and the optimizer steps a cosine schedule decays over."""
        ray.get(self._each("set_lr", lr, decay_steps))

    def release_memory(self) -> dict[str, float]:
        """Every rank's ``LearnerWorker.release_memory``, summed over ranks (peaks: the
        largest rank's)."""
        total: dict[str, float] = {}
        for rank in get_all(self._each("release_memory")):
            for key, value in rank.items():
                merge = max if key == "peak_bytes" else (lambda a, b: a + b)
                total[key] = merge(total[key], value) if key in total else value
        return total

    def publish_weights(self, version: int, bucket_bytes: int) -> list[ray.ObjectRef]:
        """Start sending the current weights as ``version``; one ref per rank (rank 0's
        resolves to its ``SendResult``)."""
        return self._each("publish_weights", version, bucket_bytes)

    def weights_digest(self, dtype: str, bucket_bytes: int = 64 << 20) -> dict[str, str]:
        """Digests of the full weights a sync would send, cast to ``dtype``
        (``LearnerWorker.weights_digest``)."""
        return get_all(self._each("weights_digest", bucket_bytes, dtype))[0]

    def save_hf(self, path: str) -> None:
        """Write the policy (or reward model) as a Hugging Face directory."""
        get_all(self._each("save_hf", path))

    def save_checkpoint(self, path: str) -> None:
        """Write model + optimizer state (sharded), schedule and RNG state into the directory
        ``path``, which every rank must see (one node or a shared file system)."""
        get_all(self._each("save_checkpoint", path))

    def load_checkpoint(self, path: str) -> None:
        """Put every rank back in the state ``save_checkpoint(path)`` recorded."""
        get_all(self._each("load_checkpoint", path))

    def shutdown(self, timeout_s: float = 30.0) -> None:
        """Leave the process group if ranks answer in time, then kill every rank regardless
        (a rank stuck in a collective after another failed must not hang the run's exit)."""
        with contextlib.suppress(Exception):  # cleanup must reach the kills below
            ray.get([w.shutdown.remote() for w in self.workers], timeout=timeout_s)
        for w in self.workers:
            ray.kill(w)


def _process_group_backend(device, cfg: LearnerConfig) -> str:
    """gloo on CPU, NCCL on GPU; FSDP2 with CPU offload on a GPU also needs gloo for CPU
    tensors: its sharded parameters and gradients live on the host, and gradient-norm
    clipping and full-weight gathering run collectives on them (NCCL has no CPU backend)."""
    if device.type != "cuda":
        return "gloo"
    return "cuda:nccl,cpu:gloo" if cfg.offload and cfg.backend == "fsdp2" else "nccl"
