"""Rollout workers (Ray actors holding an engine) and the pool that spreads prompts over them."""

from __future__ import annotations

import contextlib
import dataclasses
import os
from concurrent.futures import ThreadPoolExecutor

import numpy as np
import ray

from rlsys.config.schema import RolloutConfig
from rlsys.engines.base import WAKE_ALL, RolloutEngine
from rlsys.placement.resources import ActorResources
from rlsys.types import Completion, SamplingParams
from rlsys.weight_sync.base import SyncAddress, WeightTransport, WeightUpdate
from rlsys.workers.calls import get_all


@ray.remote
class RolloutWorker:
    """One generation engine in its own process.

    Whatever runs the engine's model (building it, generating, loading weights, sleep and
    wake) runs on one thread of its own, ``engine``. Ray runs an actor's methods on a pool of
    threads (abort must get through while generate runs), and every thread that runs torch
    ops starts an OpenMP team of its own; with more team threads than cores, libgomp stops
    spinning between parallel regions and decoding's many small ops slow down: SmolLM2's
    generation took 1.5 s on one thread and 2.1 s on a second one after the first had run
    torch (this project's 2-core machine)."""

    def __init__(
        self,
        cfg: RolloutConfig,
        model_path: str,
        dtype: str,
        threads: int,
        num_gpus: float,
        lora_scale: float | None = None,
        visible_devices: str | None = None,
    ) -> None:
        """An engine on ``model_path``; ``lora_scale``: the policy trains LoRA adapters (of
        that alpha / rank) and weight syncs carry only them, merged here into the base;
        ``visible_devices``: the GPUs of an engine over several (``ActorResources``)."""
        from rlsys.engines import build_engine
        from rlsys.placement.gpu_slots import bind_visible_devices
        from rlsys.runtime import limit_threads, pick_device, quiet_libraries

        bind_visible_devices(visible_devices)
        quiet_libraries()
        self._engine_thread = ThreadPoolExecutor(1, thread_name_prefix="engine")
        self.threads = self._on_engine_thread(limit_threads, threads)
        self.device = pick_device(num_gpus)
        self.engine: RolloutEngine = self._on_engine_thread(
            build_engine, model_path, dtype, cfg, self.device
        )
        self.transport: WeightTransport | None = None
        self.wakes = 0  # wake calls served (colocated runs: one per step)
        self.merge_adapters = None
        if lora_scale is not None:
            from rlsys.models.lora import AdapterMerger

            self.merge_adapters = AdapterMerger(model_path, dtype, lora_scale, self.device)

    def _on_engine_thread(self, fn, *args):
        return self._engine_thread.submit(fn, *args).result()

    def generate(
        self,
        prompts: list[list[int]],
        sampling: SamplingParams,
        budgets: list[int] | None = None,
        images: list | None = None,
    ):
        """See ``RolloutEngine.generate`` (``images``: per prompt, its PromptPixels or None;
        passed on only when given, so text-only engines keep their signature)."""
        extra = () if images is None else (images,)
        return self._on_engine_thread(self.engine.generate, prompts, sampling, budgets, *extra)

    def connect_weight_sync(
        self, transport: WeightTransport, rank: int, world_size: int, address: SyncAddress
    ) -> None:
        """Join the weight-sync group as receiver ``rank`` (learner rank 0 is rank 0),
        leaving the group it was in (the group is re-formed after a member is replaced)."""
        if self.transport is not None:
            self.transport.close()
        self.transport = transport
        # merged adapters are new tensors each sync: nothing to keep views of
        views = self.engine.view_dtype() if self.merge_adapters is None else None
        transport.connect(rank, world_size, address, self.device, resident_dtype=views)

    def update_weights(self, update: WeightUpdate) -> int:
        """Receive ``update`` and load it; returns the number of tensors loaded."""
        buckets = self.transport.receive(update)
        if self.merge_adapters is not None:  # adapters in, full weights of their modules out
            buckets = self.merge_adapters(buckets)
        adopt = self.transport.resident  # never with merged adapters: connect announced none
        return self._on_engine_thread(self.engine.update_weights, buckets, update.version, adopt)

    def weights_digest(self) -> dict[str, str]:
        """``weight_sync.base.digests`` of the engine's weights by name (engines that hold a
        Hugging Face model in this process, as the HF engine does)."""
        from rlsys.weight_sync.base import digests

        model = getattr(self.engine, "model", None)
        if model is None:
            raise NotImplementedError(
                f"{type(self.engine).__name__} keeps no model in the worker process to digest"
            )
        return self._on_engine_thread(lambda: digests(model.state_dict().items()))

    def abort(self) -> None:
        """Stop the generation in flight (it returns partial completions)."""
        self.engine.abort()

    def version(self) -> int:
        return self.engine.version

    def cached_prompt_tokens(self) -> int:
        """Prompt tokens so far whose KV the engine took from its prefix cache (vLLM with
        ``rollout.vllm.enable_prefix_caching``; the HF engine prefills every prompt: 0)."""
        return getattr(self.engine, "cached_prompt_tokens", 0)

    def node_id(self) -> str:
        """The Ray node this worker runs on."""
        return ray.get_runtime_context().get_node_id()

    def devices(self) -> dict:
        """The GPUs Ray gave this worker and the device its engine runs on
        (``gpu_slots.device_report``)."""
        from rlsys.placement.gpu_slots import device_report

        return device_report(self.device)

    def pid(self) -> int:
        """The worker's process id (tests kill it to exercise recovery)."""
        return os.getpid()

    def sleep(self) -> dict[str, float]:
        """Put the engine to sleep; returns the bytes its engine freed and the drop of this
        process's resident memory (None where /proc does not tell)."""
        from rlsys.runtime import resident_bytes

        before = resident_bytes()
        freed = self._on_engine_thread(self.engine.sleep)
        after = resident_bytes()
        rss_drop = None if before is None or after is None else before - after
        return {"freed_bytes": float(freed), "rss_drop_bytes": rss_drop}

    def wake(self, tags: tuple[str, ...] = WAKE_ALL) -> dict[str, float]:
        """Wake the engine for ``tags`` (``RolloutEngine.wake``); returns how many times its
        weights have woken and the memory this wake took: device memory on a GPU, resident
        memory on a CPU (None where neither can be read)."""
        from rlsys.runtime import memory_in_use

        before = memory_in_use(self.device)
        self._on_engine_thread(self.engine.wake, tags)
        after = memory_in_use(self.device)
        if "weights" in tags:
            self.wakes += 1
        taken = None if before is None or after is None else float(after - before)
        return {"wakes": self.wakes, "taken_bytes": taken}

    def close(self) -> None:
        if self.transport is not None:
            self.transport.close()


