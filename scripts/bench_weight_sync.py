"""Weight-sync bandwidth of every transport this machine has, against its memory-copy bandwidth.

    python scripts/bench_weight_sync.py [--models 3M,16M,135M,500M] [--receivers 1]
        [--bucket-mb 64] [--repeats 3] [--device cpu|cuda] [--json out.json]

For randomly initialised models shaped like real ones (~3M, ~16M, SmolLM2-135M, Qwen2.5-0.5B),
a sender actor (standing in for learner rank 0, holding full tensors as an unsharded learner
does) sends every weight to ``--receivers`` receiver actors through each transport that can run
here (``object_store``; ``collective`` over shared memory and over gloo on CPU, NCCL on GPU;
``cuda_ipc`` on GPU). ``--device cuda`` holds the weights on GPUs instead and runs the one GPU
transport the machine fits: ``collective:nccl`` with a GPU per actor where there are
``1 + --receivers`` GPUs, else ``cuda_ipc`` with every actor on one GPU (``rlsys doctor --gpu``
runs it). Two timings per transport, each the median of ``--repeats``:

* ``seconds``: delivery. From the sender starting on its first bucket until every receiver
  holds every bucket's tensors readable in its own process (as an engine's loader sees them).
  Both ends are timed inside the actors on the machine-wide monotonic clock, so Ray's cost of
  dispatching the two calls is not counted.
* ``load_seconds``: delivery plus each receiver copying every tensor into its own
  preallocated weights (what a trivial engine loader adds); for ``collective:shm_resident``
  (``weight_sync.zero_copy``, the HF engine's path) the receiver instead points its weights
  at the received views, as the engine does, so the load is the sender's one copy.

``gbps`` is bytes / seconds; ``ratio_to_memcpy`` divides it by this machine's memory-copy
bandwidth measured in the same run (best of 5 ``torch`` copies of 256 MiB using every core, or
on the GPU with ``--device cuda``).
Moving bytes between two private address spaces through any shared buffer takes two copies,
and on a bandwidth-bound machine two concurrent copies share the bus, so ``load`` ratios of
the copying transports stay at or below about 0.5; the resident plane skips the second copy. ``--json PATH`` writes one record per
(transport, model) with keys transport, params, bytes, seconds, gbps, ratio_to_memcpy (plus
load_seconds, load_gbps, buckets, memcpy_gbps).
"""

from __future__ import annotations

import argparse
import os
import statistics
import sys
import time

MODELS = {  # name -> Llama-style shape (vocab, hidden, layers, intermediate, heads, kv heads, tied)
    "3M": (2048, 256, 2, 1024, 4, 2, False),
    "16M": (4096, 384, 6, 1536, 6, 2, False),
    "135M": (49152, 576, 30, 1536, 9, 3, True),  # SmolLM2-135M
    "500M": (151936, 896, 24, 4864, 14, 2, True),  # Qwen2.5-0.5B
}


def random_state(name: str, device: str = "cpu"):
    """Named full tensors of a randomly initialised model shaped like ``name`` (float32)."""
    import torch
    from transformers import LlamaConfig, LlamaForCausalLM

    vocab, hidden, layers, inter, heads, kv, tied = MODELS[name]
    config = LlamaConfig(
        vocab_size=vocab,
        hidden_size=hidden,
        num_hidden_layers=layers,
        intermediate_size=inter,
        num_attention_heads=heads,
        num_key_value_heads=kv,
        tie_word_embeddings=tied,
    )
    with torch.device("meta"):
        model = LlamaForCausalLM(config)
    state = {}
    for key, param in model.named_parameters():  # tied weights once, as learners send them
        state[key] = torch.empty(param.shape, dtype=torch.float32, device=device).uniform_(
            -0.05, 0.05
        )
    return state


def memcpy_gbps(nbytes: int = 256 << 20, repeats: int = 5, device: str = "cpu") -> float:
    """Best bandwidth of one large tensor copy with every core, or on the GPU (bytes copied
    per second)."""
    import torch

    torch.set_num_threads(os.cpu_count() or 1)
    src = torch.ones(nbytes, dtype=torch.uint8, device=device)
    dst = torch.zeros(nbytes, dtype=torch.uint8, device=device)
    wait = torch.cuda.synchronize if device == "cuda" else (lambda: None)  # kernels are async
    best = float("inf")
    for _ in range(repeats):
        wait()
        start = time.perf_counter()
        dst.copy_(src)
        wait()
        best = min(best, time.perf_counter() - start)
    return nbytes / best / 1e9


