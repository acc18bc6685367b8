"""Rollout workers (Ray actors holding an engine) and the pool that spreads prompts over them."""

from __future__ import annotations

import contextlib
import dataclasses
import os

import numpy as np
import ray

from rlsys.config.schema import RolloutConfig
from rlsys.placement import ActorResources, thread_env
from rlsys.types import Completion, SamplingParams
from rlsys.weight_sync.base import SyncAddress, WeightTransport, WeightUpdate


@ray.remote
class RolloutWorker:
    """One generation engine in its own process."""

    def __init__(
        self, cfg: RolloutConfig, model_path: str, dtype: str, threads: int, num_gpus: float
    ) -> None:
        from rlsys.engines import ENGINES
        from rlsys.runtime import limit_threads, pick_device, quiet_libraries

        quiet_libraries()
        self.threads = limit_threads(threads)
        self.device = pick_device(num_gpus)
        self.engine = ENGINES.get(cfg.engine)(model_path, dtype, cfg, self.device)
        self.transport: WeightTransport | None = None

    def generate(
        self, prompts: list[list[int]], sampling: SamplingParams, budgets: list[int] | None = None
    ):
        return self.engine.generate(prompts, sampling, budgets)

    def connect_weight_sync(
        self, transport: WeightTransport, rank: int, world_size: int, address: SyncAddress
    ) -> None:
        """Join the weight-sync group as receiver ``rank`` (learner rank 0 is rank 0),
        leaving the group it was in (the group is re-formed after a member is replaced)."""
        if self.transport is not None:
            self.transport.close()
        self.transport = transport
        transport.connect(rank, world_size, address, self.device)

    def update_weights(self, update: WeightUpdate) -> int:
        """Receive ``update`` and load it; returns the number of tensors loaded."""
        return self.engine.update_weights(self.transport.receive(update), update.version)

    def abort(self) -> None:
        """Stop the generation in flight (it returns partial completions)."""
        self.engine.abort()

    def version(self) -> int:
        return self.engine.version

    def pid(self) -> int:
        """The worker's process id (tests kill it to exercise recovery)."""
        return os.getpid()

    def sleep(self) -> None:
        self.engine.sleep()

    def wake(self) -> None:
        self.engine.wake()

    def close(self) -> None:
        if self.transport is not None:
            self.transport.close()


class RolloutPool:
    """``num_workers`` rollout workers; a batch of prompts is split evenly among them."""

    def __init__(
        self, cfg: RolloutConfig, resources: ActorResources, model_path: str, dtype: str
    ) -> None:
        self.cfg, self.resources = cfg, resources
        self.model_path, self.dtype = model_path, cfg.dtype or dtype
        self.workers = [self._spawn() for _ in range(cfg.num_workers)]
        ray.get([w.version.remote() for w in self.workers])  # wait until every engine is up

    def _spawn(self) -> ray.actor.ActorHandle:
        res = self.resources
        # max_concurrency 2: abort() must reach a worker while generate() runs
        return RolloutWorker.options(
            num_cpus=res.num_cpus,
            num_gpus=res.num_gpus,
            max_concurrency=2,
            runtime_env=thread_env(res.threads),
        ).remote(self.cfg, self.model_path, self.dtype, res.threads, res.num_gpus)

    def replace(self, worker: int) -> None:
        """Kill worker ``worker`` (if it still runs) and start a fresh engine in its place,
        on the starting weights: load the current ones before it takes work."""
        with contextlib.suppress(Exception):
            ray.kill(self.workers[worker])
        self.workers[worker] = self._spawn()
        ray.get(self.workers[worker].version.remote())

    def submit(
        self,
        worker: int,
        prompts: list[list[int]],
        sampling: SamplingParams,
        seed: int | None = None,
        budgets: list[int] | None = None,
    ) -> ray.ObjectRef:
        """Start generating ``prompts`` on worker ``worker``, seeded ``seed``, stop strings and
        tokens defaulting to ``rollout.stop`` / ``rollout.stop_token_ids``; the ref resolves
        to completions per prompt (see ``RolloutWorker.generate``)."""
        params = dataclasses.replace(
            sampling,
            seed=seed,
            stop=list(sampling.stop or self.cfg.stop),
            stop_token_ids=list(sampling.stop_token_ids or self.cfg.stop_token_ids),
        )
        return self.workers[worker].generate.remote(prompts, params, budgets)

    def generate_on(
        self,
        worker: int,
        prompts: list[list[int]],
        sampling: SamplingParams,
        seed: int | None = None,
        budgets: list[int] | None = None,
    ) -> list[list[Completion]]:
        """``submit`` and wait (a rollout loop's request to its worker)."""
        return ray.get(self.submit(worker, prompts, sampling, seed, budgets))

    def generate(
        self, prompts: list[list[int]], sampling: SamplingParams, seed: int | None = None
    ) -> list[list[Completion]]:
        """Completions per prompt, in prompt order, split evenly over the workers; worker i
        seeds with ``seed + i``."""
        shards = np.array_split(np.arange(len(prompts)), len(self.workers))
        futures = [
            self.submit(i, [prompts[r] for r in rows], sampling, None if seed is None else seed + i)
            for i, rows in enumerate(shards)
            if len(rows)
        ]
        return [group for part in ray.get(futures) for group in part]

    def connect_weight_sync(
        self, transport: WeightTransport, world_size: int, address: SyncAddress
    ) -> list[ray.ObjectRef]:
        """Start every worker joining the sync group as ranks 1..num_workers."""
        return [
            w.connect_weight_sync.remote(transport, rank, world_size, address)
            for rank, w in enumerate(self.workers, start=1)
        ]

    def update_weights(self, update: WeightUpdate) -> list[ray.ObjectRef]:
        """Start loading ``update`` into every engine (they receive concurrently)."""
        return [w.update_weights.remote(update) for w in self.workers]

    def abort(self) -> None:
        """Stop every worker's generation in flight (a dead worker has nothing to stop)."""
        for ref in [w.abort.remote() for w in self.workers]:
            with contextlib.suppress(ray.exceptions.RayActorError):
                ray.get(ref)

    def versions(self) -> list[int]:
        return ray.get([w.version.remote() for w in self.workers])

    def shutdown(self, timeout_s: float = 30.0) -> None:
        """Release transport buffers if workers answer in time, then kill them."""
        with contextlib.suppress(Exception):  # cleanup must reach the kills below
            ray.get([w.close.remote() for w in self.workers], timeout=timeout_s)
        for w in self.workers:
            ray.kill(w)
