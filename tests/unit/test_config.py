"""Config composition and validation: every preset composes; bad input names its key."""

from __future__ import annotations

import pytest

from rlsys.config import ConfigError
from rlsys.config.loader import conf_dir, to_yaml
from rlsys.config.schema import TrainConfig
from rlsys.placement.resources import MALLOC_ENV, Roles, check_fits, plan_placement, thread_env
from rlsys.resolve import load_config


def _presets() -> list[str]:
    root = conf_dir()
    return sorted(
        f"{group.name}={path.stem}"
        for group in root.iterdir()
        if group.is_dir()
        for path in group.glob("*.yaml")
    )


def test_presets_exist():
    assert {"algorithm=grpo", "model=tiny", "task=arithmetic", "placement=colocated"} <= set(
        _presets()
    )


# presets that only compose with another group's preset (the cross-checks refuse them alone)
NEEDS = {"algorithm=gigpo": ["task=calculator_tool"]}  # step groups need a multi-turn task


@pytest.mark.parametrize("override", _presets())
def test_every_preset_composes_and_validates(override):
    cfg = load_config([override, *NEEDS.get(override, [])])
    assert isinstance(cfg, TrainConfig)
    group, name = override.split("=")
    if group == "placement":
        assert cfg.placement.mode == name


def test_a_task_preset_picks_its_model_and_the_command_line_wins():
    """conf/task/sql.yaml trains tiny-3m by default (the tiny model does not learn to copy
    numbers from a result); a ``model=`` on the command line replaces it."""
    assert load_config(["task=sql"]).model == load_config(["model=tiny-3m"]).model
    assert load_config(["task=sql", "model=tiny"]).model == load_config(["model=tiny"]).model
    assert load_config(["task=sql"]).learner.optim.lr == 1e-4


def test_defaults_match_the_dataclasses():
    assert load_config([]) == TrainConfig()


def test_override_changes_value_and_roundtrips_to_yaml():
    cfg = load_config(["learner.world_size=1", "rollout.n_samples=4", "task.operators=[+,-]"])
    assert cfg.learner.world_size == 1 and cfg.rollout.n_samples == 4
    assert cfg.task.operators == ["+", "-"]
    assert "world_size: 1" in to_yaml(cfg)


