"""Config of the elastic rollout pool: workers added or removed while a run trains."""

from __future__ import annotations

from dataclasses import dataclass, field

from rlsys.config.checks import positive
from rlsys.config.errors import ConfigError


@dataclass
class ElasticConfig:
    """``rollout.elastic``: resize the rollout pool mid-run, on a schedule or on request
    (``rlsys scale RUN_DIR rollout=N``); see docs/launching.md."""

    # Learner step -> rollout workers from then on, e.g. {100: 4, 500: 2}; applied after that
    # step. A later `rlsys scale` request overrides it until the next scheduled step.
    schedule: dict[int, int] = field(default_factory=dict)
    # Seconds a new worker may take to start (the cluster may lack room for it); after that
    # the request is given up with a warning and the run goes on with the workers it has.
    start_timeout_s: float = 300.0

    def __post_init__(self) -> None:
        for step, workers in self.schedule.items():
            if step < 1 or workers < 1:
                raise ConfigError(
                    f"rollout.elastic.schedule has {step}: {workers}; steps and worker counts "
                    "must be >= 1, e.g. rollout.elastic.schedule={100:4,500:2}"
                )
        positive("rollout.elastic.start_timeout_s", self.start_timeout_s)
