"""A policy loss, an advantage estimator, an environment and a rollout engine, each with its
own settings, written outside rlsys, trained by config alone: a plugin file (their sources are
below) registers them, `plugins=[...]` imports it in every process of the run, and
`algorithm.policy_loss_args` / `algorithm.advantage_args` / `task.env.args` /
`rollout.engine_args` set their settings (docs/extending.md)."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

import pytest

from rlsys.algorithms.estimators import ADVANTAGES
from rlsys.algorithms.policy_losses import POLICY_LOSSES
from rlsys.config.errors import ConfigError
from rlsys.config.loader import to_yaml
from rlsys.engines import ENGINES
from rlsys.envs import ENVS
from rlsys.resolve import load_config, load_run_config, plugins
from rlsys.run.doctor_checks import TRAIN_OVERRIDES

ROOT = Path(__file__).resolve().parents[2]
PLUGIN = '''
"""The unclipped importance-ratio policy gradient, scaled by a setting of its own, and the
best-versus-rest advantage, at a margin of its own."""

from dataclasses import dataclass

import numpy as np

from rlsys.algorithms.estimators import ADVANTAGES, AdvantageInputs, Advantages
from rlsys.algorithms.policy_losses import POLICY_LOSSES, PolicyLossInputs


@dataclass(frozen=True)
class ScaledSettings:
    scale: float = 1.0  # algorithm.policy_loss_args.scale

    def __post_init__(self):
        if not self.scale > 0:
            raise ValueError(f"scale={self.scale} must be > 0")


@POLICY_LOSSES.register("scaled_pg", settings=ScaledSettings, ratio=True)
def scaled_pg(x: PolicyLossInputs, s: ScaledSettings):
    ratio = (x.logprobs - x.old_logprobs).clamp(-20, 20).exp()
    return -s.scale * x.advantages * ratio, {"scaled_pg_scale": ratio.detach() * 0 + s.scale}


@dataclass(frozen=True)
class MarginSettings:
    margin: float = 1.0  # algorithm.advantage_args.margin

    def __post_init__(self):
        if not self.margin > 0:
            raise ValueError(f"margin={self.margin} must be > 0")


@ADVANTAGES.register("best_vs_rest", settings=MarginSettings, group=True)
def best_vs_rest(x: AdvantageInputs, s: MarginSettings) -> Advantages:
    rewards = np.asarray(x.rewards).reshape(-1, x.group_size)
    best = rewards == rewards.max(-1, keepdims=True)
    adv = s.margin * np.where(best, 1.0, -1.0).reshape(-1, 1) * (x.mask > 0)
    return Advantages(adv.astype(np.float32))
'''


@pytest.fixture
def plugin_file(tmp_path):
    path = tmp_path / "scaled_pg.py"
    path.write_text(PLUGIN)
    yield path
    # this process imported it (load_config): leave the registry as other tests expect it
    if "scaled_pg" in POLICY_LOSSES:
        POLICY_LOSSES.unregister("scaled_pg")
    if "best_vs_rest" in ADVANTAGES:
        ADVANTAGES.unregister("best_vs_rest")
    plugins._loaded.pop(str(path), None)


def test_plugin_settings_and_failures_name_the_key(tmp_path, plugin_file):
    base = [f"plugins=[{plugin_file}]", "algorithm.policy_loss=scaled_pg"]
    cfg = load_config([*base, "algorithm.policy_loss_args={scale: 2.0}"])
    assert cfg.plugins == [str(plugin_file)] and cfg.algorithm.policy_loss_args == {"scale": 2.0}
    with pytest.raises(ConfigError, match=r"policy_loss_args.scal is not a setting of .*scaled_pg"):
        load_config([*base, "algorithm.policy_loss_args={scal: 2.0}"])
    with pytest.raises(ConfigError, match="scale=-1.0 must be > 0"):
        load_config([*base, "algorithm.policy_loss_args={scale: -1.0}"])
    estimator = [base[0], "algorithm.advantage=best_vs_rest"]
    assert load_config(estimator).algorithm.advantage == "best_vs_rest"
    with pytest.raises(ConfigError, match=r"advantage_args.marg is not a setting of .*best_vs"):
        load_config([*estimator, "algorithm.advantage_args={marg: 2.0}"])
    with pytest.raises(ConfigError, match=r"algorithm.advantage_args: margin=0.0 must be > 0"):
        load_config([*estimator, "algorithm.advantage_args={margin: 0.0}"])
    with pytest.raises(ConfigError, match="is not a file"):
        load_config([f"plugins=[{tmp_path / 'missing.py'}]"])
    broken = tmp_path / "broken.py"
    broken.write_text("raise RuntimeError('half-written plugin')\n")
    with pytest.raises(ConfigError, match=r"plugins\[0\]=.*broken.py failed on import: Runtime"):
        load_config([f"plugins=[{broken}]"])
    # a saved run config never imports plugins by itself
    saved = tmp_path / "config.yaml"
    saved.write_text(to_yaml(cfg))
    with pytest.raises(ConfigError, match="names plugins"):
        load_run_config(saved)
    assert load_run_config(saved, plugins=True).algorithm.policy_loss == "scaled_pg"


ENV_PLUGIN = '''
"""A game that answers every model turn " again" and pays a reward of its own per turn,
ending after a number of turns of its own."""

from dataclasses import dataclass

from rlsys.envs import ENVS, StepResult


@dataclass(frozen=True)
class AgainSettings:  # task.env.args
    turns: int = 3  # the trajectory ends after this many model turns
    reward: float = 1.0  # paid for every turn

    def __post_init__(self):
        if self.turns < 1:
            raise ValueError(f"turns={self.turns} must be >= 1")


class AgainEpisode:
    def __init__(self, s: AgainSettings):
        self.s, self.steps = s, 0

    def step(self, action: str) -> StepResult:
        self.steps += 1
        done = self.steps >= self.s.turns
        return StepResult(None if done else " again\\n", reward=self.s.reward, done=done)


@ENVS.register("again", settings=AgainSettings)
class Again:
    stop = ["\\n"]  # a model turn is one line

    def __init__(self, cfg, settings: AgainSettings):
        self.settings = settings

    def __call__(self, prompt):
        return AgainEpisode(self.settings)

    def demonstration(self, prompt):
        return [(prompt.answer, True)]
'''

ENGINE_PLUGIN = '''
"""The HF engine with every reply cut to a token count of its own."""

from dataclasses import dataclass

from rlsys.engines import ENGINES
from rlsys.engines.hf import HFEngine


@dataclass(frozen=True)
class CapSettings:  # rollout.engine_args
    max_new_tokens: int = 8

    def __post_init__(self):
        if self.max_new_tokens < 1:
            raise ValueError(f"max_new_tokens={self.max_new_tokens} must be >= 1")


@ENGINES.register("hf_capped", settings=CapSettings)
class CappedHFEngine(HFEngine):
    def __init__(self, model_path, dtype, cfg, device, settings: CapSettings):
        super().__init__(model_path, dtype, cfg, device)
        self.cap = settings.max_new_tokens

    def generate(self, prompts, sampling, budgets=None, images=None):
        budgets = [min(b, self.cap) for b in budgets or [sampling.max_new_tokens] * len(prompts)]
        return super().generate(prompts, sampling, budgets, images)
'''


@pytest.fixture
def env_and_engine_plugins(tmp_path):
    env, engine = tmp_path / "again_env.py", tmp_path / "capped_engine.py"
    env.write_text(ENV_PLUGIN)
    engine.write_text(ENGINE_PLUGIN)
    yield env, engine
    for registry, name in ((ENVS, "again"), (ENGINES, "hf_capped")):
        if name in registry:
            registry.unregister(name)
    for path in (env, engine):
        plugins._loaded.pop(str(path), None)


def test_a_loss_an_estimator_an_environment_and_an_engine_from_plugins_train_by_config_alone(
    tmp_path, plugin_file, env_and_engine_plugins
):
    """`rlsys train` with the three plugin files for one step (one run for the four: a run's
    start-up is most of its time): the driver's estimator and episodes run the plugins'
    estimator and environment, the learner (a Ray actor, another process) the plugin's loss
    and the rollout worker (another) its engine, each at the settings the config gave it."""
    env, engine = env_and_engine_plugins
    result = subprocess.run(
        [
            sys.executable,
            "-m",
            "rlsys.cli",
            "train",
            *TRAIN_OVERRIDES,
            "task=guess_number",
            "trainer.total_steps=1",
            "learner.world_size=1",
            "data.batch_size=4",
            f"plugins=[{plugin_file},{env},{engine}]",
            "algorithm.policy_loss=scaled_pg",
            "algorithm.policy_loss_args={scale: 0.5}",
            "algorithm.advantage=best_vs_rest",
            "algorithm.advantage_args={margin: 0.25}",
            "task.env.name=again",
            "task.env.args={turns: 2, reward: 0.5}",
            "rollout.engine=hf_capped",
            "rollout.engine_args={max_new_tokens: 2}",
            f"run.output_dir={tmp_path}",
            "run.name=r",
        ],
        capture_output=True,
        text=True,
        timeout=600,
        cwd=ROOT,
    )
    assert result.returncode == 0, result.stderr[-3000:]
    step = json.loads((tmp_path / "r" / "metrics.jsonl").read_text().splitlines()[-1])
    assert step["step"] == 1 and step["train/scaled_pg_scale"] == 0.5
    assert step["train/advantage_abs"] == pytest.approx(0.25)  # +-margin on every token
    assert 1.0 <= step["env/turns"] <= 2.0  # the env's turns=2
    assert step["reward/env"] == pytest.approx(0.5 * step["env/turns"])  # 0.5 a turn
    # model tokens (trained ones) per turn: at most the engine's 2 (uncapped: about 4)
    model_tokens = step["rollout/response_tokens"] * step["env/model_token_frac"]
    assert model_tokens <= 2 * step["env/turns"] + 1e-6


def test_env_and_engine_settings_fail_at_load_naming_the_key(env_and_engine_plugins):
    env, engine = env_and_engine_plugins
    cfg = load_config(
        [
            f"plugins=[{env},{engine}]",
            "task.env.name=again",
            "task.env.args={turns: 2}",
            "rollout.engine=hf_capped",
        ]
    )
    assert cfg.task.env.args == {"turns": 2} and cfg.rollout.engine == "hf_capped"
    with pytest.raises(ConfigError, match=r"task.env.args.turn is not a setting of .*again"):
        load_config([f"plugins=[{env}]", "task.env.name=again", "task.env.args={turn: 2}"])
    with pytest.raises(ConfigError, match=r"task.env.args: turns=0 must be >= 1"):
        load_config([f"plugins=[{env}]", "task.env.name=again", "task.env.args={turns: 0}"])
    capped = [f"plugins=[{engine}]", "rollout.engine=hf_capped"]
    with pytest.raises(ConfigError, match=r"rollout.engine_args.cap is not a setting of .*capped"):
        load_config([*capped, "rollout.engine_args={cap: 2}"])
    with pytest.raises(ConfigError, match=r"rollout.engine_args: max_new_tokens=0 must be >= 1"):
        load_config([*capped, "rollout.engine_args={max_new_tokens: 0}"])
