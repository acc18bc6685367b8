"""Stage costs of a ``Layout`` from published figures (``hardware``), with the usual
first-order formulas: 2 x params FLOPs per token forward, 6 x params for training (8 x with
activation checkpointing: a recomputed forward), a decode step bound by reading the weights,
ring collectives, and weight updates priced stage by stage along the path the layout's
transport takes (``sync_stages``).
"""

from __future__ import annotations

from rlsys.plan.costs import StageCosts
from rlsys.plan.hardware import ASSUMED, GB, Cluster
from rlsys.plan.layout import Layout, row_tokens
from rlsys.plan.workload import Workload


def sync_stages(layout: Layout, cluster: Cluster) -> list[tuple[str, float]]:
    """The stages a weight update's bytes pass through, each with its bandwidth (bytes/s).

    Learner rank 0 first gathers every tensor from the other ranks; then ``cuda_ipc``: the
    engine copies them out of rank 0's buffer on their shared GPU; ``collective``: an NCCL
    broadcast over NVLink (one node) or the network; ``object_store``: to host memory, into
    Ray's object store, across the network to engines on other nodes, and onto the engine's
    GPU. An engine over several GPUs hands its weights to its vLLM workers as one host array
    through vLLM's RPC (packed, serialised, sent, copied onto each GPU)."""
    a, gpu = ASSUMED, cluster.gpu
    eff = a["network_efficiency"]
    host, copy = a["host_gb_per_s"] * GB, a["host_copy_gb_per_s"] * GB
    network = gpu.network_gb_per_s * GB * eff
    nvlink = gpu.nvlink_gb_per_s * GB * eff
    stages = []
    if layout.learner_ranks > 1:
        learners_on_one_node = layout.learner_ranks <= cluster.gpus_per_node
        stages.append(("gather on learner rank 0", nvlink if learners_on_one_node else network))
    on_host = False
    if layout.transport == "cuda_ipc":
        stages.append(("CUDA IPC copy", gpu.hbm_gb_per_s * GB * a["hbm_efficiency"]))
    elif layout.transport == "collective":
        stages.append(("NCCL broadcast", nvlink if cluster.nodes == 1 else network))
    else:
        stages += [("to host", host), ("into the object store", copy)]
        if cluster.nodes > 1:
            stages.append(("object transfer between nodes", network))
        on_host = True
    if layout.engine_tp > 1:
        if not on_host:
            stages.append(("to host for vLLM's workers", host))
        stages += [("pack", copy), ("serialise", copy), ("vLLM worker RPC", copy)]
        on_host = True
    if on_host:
        stages.append(("onto the engine's GPUs", host))
    return stages


def stage_costs(layout: Layout, cluster: Cluster, work: Workload) -> StageCosts:
    """Costs of one engine of ``layout`` and of its learner ranks (one GPU each)."""
    a, gpu, model = ASSUMED, cluster.gpu, layout.model
    flops = gpu.bf16_tflops * 1e12
    hbm = gpu.hbm_gb_per_s * GB * a["hbm_efficiency"]
    p, tp = model.params, layout.engine_tp
    context = work.prompt_tokens + work.lengths.mean
    step = layout.engine_weight_bytes / tp / hbm
    if tp > 1:
        step += a["tp_step_latency_s"] * model.layers
    kv = model.kv_bytes_per_token(layout.precision.engine_bytes_per_param)
    kv_read = kv * context / tp / hbm
    # the learner computes padded rows (row_tokens) for each sample's mean tokens
    padding = row_tokens(work) / max(context, 1.0)
    train_flops = (8 if layout.activation_checkpointing else 6) * p
    learners_on_one_node = layout.learner_ranks <= cluster.gpus_per_node
    link = gpu.nvlink_gb_per_s if learners_on_one_node else gpu.network_gb_per_s
    # engine sleep / wake: each GPU moves its shard of the weights over its own host link
    host = a["host_gb_per_s"] * GB * tp
    sleep = layout.engine_weight_bytes / host if layout.colocated else 0.0
    return StageCosts(
        gen_call_s=a["gen_call_s"],
        gen_prompt_token_s=2 * p / (tp * flops * a["prefill_mfu"]),
        gen_step_s=step,
        gen_token_s=2 * p / (tp * flops * a["decode_mfu"]) + kv_read,
        logprob_token_s=2 * p * padding / (flops * a["train_mfu"]),
        train_token_s=train_flops * padding / (flops * a["train_mfu"]),
        # FSDP per optimizer step: a reduce-scatter of gradients (model.dtype) and two
        # all-gathers of the compute-dtype weights, about the ring all-reduce of these bytes
        grad_bytes=layout.precision.sync_bytes_per_param * p,
        allreduce_bytes_per_s=link * GB * a["network_efficiency"],
        sync_call_s=a["sync_call_s"],
        sync_byte_s=sum(1 / bandwidth for _, bandwidth in sync_stages(layout, cluster)),
        score_group_s=a["score_sample_s"] * work.n_samples,
        step_overhead_s=a["step_overhead_s"],
        engine_sleep_s=sleep,
        engine_wake_s=sleep,
    )