@pytest.mark.parametrize(
    ("override", "needle"),
    [
        ("learner.world_sizee=2", "did you mean 'learner.world_size'"),
        ("nonsense=1", "unknown config key 'nonsense'"),
        ("data.batch_size=-1", "data.batch_size"),
        ("rollout.top_p=abc", "rollout.top_p"),
        ("rollout.top_p=1.5", "rollout.top_p"),
        ("learner.world_size=0", "learner.world_size"),
        ("model.hidden_size=64", "head_dim"),
        ("task.operators=[/]", "task.operators"),
        ("eval.num_prompts=100000", "eval.num_prompts"),
        ("buffer.max_staleness=17", "buffer.max_staleness"),
        ("buffer.max_staleness=-1", "buffer.max_staleness"),
        (
            "algorithm=reinforce_pp buffer.max_staleness=1 algorithm.policy_loss=vanilla "
            "learner.ppo_epochs=1",
            "buffer.max_staleness=0",
        ),
        ("algorithm.off_policy=is", "algorithm.off_policy"),
        ("algorithm.off_policy_cap=0.5", "algorithm.off_policy_cap"),
        ("rollout.prompts_per_request=0", "rollout.prompts_per_request"),
        ("algorithm.kl_estimator=k9", "algorithm.kl_estimator"),
        ("algorithm=nope", "algorithm/nope"),
        ("rollout.n_samples=1", "rollout.n_samples"),
        ("learner.optim.betas=[0.9,1.0]", "learner.optim.betas"),
        ("eval.max_new_tokens=-3", "eval.max_new_tokens"),
        ("learner.optim.schedule=linear", "learner.optim.schedule"),
        ("trainer.max_wall_s=-5", "trainer.max_wall_s"),
        ("rollout.engine=sglang", "rollout.engine"),
        ("weight_sync.transport=nccl", "weight_sync.transport"),
        ("weight_sync.transport=cuda_ipc", "placement.mode=colocated"),
        ("weight_sync.cpu_data_plane=rdma", "weight_sync.cpu_data_plane"),
        ("placement=disaggregated placement.engine_sleep=true", "placement.mode=colocated"),
        ("placement.engine_sleep=true buffer.max_staleness=1", "buffer.max_staleness=0"),
        # null turns sleep on for GPU engines: an async colocated GPU run must choose
        ("rollout.num_gpus_per_worker=1 buffer.max_staleness=1", "placement.engine_sleep=false"),
        ("rollout.vllm.gpu_memory_utilization=1.5", "rollout.vllm.gpu_memory_utilization"),
        ("rollout.dtype=int8", "rollout.dtype"),
        ("rollout.stop=['']", "rollout.stop"),
        (
            "rollout.engine=vllm rollout.num_gpus_per_worker=1 rollout.vllm.tensor_parallel_size=2",
            "tensor_parallel_size",
        ),
        ("algorithm.advantage=a2c", "algorithm.advantage"),
        ("algorithm.policy_loss=trpo", "algorithm.policy_loss"),
        ("algorithm.loss_agg=median", "algorithm.loss_agg"),
        ("algorithm.dual_clip=0.5", "algorithm.dual_clip"),
        ("algorithm.policy_loss=gspo algorithm.dual_clip=3", "algorithm.dual_clip=null"),
        ("algorithm.kl_target=0.1", "algorithm.kl_coef"),
        ("algorithm.kl_penalty=both", "algorithm.kl_penalty"),
        ("algorithm.gamma=0", "algorithm.gamma"),
        ("algorithm.lam=1.5", "algorithm.lam"),
        (
            "algorithm.dynamic_sampling=true algorithm.filter_uniform_groups=false",
            "algorithm.filter_uniform_groups=true",
        ),
        ("algorithm.max_sampling_rounds=0", "algorithm.max_sampling_rounds"),
        ("algorithm.overlong_buffer_frac=1.0", "algorithm.overlong_buffer_frac"),
        (
            "algorithm=rloo rollout.n_samples=1 algorithm.filter_uniform_groups=false",
            "algorithm.advantage=rloo",
        ),
        ("rollout.n_samples=1 algorithm.advantage=remax", "algorithm.filter_uniform_groups=false"),
        ("algorithm.kl_coef=0.1 algorithm.kl_estimator=k1", "algorithm.kl_estimator=k2"),
        ("algorithm.policy_loss=vanilla", "learner.ppo_epochs=1"),
        ("algorithm=ppo critic.pretrain_steps=400", "critic.pretrain_steps"),
        ("critic.pretrain_steps=2", "algorithm.advantage=gae"),
        ("critic.optim.lr=-1", "critic.optim.lr"),
        ("critic.world_size=0", "critic.world_size"),
        ("critic.value_clip=-0.1", "critic.value_clip"),
        (
            "algorithm=ppo data.batch_size=1 rollout.n_samples=2 critic.num_mini_batches=4",
            "critic.num_mini_batches",
        ),
        ("trainer.max_samples=0", "trainer.max_samples"),
        ("learner.backend=deepspeed model.dtype=float16", "model.dtype=bfloat16"),
        ("learner.mixed_precision=float16", "learner.mixed_precision"),
        ("learner.mixed_precision=bfloat16 model.dtype=bfloat16", "model.dtype=float32"),
        ("learner.reduce_dtype=float16", "learner.reduce_dtype"),
        ("learner.compile=true learner.compile_backend=tvm", "learner.compile_backend"),
        ("learner.reduce_dtype=bfloat16", "learner.mixed_precision=bfloat16"),
        ("learner.deepspeed.offload_optimizer=true", "it moved to 'learner.offload'"),
        ("critic.deepspeed.offload_optimizer=true", "it moved to 'critic.offload'"),
        (
            "learner.compile=true learner.backend=deepspeed learner.deepspeed.zero_stage=3",
            "learner.compile=true does not work",
        ),
        ("checkpoint.keep=0", "checkpoint.keep"),
        ("checkpoint.every=-1", "checkpoint.every"),
        ("fault.max_nonfinite_steps=0", "fault.max_nonfinite_steps"),
        ("fault.max_rollout_restarts=-1", "fault.max_rollout_restarts"),
        ("resume=' '", "resume"),
        # NaN passes `value <= 0` checks; every number of the config is refused non-finite
        ("learner.optim.lr=nan", "learner.optim.lr=nan is not a finite number"),
        ("rollout.temperature=inf", "rollout.temperature=inf is not a finite number"),
        ("learner.optim.betas=[0.9,nan]", "learner.optim.betas[1]=nan"),
    ],
)
def test_bad_overrides_name_the_key(override, needle):
    with pytest.raises(ConfigError) as info:
        load_config(override.split())
    assert needle in str(info.value)