def make_actors(ray, device: str = "cpu", num_gpus: float = 0):
    # OpenMP threads from process start, as rlsys actors
    from rlsys.placement.resources import thread_env

    @ray.remote(num_cpus=0, num_gpus=num_gpus, runtime_env=thread_env(os.cpu_count() or 1))
    class Sender:
        def __init__(self, model: str) -> None:
            import torch

            torch.set_num_threads(os.cpu_count() or 1)  # as a learner rank given the machine
            self.state = random_state(model, device)
            self.transport = None

        def info(self) -> tuple[int, int]:
            return (
                sum(t.numel() for t in self.state.values()),
                sum(t.numel() * t.element_size() for t in self.state.values()),
            )

        def memcpy(self) -> float:
            return memcpy_gbps(device=device)

        def address(self):
            from rlsys.weight_sync.group import free_address

            return free_address()

        def connect(self, transport, world_size, address) -> None:
            self.transport = transport
            transport.connect(0, world_size, address, device)

        def send(self, version: int, bucket_bytes: int):
            from rlsys.weight_sync.base import bucketize

            self.started = time.monotonic()  # machine-wide clock: comparable across processes
            return self.transport.send(bucketize(self.state.items(), bucket_bytes), version)

        def last_start(self) -> float:
            return self.started

        def close(self) -> None:
            self.transport.close()

    @ray.remote(num_cpus=0, num_gpus=num_gpus, runtime_env=thread_env(os.cpu_count() or 1))
    class Receiver:
        def __init__(self, model: str) -> None:
            import torch

            torch.set_num_threads(os.cpu_count() or 1)
            self.dest = {
                k: torch.nn.Parameter(v, requires_grad=False)
                for k, v in random_state(model, device).items()
            }
            self.transport = None

        def connect(self, transport, rank, world_size, address, resident: bool) -> None:
            self.transport = transport
            dtype = str(next(iter(self.dest.values())).dtype).removeprefix("torch.")
            transport.connect(rank, world_size, address, device, dtype if resident else None)

        def receive(self, update, load: bool) -> tuple[int, int, float]:
            """(buckets, tensors, monotonic time when the last one was taken)."""
            buckets = count = 0
            for bucket in self.transport.receive(update):
                buckets += 1
                for key, tensor in bucket.items():
                    if load and self.transport.resident:  # as HFEngine.update_weights(adopt)
                        self.dest[key].data = tensor
                    elif load:
                        self.dest[key].data.copy_(tensor)
                    count += 1
            return buckets, count, time.monotonic()

        def close(self) -> None:
            self.transport.close()

    return Sender, Receiver


def transports(device: str = "cpu", receivers: int = 1):
    """(label, transport factory, GPUs per actor, receivers keep views) for the transports
    this machine can run."""
    import torch

    from rlsys.config.schema import WeightSyncConfig
    from rlsys.weight_sync import TRANSPORTS

    if device == "cuda":  # one transport: the actors' GPU share depends on which
        if torch.cuda.device_count() >= 1 + receivers:  # NCCL wants one GPU per rank
            cfg = WeightSyncConfig(transport="collective")
            return [("collective:nccl", lambda: TRANSPORTS.get("collective")(cfg), 1, False)]
        cfg = WeightSyncConfig(transport="cuda_ipc")
        return [("cuda_ipc", lambda: TRANSPORTS.get("cuda_ipc")(cfg), 1 / (1 + receivers), False)]
    out = [("object_store", lambda: TRANSPORTS.get("object_store")(WeightSyncConfig()), 0, False)]
    for plane, resident in (("shm", False), ("shm", True), ("gloo", False)):
        cfg = WeightSyncConfig(transport="collective", cpu_data_plane=plane)
        label = f"collective:{plane}{'_resident' if resident else ''}"
        out.append((label, lambda cfg=cfg: TRANSPORTS.get("collective")(cfg), 0, resident))
    return out