class RolloutPool:
    """``num_workers`` rollout workers; a batch of prompts is split evenly among them."""

    def __init__(
        self,
        cfg: RolloutConfig,
        resources: ActorResources,
        model_path: str,
        dtype: str,
        lora_scale: float | None = None,
    ) -> None:
        """``lora_scale``: see ``RolloutWorker``."""
        self.cfg, self.resources = cfg, resources
        self.lora_scale = lora_scale
        self.model_path, self.dtype = model_path, cfg.dtype or dtype
        self.workers = [self._spawn(i) for i in range(cfg.num_workers)]
        ray.get([w.version.remote() for w in self.workers])  # wait until every engine is up

    def _spawn(
        self, index: int, timeout_s: float | None = None, fresh: bool = False
    ) -> ray.actor.ActorHandle:
        """Worker ``index`` (a GPU worker goes to that engine's GPU slots; an engine over
        several GPUs learns their ids once they are placed: within ``timeout_s``, read anew
        with ``fresh``)."""
        res = self.resources
        visible = res.visible_devices(index, timeout_s, fresh)
        # max_concurrency 2: abort() must reach a worker while generate() runs
        return RolloutWorker.options(**res.actor_options(index, max_concurrency=2)).remote(
            self.cfg,
            self.model_path,
            self.dtype,
            res.threads,
            res.num_gpus,
            self.lora_scale,
            visible,
        )

    def replace(self, worker: int) -> None:
        """Kill worker ``worker`` (if it still runs) and start a fresh engine in its place,
        on the starting weights: load the current ones before it takes work. Its GPUs are
        read anew (Ray re-places the slots of a node it lost)."""
        with contextlib.suppress(Exception):
            ray.kill(self.workers[worker])
        self.workers[worker] = self._spawn(worker, fresh=True)
        ray.get(self.workers[worker].version.remote())

    def grow(self, count: int, timeout_s: float) -> list[int]:
        """Start ``count`` more workers (on the starting weights: send them the current ones
        before they take work); returns their indices. If they are not all up within
        ``timeout_s`` (the cluster has no room), they are stopped, the GPU slots made for
        them removed, and TimeoutError raised."""
        first = len(self.workers)
        slots = self.resources.gpus.slots if self.resources.gpus is not None else None
        before = slots.groups() if slots is not None else set()
        new: list[ray.actor.ActorHandle] = []
        try:
            for i in range(count):
                new.append(self._spawn(first + i, timeout_s))
            ray.get([w.version.remote() for w in new], timeout=timeout_s)
        except BaseException:
            for w in new:
                ray.kill(w)
            if slots is not None:
                slots.remove(slots.groups() - before)
            raise
        self.workers.extend(new)
        return list(range(first, len(self.workers)))

    def shrink(self, workers: list[int]) -> None:
        """Stop ``workers``, which must be the last ones (their loops have ended)."""
        keep = len(self.workers) - len(workers)
        if sorted(workers) != list(range(keep, len(self.workers))):
            raise ValueError(f"only the last workers can go, not {workers}")
        leaving, self.workers = self.workers[keep:], self.workers[:keep]
        _stop(leaving, timeout_s=30.0)

    def submit(
        self,
        worker: int,
        prompts: list[list[int]],
        sampling: SamplingParams,
        seed: int | None = None,
        budgets: list[int] | None = None,
        images: list | None = None,
    ) -> ray.ObjectRef:
        """Start generating ``prompts`` on worker ``worker``, seeded ``seed``, with
        ``rollout.stop`` / ``rollout.stop_token_ids`` added to the call's own stop strings and
        tokens (an environment's); the ref resolves to completions per prompt (see
        ``RolloutWorker.generate``)."""
        params = dataclasses.replace(
            sampling,
            seed=seed,
            stop=list(dict.fromkeys([*sampling.stop, *self.cfg.stop])),
            stop_token_ids=list(
                dict.fromkeys([*sampling.stop_token_ids, *self.cfg.stop_token_ids])
            ),
        )
        return self.workers[worker].generate.remote(prompts, params, budgets, images)

    def generate_on(
        self,
        worker: int,
        prompts: list[list[int]],
        sampling: SamplingParams,
        seed: int | None = None,
        budgets: list[int] | None = None,
        images: list | None = None,
    ) -> list[list[Completion]]:
        """``submit`` and wait (a rollout loop's request to its worker)."""
        return ray.get(self.submit(worker, prompts, sampling, seed, budgets, images))

    def generate(
        self,
        prompts: list[list[int]],
        sampling: SamplingParams,
        seed: int | None = None,
        budgets: list[int] | None = None,
        images: list | None = None,
    ) -> list[list[Completion]]:
        """Completions per prompt, in prompt order, split evenly over the workers; worker i
        seeds with ``seed + i``; prompt j gets at most ``budgets[j]`` new tokens and shows
        ``images[j]`` (its PromptPixels; VL models)."""
        shards = np.array_split(np.arange(len(prompts)), len(self.workers))
        futures = [
            self.submit(
                i,
                [prompts[r] for r in rows],
                sampling,
                None if seed is None else seed + i,
                None if budgets is None else [budgets[r] for r in rows],
                None if images is None else [images[r] for r in rows],
            )
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

    def sleep(self) -> list[dict[str, float]]:
        """Put every engine to sleep (colocated: the learners train next); each worker's
        record of what it freed (``RolloutWorker.sleep``)."""
        return get_all([w.sleep.remote() for w in self.workers])

    def wake(self, tags: tuple[str, ...] = WAKE_ALL) -> list[dict[str, float]]:
        """Wake every engine for ``tags``; each worker's record (``RolloutWorker.wake``)."""
        return get_all([w.wake.remote(tags) for w in self.workers])

    def node_ids(self) -> list[str]:
        """The Ray node of every worker."""
        return ray.get([w.node_id.remote() for w in self.workers])

    def devices(self) -> list[dict]:
        """Every worker's GPUs and device (``RolloutWorker.devices``)."""
        return ray.get([w.devices.remote() for w in self.workers])

    def versions(self) -> list[int]:
        return ray.get([w.version.remote() for w in self.workers])

    def shutdown(self, timeout_s: float = 30.0) -> None:
        """Release transport buffers if workers answer in time, then kill them."""
        _stop(self.workers, timeout_s)


def _stop(workers: list[ray.actor.ActorHandle], timeout_s: float) -> None:
    """Release the workers' transport buffers if they answer in time, then kill them."""
    with contextlib.suppress(Exception):  # cleanup must reach the kills below
        ray.get([w.close.remote() for w in workers], timeout=timeout_s)
    for w in workers:
        ray.kill(w)
