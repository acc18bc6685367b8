"""The judge a run serves itself (``reward.judge.model_path``): ``reward.judge.num_workers``
actors, each an rlsys engine (``reward.judge.engine``: hf or vllm) behind an OpenAI-compatible
endpoint (rlsys/rewards/chat_server.py) on its node's address. ``reward.judge`` then talks to
their URLs as it would to any server, spreading requests over them."""

from __future__ import annotations

import dataclasses

import ray

from rlsys.config.reward import JudgeConfig
from rlsys.placement.resources import ActorResources

START_TIMEOUT_S = 900.0  # converting and loading a judge model may take minutes


@ray.remote
class JudgeServer:
    """One engine with the judge model, served at ``url()``."""

    def __init__(self, cfg: JudgeConfig, threads: int, visible: str | None) -> None:
        from rlsys.config.model import ModelConfig
        from rlsys.config.rollout import RolloutConfig
        from rlsys.engines import build_engine
        from rlsys.models.loading import load_tokenizer, resolve_model_path
        from rlsys.placement.gpu_slots import bind_visible_devices
        from rlsys.rewards.chat_server import ChatServer
        from rlsys.runtime import limit_threads, quiet_libraries

        quiet_libraries()
        limit_threads(threads)
        bind_visible_devices(visible)
        path = resolve_model_path(ModelConfig(path=cfg.model_path))
        device = "cuda" if cfg.num_gpus > 0 else "cpu"
        engine = build_engine(path, cfg.dtype, RolloutConfig(engine=cfg.engine), device)
        host = ray.util.get_node_ip_address()
        self.server = ChatServer(engine, load_tokenizer(path), cfg.model, host, cfg.concurrency)

    def url(self) -> str:
        return self.server.url


class JudgePool:
    """``cfg.num_workers`` judge servers; ``judge_config()`` points ``reward.judge`` at them."""

    def __init__(self, cfg: JudgeConfig, resources: ActorResources) -> None:
        self.cfg = cfg
        self.servers = []
        try:
            for index in range(cfg.num_workers):
                options = resources.actor_options(index)
                self.servers.append(
                    JudgeServer.options(**options).remote(
                        cfg, resources.threads, resources.visible_devices(index)
                    )
                )
            self.urls = ray.get([s.url.remote() for s in self.servers], timeout=START_TIMEOUT_S)
        except BaseException:
            self.shutdown()
            raise

    def judge_config(self) -> JudgeConfig:
        """``reward.judge`` with ``url`` set to the pool's servers."""
        return dataclasses.replace(self.cfg, url=",".join(self.urls), model_path=None)

    def shutdown(self) -> None:
        for server in self.servers:
            ray.kill(server)
        self.servers = []