@pytest.mark.parametrize("name", ["ppo", "remax", "reinforce_pp"])
def test_presets_without_groups_accept_one_sample_per_prompt(name):
    cfg = load_config([f"algorithm={name}", "rollout.n_samples=1"])
    assert not cfg.algorithm.filter_uniform_groups


def test_engines_sleep_by_default_only_where_they_hold_gpu_memory():
    assert not load_config([]).engines_sleep  # CPU: a file round trip a step, for RAM
    assert load_config(["rollout.num_gpus_per_worker=1"]).engines_sleep
    gpu_apart = ["rollout.num_gpus_per_worker=1", "placement=disaggregated"]
    assert not load_config(gpu_apart).engines_sleep
    assert load_config(["placement.engine_sleep=true"]).engines_sleep
    assert not load_config(
        ["rollout.num_gpus_per_worker=1", "placement.engine_sleep=false"]
    ).engines_sleep


def test_memory_keys_reach_the_learner_backend_and_not_the_reference():
    """learner.activation_checkpointing / offload / reduce_dtype become the backend's
    MemorySettings; the reference group (no backward, no optimizer) takes none of them."""
    from rlsys.backends.memory import MemorySettings

    cfg = load_config(
        [
            "learner.activation_checkpointing=true",
            "learner.offload=true",
            "learner.mixed_precision=bfloat16",
            "learner.reduce_dtype=bfloat16",
        ]
    )
    assert MemorySettings.of(cfg.learner) == MemorySettings(True, True, "bfloat16")
    reference = cfg.reference.group(cfg.learner)
    assert MemorySettings.of(reference) == MemorySettings()
    assert reference.mixed_precision is None


def test_batch_must_feed_every_rank_and_mini_batch():
    with pytest.raises(ConfigError, match="learner.num_mini_batches"):
        load_config(["data.batch_size=1", "rollout.n_samples=2", "learner.num_mini_batches=2"])


def test_pools_must_fit_the_cluster():
    cfg = load_config(["learner.world_size=4"])
    with pytest.raises(ConfigError, match="learner.world_size=4"):
        check_fits(cfg, total_cpus=2, total_gpus=0, roles=Roles())
    check_fits(
        load_config(["learner.world_size=4", "learner.num_cpus_per_rank=0.5"]), 2, 0, Roles()
    )
    ppo = load_config(["algorithm=ppo", "critic.world_size=3"])
    with pytest.raises(ConfigError, match="critic.world_size=3"):
        check_fits(ppo, total_cpus=2, total_gpus=0, roles=Roles.for_rl(ppo))
    disagg = load_config(["placement=disaggregated"])
    with pytest.raises(ConfigError, match="placement.mode=disaggregated"):
        check_fits(disagg, total_cpus=2, total_gpus=0, roles=Roles())


def test_colocated_pools_split_their_share_of_the_cpus():
    cfg = load_config([])
    placement = plan_placement(cfg, roles=Roles(reference=True))
    total = (
        cfg.learner.world_size * placement.learner.num_cpus
        + cfg.rollout.num_workers * placement.rollout.num_cpus
        + placement.reference.num_cpus
    )
    assert total <= 2.0
    assert placement.learner.threads == 1 and placement.rollout.threads == 2
    ppo = load_config(["algorithm=ppo"])
    shared = plan_placement(ppo, Roles.for_rl(ppo))  # learner, rollout, reference, critic
    assert shared.critic.num_cpus == ppo.critic.num_cpus_per_rank / 4
    assert shared.reference.num_cpus == ppo.reference.num_cpus / 4
    disagg = plan_placement(load_config(["placement=disaggregated"]), roles=Roles())
    assert disagg.rollout.num_cpus == cfg.rollout.num_cpus_per_worker


