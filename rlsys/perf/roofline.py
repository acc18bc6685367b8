"""A step's floor: the seconds its work would take at the machine's measured peaks.

Each stage is bounded by the larger of its FLOPs over the matmul peak and its bytes over the
copy bandwidth (the roofline); the stages of a synchronous step run one after another, so the
step's floor is their sum (an asynchronous run overlaps generation with training and can beat
it). What is bounded: the learner's passes (training FLOPs and the log-probability forward),
the reference's forward, generation (its forward FLOPs, or the weights read once per decode
step) and the weight sync (its bytes read once and written once). What is not: scoring,
Python and Ray overheads, the optimizer's update, KV-cache reads; so the floor is a lower
bound, and step / floor says how far the step is from it.
"""

from __future__ import annotations

from dataclasses import dataclass

from rlsys.perf.machine import MachinePeak


@dataclass
class StepWork:
    """What one step computes and moves."""

    learner_flops: float = 0.0  # training passes and the learner's log-probability forward
    reference_flops: float = 0.0  # the reference model's forward
    generation_flops: float = 0.0  # the engines' forward over prompts and responses
    decode_bytes: float = 0.0  # weight bytes x decode steps
    sync_bytes: float = 0.0  # bytes a weight sync sends


def floor_seconds(work: StepWork, peak: MachinePeak) -> dict[str, float]:
    """Each bounded stage's floor in seconds and their sum (``step``)."""
    flop_s, byte_s = peak.matmul_tflops * 1e12, peak.copy_gbps * 1e9
    floors = {
        "learner": work.learner_flops / flop_s,
        "reference": work.reference_flops / flop_s,
        "generation": max(work.generation_flops / flop_s, work.decode_bytes / byte_s),
        "weight_sync": 2 * work.sync_bytes / byte_s,  # read and written once
    }
    floors["step"] = sum(floors.values())
    return floors
