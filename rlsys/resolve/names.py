"""The names a config gives (a task, an engine, a backend, a loss, ...) looked up in their
registries, and what each implementation's traits forbid in the section that names it.

The config holds names as plain strings (``rlsys.config`` imports no implementation); this
is the one place they meet the registries. Each error is the registry's own: the key, the
bad name and the known ones."""

from __future__ import annotations

from typing import TYPE_CHECKING

from rlsys.algorithms.estimators import ADVANTAGES, advantage_settings
from rlsys.algorithms.kl import KL_ESTIMATORS
from rlsys.algorithms.losses import LOSS_AGGREGATIONS
from rlsys.algorithms.offpolicy import OFF_POLICY_CORRECTIONS
from rlsys.algorithms.policy_losses import POLICY_LOSSES, policy_loss_settings
from rlsys.algorithms.preference import PREFERENCE_LOSSES
from rlsys.backends import BACKENDS
from rlsys.config.env import AGENT_ENV
from rlsys.config.errors import ConfigError
from rlsys.data.tasks import TASKS
from rlsys.engines import ENGINES, engine_settings
from rlsys.envs import ENVS, env_settings
from rlsys.weight_sync import TRANSPORTS

if TYPE_CHECKING:
    from rlsys.config.algorithm import AlgorithmConfig
    from rlsys.config.env import EnvConfig
    from rlsys.config.reward import RewardModelConfig
    from rlsys.config.schema import TrainConfig


def check_names(cfg: TrainConfig) -> None:
    """Every registered name of ``cfg``, section by section."""
    TASKS.check(cfg.task.name)
    ENGINES.check(cfg.rollout.engine)
    engine_settings(cfg.rollout)  # the engine's own settings: bad ones named
    check_env_names(cfg.task.env)
    BACKENDS.check(cfg.learner.backend, key="learner.backend")
    BACKENDS.check(cfg.critic.backend, key="critic.backend")
    check_algorithm_names(cfg.algorithm)
    check_skip_zero_advantage(cfg)
    if cfg.reference.backend is not None:
        BACKENDS.check(cfg.reference.backend, key="reference.backend")
    TRANSPORTS.check(cfg.weight_sync.transport)
    check_reward_model_names(cfg.reward.model)
    PREFERENCE_LOSSES.check(cfg.dpo.loss)


def check_env_names(env: EnvConfig) -> None:
    """The environment's name and its own settings (``task.env.args``); the user agent
    (``openai_agent``) is no registered environment and takes no settings."""
    if env.name == AGENT_ENV:
        if env.args:
            raise ConfigError(
                f"task.env.args={dict(env.args)} is not read by task.env.name={AGENT_ENV} (the "
                "agent is a function, task.env.agent); drop task.env.args"
            )
    elif env.name is not None:
        ENVS.check(env.name)
        env_settings(env)


def check_algorithm_names(algo: AlgorithmConfig) -> None:
    """The algorithm's registered parts, and the settings their traits rule out."""
    ADVANTAGES.check(algo.advantage)
    POLICY_LOSSES.check(algo.policy_loss)
    LOSS_AGGREGATIONS.check(algo.loss_agg)
    KL_ESTIMATORS.check(algo.kl_estimator)
    OFF_POLICY_CORRECTIONS.check(algo.off_policy)
    advantage_settings(algo)  # the estimator's and the loss's own settings: bad ones named
    policy_loss_settings(algo)
    if (
        algo.kl_coef > 0
        and algo.kl_penalty == "loss"
        and KL_ESTIMATORS.trait(algo.kl_estimator, "zero_mean_grad")
    ):
        raise ConfigError(
            f"algorithm.kl_estimator={algo.kl_estimator} as a loss term has a zero-mean "
            "gradient (it only adds noise); use algorithm.kl_estimator=k2 (gradient of "
            "KL(policy || reference)) or k3, or algorithm.kl_penalty=reward"
        )
    if algo.dual_clip is not None and not POLICY_LOSSES.trait(algo.policy_loss, "dual_clip"):
        raise ConfigError(
            f"algorithm.dual_clip applies to algorithm.policy_loss="
            f"{' or '.join(POLICY_LOSSES.names(dual_clip=True))}, not {algo.policy_loss}; "
            "set algorithm.dual_clip=null"
        )


def check_skip_zero_advantage(cfg: TrainConfig) -> None:
    """``learner.skip_zero_advantage`` only where a row can be inert (``inert_rows``): an
    ``advantage_weighted`` policy loss with no KL loss term and no entropy bonus; never the
    critic's value loss."""
    if cfg.critic.skip_zero_advantage:
        raise ConfigError(
            "critic.skip_zero_advantage=true: the critic's value loss has no advantages, so no "
            "row is ever skipped; set critic.skip_zero_advantage=false"
        )
    if not cfg.learner.skip_zero_advantage:
        return
    algo = cfg.algorithm
    why = None
    if not POLICY_LOSSES.trait(algo.policy_loss, "advantage_weighted"):
        why = f"algorithm.policy_loss={algo.policy_loss} moves rows of advantage 0"
    elif algo.entropy_coef > 0:
        why = f"algorithm.entropy_coef={algo.entropy_coef} moves every row"
    elif algo.kl_penalty == "loss" and algo.kl_coef > 0:
        why = f"algorithm.kl_coef={algo.kl_coef} (a KL loss term) moves every row"
    if why:
        raise ConfigError(
            f"learner.skip_zero_advantage=true skips nothing here: {why}; set "
            "learner.skip_zero_advantage=false, or use a loss of "
            f"{POLICY_LOSSES.names(advantage_weighted=True)} without those terms"
        )


def check_reward_model_names(model: RewardModelConfig) -> None:
    """The reward model's backend, and whether it takes the model's dtype."""
    BACKENDS.check(model.backend, key="reward.model.backend")
    if model.dtype == "float16" and not BACKENDS.trait(model.backend, "float16"):
        raise ConfigError(
            f"reward.model.dtype=float16 does not work with reward.model.backend="
            f"{model.backend}; use bfloat16 or backend=fsdp2"
        )
