"""Rollout workers (Ray actors holding an engine) and the pool that spreads prompts over them."""

from __future__ import annotations

import numpy as np
import ray

from rlsys.config.schema import RolloutConfig
from rlsys.placement import ActorResources
from rlsys.types import Completion, SamplingParams
from rlsys.weight_sync.base import WeightTransport, WeightUpdate


@ray.remote
class RolloutWorker:
    """One generation engine in its own process."""

    def __init__(
        self,
        engine: str,
        model_path: str,
        dtype: str,
        micro_batch_size: int,
        threads: int,
        num_gpus: float,
    ) -> None:
        from rlsys.engines import ENGINES
        from rlsys.runtime import limit_threads, pick_device, quiet_libraries

        quiet_libraries()
        limit_threads(threads)
        self.engine = ENGINES.get(engine)(
            model_path, dtype, micro_batch_size, pick_device(num_gpus)
        )

    def generate(self, prompts: list[list[int]], sampling: SamplingParams):
        return self.engine.generate(prompts, sampling)

    def update_weights(self, transport: WeightTransport, update: WeightUpdate) -> int:
        return self.engine.update_weights(transport.receive(update), update.version)

    def version(self) -> int:
        return self.engine.version

    def sleep(self) -> None:
        self.engine.sleep()

    def wake(self) -> None:
        self.engine.wake()


class RolloutPool:
    """``num_workers`` rollout workers; a batch of prompts is split evenly among them."""

    def __init__(
        self, cfg: RolloutConfig, resources: ActorResources, model_path: str, dtype: str
    ) -> None:
        self.workers = [
            RolloutWorker.options(num_cpus=resources.num_cpus, num_gpus=resources.num_gpus).remote(
                cfg.engine,
                model_path,
                dtype,
                cfg.micro_batch_size,
                resources.threads,
                resources.num_gpus,
            )
            for _ in range(cfg.num_workers)
        ]
        ray.get([w.version.remote() for w in self.workers])  # wait until every engine is up

    def generate(
        self, prompts: list[list[int]], sampling: SamplingParams, seed: int | None = None
    ) -> list[list[Completion]]:
        """Completions per prompt, in prompt order; worker i seeds with ``seed + i``."""
        shards = np.array_split(np.arange(len(prompts)), len(self.workers))
        futures = []
        for i, (worker, rows) in enumerate(zip(self.workers, shards, strict=True)):
            if len(rows):
                params = SamplingParams(
                    **{**vars(sampling), "seed": None if seed is None else seed + i}
                )
                futures.append(worker.generate.remote([prompts[r] for r in rows], params))
        return [group for part in ray.get(futures) for group in part]

    def update_weights(self, transport: WeightTransport, update: WeightUpdate) -> None:
        """Load ``update`` into every engine (they read the buckets concurrently)."""
        ray.get([w.update_weights.remote(transport, update) for w in self.workers])

    def versions(self) -> list[int]:
        return ray.get([w.version.remote() for w in self.workers])

    def shutdown(self) -> None:
        for w in self.workers:
            ray.kill(w)
