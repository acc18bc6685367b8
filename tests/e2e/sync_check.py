"""The greedy-agreement check of weight sync, shared by the single-node and loopback-cluster
tests: train the learner, sync, and require every engine's greedy tokens to be the learner's.

Run as a script it is a driver for a Ray cluster that is already up (the pytest process holds a
local Ray of its own, so it cannot join another): it starts the pools a config asks for,
checks agreement over three syncs and prints one JSON line of what it saw.
"""

from __future__ import annotations

import json
import sys

import numpy as np

from rlsys.algorithms.objectives import SFTObjective
from rlsys.config.schema import TrainConfig
from rlsys.data.collate import pack
from rlsys.data.tasks import load_task
from rlsys.models.loading import load_tokenizer
from rlsys.types import SamplingParams
from rlsys.weight_sync.base import SendResult
from rlsys.workers.pools import Pools


def check_greedy_agreement(
    cfg: TrainConfig, pools: Pools, model_dir: str, versions: int = 3
) -> list[SendResult]:
    """Per version 1..``versions``: one SFT step, a sync, then every engine's greedy reply
    must be the learner's greedy continuation token for token, and differ from the previous
    version's (a stale engine would repeat itself while the learner moved on). Returns what
    each sync sent."""
    tok = load_tokenizer(model_dir)
    task = load_task(cfg.task, seed=0)
    fixed = [tok.encode(p.text, add_special_tokens=False) for p in task.eval[:24]]
    train = task.train[:64]
    batch = pack(
        [tok.encode(p.text, add_special_tokens=False) for p in train],
        [tok.encode(p.answer, add_special_tokens=False) + [tok.eos_token_id] for p in train],
        tok.pad_token_id,
    )
    engines = len(pools.rollout.workers)
    sent, previous = [], None
    for version in range(1, versions + 1):
        pools.learner.train_step(batch, SFTObjective(), seed=version)
        sent.append(pools.sync_weights(version))
        assert sent[-1].version == version
        assert sent[-1].num_buckets > 1  # bucketed, not one blob (limits: test_transports)
        assert pools.rollout.versions() == [version] * engines
        groups = pools.generate(fixed, SamplingParams(greedy=True, max_new_tokens=6))
        responses = [g[0].token_ids for g in groups]
        assert all(g[0].version == version for g in groups)
        check = pack(fixed, responses, tok.pad_token_id)
        learner_next = pools.learner.greedy_tokens(check)
        mask = check.loss_mask > 0
        np.testing.assert_array_equal(learner_next[mask], check.input_ids[:, 1:][mask])
        if previous is not None:
            assert responses != previous, f"engines repeated version {version - 1}'s replies"
        previous = responses
    return sent


def main(address: str, root: str, overrides: list[str]) -> None:
    """Join the cluster at ``address`` (workers import rlsys from ``root``), start the pools of
    ``overrides`` and check agreement; print the data planes and nodes used as JSON."""
    import ray

    from rlsys.models.loading import resolve_model_path
    from rlsys.placement.resources import Roles
    from rlsys.resolve import load_config
    from rlsys.workers.pools import start_pools

    cfg = load_config(overrides)
    model_dir = resolve_model_path(cfg.model)
    ray.init(
        address=address,
        logging_level="ERROR",
        log_to_driver=False,
        runtime_env={"env_vars": {"PYTHONPATH": root, "TRANSFORMERS_VERBOSITY": "error"}},
    )
    pools = start_pools(cfg, model_dir, Roles())
    try:
        sent = check_greedy_agreement(cfg, pools, model_dir)
        report = {"planes": [s.data_plane for s in sent], "nodes": pools.node_ids()}
    finally:
        pools.shutdown()
    print(json.dumps(report))


if __name__ == "__main__":
    main(sys.argv[1], sys.argv[2], sys.argv[3:])