def test_reward_pools_ask_for_their_own_cpus_beside_the_colocated_share():
    cfg = load_config(["reward.num_workers=2", "reward.num_cpus_per_worker=0.25"])
    roles = Roles.for_rl(cfg)
    placement = plan_placement(cfg, roles)
    assert placement.reward.num_cpus == 0.25  # not split: reward workers run all the time
    assert placement.learner.num_cpus == cfg.learner.num_cpus_per_rank / 2  # learner, rollout
    with pytest.raises(ConfigError, match=r"ask Ray for 2 CPUs and the reward pools for 0.5 more"):
        check_fits(cfg, total_cpus=2, total_gpus=0, roles=roles)  # 1 + 1 + 0.5 > 2
    check_fits(cfg, total_cpus=2.5, total_gpus=0, roles=roles)
    check_fits(cfg, total_cpus=2, total_gpus=0, roles=Roles())  # SFT starts no reward pools


def test_custom_resources_pin_pools_and_must_be_advertised():
    cfg = load_config(
        [
            "algorithm=ppo",
            "rollout.num_workers=2",
            "learner.world_size=2",
            "placement.rollout_resources={rollout_nodes:1}",
            "placement.learner_resources={learner_nodes:0.5}",
        ]
    )
    roles = Roles.for_rl(cfg)
    placement = plan_placement(cfg, roles)
    assert placement.rollout.resources == {"rollout_nodes": 1.0}
    # the critic goes where the learner group is; custom resources are asked for as given
    for res in (placement.learner, placement.critic):
        assert res.resources == {"learner_nodes": 0.5}
    assert placement.rollout.actor_options()["resources"] == {"rollout_nodes": 1.0}
    big = {"rollout_nodes": 2.0, "learner_nodes": 2.0}  # 2 ranks x 0.5, twice (critic)
    check_fits(cfg, 64, 0, roles, custom=big)
    with pytest.raises(ConfigError, match="'rollout_nodes' in total but the cluster's nodes"):
        check_fits(cfg, 64, 0, roles, custom={**big, "rollout_nodes": 1.0})
    with pytest.raises(ConfigError, match="placement.learner_resources ask for 2 of"):
        check_fits(cfg, 64, 0, roles, custom={"rollout_nodes": 2.0})


def test_placement_resources_refuse_cpu_and_gpu_keys():
    with pytest.raises(ConfigError, match="placement.rollout_resources names 'GPU'"):
        load_config(["placement.rollout_resources={GPU:1}"])


def test_actor_env_sets_threads_and_malloc_unless_the_user_did(monkeypatch):
    monkeypatch.delenv("MALLOC_TRIM_THRESHOLD_", raising=False)
    monkeypatch.setenv("MALLOC_TOP_PAD_", "0")
    env = thread_env(3)["env_vars"]
    assert env["OMP_NUM_THREADS"] == "3"
    assert env["MALLOC_TRIM_THRESHOLD_"] == MALLOC_ENV["MALLOC_TRIM_THRESHOLD_"]
    assert env["MALLOC_TOP_PAD_"] == "0"  # the user's own setting wins


def test_a_preset_that_is_a_yaml_alias_bomb_is_refused_at_once(tmp_path, monkeypatch):
    """A "billion laughs" preset (nine lines, 10**9 nodes once its aliases are followed) hung
    `rlsys train` for minutes; it is refused from the parser's events before Hydra builds it.
    A run's saved config.yaml is read the same way."""
    import shutil
    import time

    from rlsys.resolve import load_run_config

    conf = tmp_path / "conf"
    shutil.copytree(conf_dir(), conf)
    lines = ["a: &a [x, x, x, x, x, x, x, x, x, x]"]
    for i in range(8):
        prev, name = chr(97 + i), chr(98 + i)
        lines.append(f"{name}: &{name} [{', '.join([f'*{prev}'] * 10)}]")
    bomb = "\n".join(lines) + "\n"
    (conf / "task" / "bomb.yaml").write_text("# @package task\n" + bomb)
    monkeypatch.setenv("RLSYS_CONF_DIR", str(conf))
    start = time.perf_counter()
    with pytest.raises(ConfigError, match=r"bomb\.yaml expands to more than 100,000 nodes"):
        load_config(["task=bomb"])
    (tmp_path / "config.yaml").write_text(bomb)
    with pytest.raises(ConfigError, match="alias bomb"):
        load_run_config(tmp_path / "config.yaml")
    assert time.perf_counter() - start < 5