def run_model(ray, model, receivers, bucket_bytes, repeats, memcpy, device="cpu"):
    from rlsys.weight_sync.base import WeightUpdate

    plan = transports(device, receivers)
    Sender, Receiver = make_actors(ray, device, plan[0][2])
    sender = Sender.remote(model)
    sinks = [Receiver.remote(model) for _ in range(receivers)]
    params, nbytes = ray.get(sender.info.remote())
    records = []
    for label, factory, _, resident in plan:
        transport = factory()
        address = ray.get(sender.address.remote())
        world = 1 + receivers
        ray.get(
            [
                sender.connect.remote(transport, world, address),
                *[
                    s.connect.remote(transport, r, world, address, resident)
                    for r, s in enumerate(sinks, 1)
                ],
            ]
        )
        timings = {False: [], True: []}
        buckets = 0
        version = 0
        for load in (False, True):
            for _ in range(repeats + 1):  # the first round warms buffers up and is dropped
                version += 1
                send = sender.send.remote(version, bucket_bytes)
                gets = [
                    s.receive.remote(WeightUpdate(version, published=send), load) for s in sinks
                ]
                ray.get(send)
                done = ray.get(gets)
                start = ray.get(sender.last_start.remote())
                buckets = done[0][0]
                timings[load].append(max(end for _, _, end in done) - start)
        ray.get([sender.close.remote(), *[s.close.remote() for s in sinks]])
        seconds = statistics.median(timings[False][1:])
        load_seconds = statistics.median(timings[True][1:])
        gbps = nbytes / seconds / 1e9
        records.append(
            {
                "transport": label,
                "model": model,
                "params": params,
                "bytes": nbytes,
                "buckets": buckets,
                "receivers": receivers,
                "seconds": seconds,
                "gbps": gbps,
                "ratio_to_memcpy": gbps / memcpy,
                "load_seconds": load_seconds,
                "load_gbps": nbytes / load_seconds / 1e9,
                "load_ratio_to_memcpy": nbytes / load_seconds / 1e9 / memcpy,
                "memcpy_gbps": memcpy,
                "device": device,
            }
        )
        print(_row(records[-1]), flush=True)
    for actor in (sender, *sinks):
        ray.kill(actor)
    return records


HEADER = (
    f"{'transport':<24}{'model':>6}{'params':>12}{'MB':>9}{'buckets':>8}{'s':>9}{'GB/s':>7}"
    f"{'ratio':>7}{'load s':>9}{'load GB/s':>10}{'ratio':>7}"
)


def _row(r: dict) -> str:
    return (
        f"{r['transport']:<24}{r['model']:>6}{r['params']:>12,}{r['bytes'] / 1e6:>9.1f}"
        f"{r['buckets']:>8}{r['seconds']:>9.3f}{r['gbps']:>7.2f}{r['ratio_to_memcpy']:>7.2f}"
        f"{r['load_seconds']:>9.3f}{r['load_gbps']:>10.2f}{r['load_ratio_to_memcpy']:>7.2f}"
    )


def main() -> int:
    parser = argparse.ArgumentParser(
        description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    parser.add_argument("--models", default=",".join(MODELS))
    parser.add_argument("--receivers", type=int, default=1)
    parser.add_argument("--bucket-mb", type=float, default=64.0)
    parser.add_argument("--repeats", type=int, default=3)
    parser.add_argument("--device", choices=["cpu", "cuda"], default="cpu")
    parser.add_argument("--json", dest="json_path")
    args = parser.parse_args()
    models = [m.strip() for m in args.models.split(",") if m.strip()]
    unknown = [m for m in models if m not in MODELS]
    if unknown:
        parser.error(f"--models: unknown {unknown}; pick from {list(MODELS)}")
    import torch

    if args.device == "cuda" and not torch.cuda.is_available():  # else actors wait for GPUs forever
        parser.error(
            "--device cuda: no CUDA device is visible here (torch.cuda.is_available() is "
            f"False; torch {torch.__version__}, built for CUDA {torch.version.cuda}); run it on a "
            "GPU machine with the GPU stack (scripts/setup.sh), or use --device cpu"
        )

    import ray

    from rlsys.runtime import quiet_libraries

    quiet_libraries()
    ray.init(num_cpus=os.cpu_count(), include_dashboard=False, log_to_driver=False)
    try:
        plan = transports(args.device, args.receivers)
        probe = make_actors(ray, args.device, plan[0][2])[0].remote("3M")
        memcpy = ray.get(probe.memcpy.remote())
        ray.kill(probe)
        where = "on the GPU" if args.device == "cuda" else "every core"
        print(f"memory-copy bandwidth: {memcpy:.2f} GB/s (256 MiB torch copy, {where})")
        print(
            f"bucket {args.bucket_mb:g} MiB, {args.receivers} receiver(s), medians of "
            f"{args.repeats}\n{HEADER}",
            flush=True,
        )
        records = []
        for model in models:
            records += run_model(
                ray,
                model,
                args.receivers,
                int(args.bucket_mb * (1 << 20)),
                args.repeats,
                memcpy,
                args.device,
            )
    finally:
        ray.shutdown()
    from rlsys.run.bench import write_records

    write_records(args.json_path, records)
    return 0


if __name__ == "__main__":
    sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
    sys.exit(main())
