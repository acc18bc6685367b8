"""Metric sinks: console line, metrics.jsonl (always), wandb, tensorboard and MLflow (when
enabled); sample tables in samples.jsonl and each enabled sink."""

from __future__ import annotations

import json
import logging
import math
import sys
import time
import urllib.error
import urllib.request
from pathlib import Path

from rlsys.config.errors import ConfigError
from rlsys.config.schema import TrackingConfig
from rlsys.run.directory import trim_metrics
from rlsys.run.progress import Progress

_CONSOLE_KEYS = [
    ("rollout/reward_mean", "reward", "{:.3f}"),
    ("rollout/accuracy", "acc", "{:.3f}"),
    ("train/loss", "loss", "{:+.4f}"),
    ("sft/loss", "loss", "{:.4f}"),
    ("rm/loss", "loss", "{:.4f}"),
    ("rm/accuracy", "acc", "{:.3f}"),
    ("dpo/loss", "loss", "{:.4f}"),
    ("dpo/accuracy", "acc", "{:.3f}"),
    ("dpo/margin", "margin", "{:+.3f}"),
    ("train/kl", "kl", "{:.4f}"),
    ("train/entropy", "ent", "{:.3f}"),
    ("train/grad_norm", "gnorm", "{:.3f}"),
    ("rollout/response_tokens", "len", "{:.1f}"),
    ("eval/accuracy", "EVAL", "{:.3f}"),
    ("eval/validation_accuracy", "VAL", "{:.3f}"),
    ("eval/pairwise_accuracy", "EVAL pairs", "{:.3f}"),
    ("perf/step_s", "step_s", "{:.2f}"),
    ("perf/tokens_per_s", "tok/s", "{:.0f}"),
]
SAMPLE_COLUMNS = ("prompt", "answer", "response", "reward", "correct")  # a sample table's row
_PER_WORKER_TIME = "time/rollout_worker_"  # per-worker figures stay out of the console line

log = logging.getLogger(__name__)


def _jsonable(value):
    if isinstance(value, float) and not math.isfinite(value):
        return None
    return value


def _is_number(value) -> bool:
    return isinstance(value, (int, float)) and not isinstance(value, bool) and math.isfinite(value)


def flatten(config: dict, prefix: str = "") -> dict[str, str]:
    """``{"a": {"b": 1}}`` -> ``{"a.b": "1"}``: a nested config as flat string params."""
    out: dict[str, str] = {}
    for key, value in config.items():
        name = f"{prefix}{key}"
        if isinstance(value, dict) and value:
            out.update(flatten(value, f"{name}."))
        else:
            out[name] = value if isinstance(value, str) else json.dumps(value)
    return out


class MLflowSink:
    """One MLflow run per run directory (a resumed run continues it): the flattened config as
    params, metrics per step, sample tables as JSON artifacts. Without a tracking URI the
    store is ``sqlite:///<run_dir>/mlflow.db`` with artifacts in ``<run_dir>/mlartifacts``:
    offline, and the backend MLflow 3 supports (its file store is deprecated). A store that
    fails mid-run stops MLflow logging with a warning, not the run (metrics.jsonl has all)."""

    _PARAM_BATCH = 100  # MLflow's limit of params per log_batch call
    _PARAM_CHARS = 500  # the smallest value-length limit among MLflow servers

    def __init__(self, run_dir: Path, cfg: TrackingConfig, run_name: str, config: dict) -> None:
        from mlflow.tracking import MlflowClient

        for name in ("mlflow", "alembic"):  # table creation logs at INFO
            logging.getLogger(name).setLevel(logging.WARNING)
        local = cfg.mlflow_tracking_uri is None
        uri = f"sqlite:///{run_dir / 'mlflow.db'}" if local else cfg.mlflow_tracking_uri
        _check_reachable(uri)
        self.client = MlflowClient(tracking_uri=uri)
        self.failed = False
        try:
            self.run_id = self._start_run(run_dir, cfg, run_name, config, local)
        except Exception as exc:  # MLflow's errors have no common base besides its own
            raise ConfigError(
                f"tracking.mlflow: the MLflow store {uri} failed ({exc}); fix "
                "tracking.mlflow_tracking_uri (null: an offline store in the run directory) "
                "or set tracking.mlflow=false"
            ) from exc

    def _start_run(
        self, run_dir: Path, cfg: TrackingConfig, run_name: str, config: dict, local: bool
    ) -> str:
        from mlflow.entities import Param

        experiment = self.client.get_experiment_by_name(cfg.mlflow_experiment)
        if experiment is not None:
            experiment_id = experiment.experiment_id
        else:
            artifacts = (run_dir / "mlartifacts").as_uri() if local else None
            experiment_id = self.client.create_experiment(cfg.mlflow_experiment, artifacts)
        found = []
        if "'" not in str(run_dir):  # a quote cannot appear in the filter string
            found = self.client.search_runs(
                [experiment_id], f"tags.rlsys_run_dir = '{run_dir}'", max_results=1
            )
        if found:
            self.client.update_run(found[0].info.run_id, status="RUNNING")
            return found[0].info.run_id  # params are immutable: it keeps the ones it has
        tags = {"rlsys_run_dir": str(run_dir)}
        run_id = self.client.create_run(experiment_id, run_name=run_name, tags=tags).info.run_id
        params = [Param(k, v[: self._PARAM_CHARS]) for k, v in flatten(config).items()]
        for start in range(0, len(params), self._PARAM_BATCH):
            self.client.log_batch(run_id, params=params[start : start + self._PARAM_BATCH])
        return run_id

    def _call(self, method: str, *args) -> None:
        """``client.<method>(run_id, *args)``; after a failure, nothing more."""
        if self.failed:
            return
        try:
            getattr(self.client, method)(self.run_id, *args)
        except Exception as exc:  # a tracking outage must not end the training run
            self.failed = True
            log.warning("MLflow %s failed (%s): no more MLflow logging in this run", method, exc)

    def log(self, step: int, metrics: dict) -> None:
        from mlflow.entities import Metric

        now_ms = int(time.time() * 1000)
        batch = [Metric(k, float(v), now_ms, step) for k, v in metrics.items() if _is_number(v)]
        if batch:
            self._call("log_batch", batch)

    def log_samples(self, step: int, rows: list[dict]) -> None:
        table = {
            "columns": list(SAMPLE_COLUMNS),
            "data": [[r[c] for c in SAMPLE_COLUMNS] for r in rows],
        }
        self._call("log_dict", table, f"samples/step_{step:06d}.json")

    def close(self) -> None:
        self._call("set_terminated")


def _check_reachable(uri: str) -> None:
    """Fail in seconds, naming the key, on an MLflow server that does not answer (MLflow's
    own client retries for minutes)."""
    if not uri.startswith(("http://", "https://")):
        return
    try:
        urllib.request.urlopen(uri.rstrip("/") + "/health", timeout=10).close()
    except urllib.error.HTTPError:
        return  # it answered (a proxy or auth in front of MLflow may refuse /health)
    except OSError as exc:
        raise ConfigError(
            f"tracking.mlflow_tracking_uri={uri} does not answer ({exc}); start the MLflow "
            "server, fix the URI, or set it to null for an offline store in the run directory"
        ) from exc


def _markdown_table(rows: list[dict]) -> str:
    """Rows as a markdown table (tensorboard's text plugin renders it)."""

    def cell(value) -> str:
        return str(value).replace("|", "\\|").replace("\n", "<br>")

    lines = ["| " + " | ".join(SAMPLE_COLUMNS) + " |", "|" + "---|" * len(SAMPLE_COLUMNS)]
    lines += ["| " + " | ".join(cell(r[c]) for c in SAMPLE_COLUMNS) + " |" for r in rows]
    return "\n".join(lines)


class Tracker:
    """Writes every logged step to each enabled sink."""

    def __init__(
        self,
        run_dir: Path,
        cfg: TrackingConfig,
        run_name: str,
        config: dict,
        total_steps: int | None = None,
        prefix: str = "",
        run_id: str | None = None,
    ) -> None:
        self.cfg = cfg
        self.total_steps = total_steps
        self.prefix = prefix
        self.run_dir = run_dir
        self._jsonl = (run_dir / "metrics.jsonl").open("a")
        self._samples = None  # samples.jsonl, opened by the first table
        self._wandb = None
        self._tb = None
        self._mlflow = None
        if cfg.wandb:
            import wandb

            self._wandb = wandb.init(
                project=cfg.wandb_project,
                name=run_name,
                config=config,
                dir=str(run_dir),
                mode=cfg.wandb_mode,
                reinit=True,
                id=run_id,  # a resumed run continues its wandb run
                resume="allow" if run_id else None,
            )
        if cfg.tensorboard:
            from torch.utils.tensorboard import SummaryWriter

            self._tb = SummaryWriter(log_dir=str(run_dir / "tensorboard"))
        if cfg.mlflow:
            self._mlflow = MLflowSink(run_dir, cfg, run_name, config)
        self.progress = Progress(total_steps)  # elapsed time counts from here

    @property
    def run_id(self) -> str | None:
        """The wandb run id (saved in checkpoints so a resumed run continues it)."""
        return self._wandb.id if self._wandb is not None else None

    def rewind(self, last_step: int) -> None:
        """Forget metrics.jsonl and samples.jsonl records after ``last_step``: a resumed or
        recovered run logs those steps again (wandb, tensorboard and MLflow keep theirs)."""
        self._jsonl.close()
        trim_metrics(self.run_dir, last_step)
        self._jsonl = (self.run_dir / "metrics.jsonl").open("a")
        if self._samples is not None:
            self._samples.close()
            self._samples = None
        trim_metrics(self.run_dir, last_step, "samples.jsonl")

    def log(self, step: int, metrics: dict[str, float]) -> None:
        """Record ``metrics`` for ``step`` everywhere."""
        record = {
            "step": step,
            "time": time.time(),
            **{k: _jsonable(v) for k, v in metrics.items()},
        }
        self._jsonl.write(json.dumps(record) + "\n")
        self._jsonl.flush()
        if self._wandb is not None:
            self._wandb.log(metrics, step=step)
        if self._tb is not None:
            for key, value in metrics.items():
                if isinstance(value, (int, float)):
                    self._tb.add_scalar(key, value, step)
        if self._mlflow is not None:
            self._mlflow.log(step, metrics)
        if self.cfg.console:
            line = self.format_line(step, metrics, self.progress.text(step))
            print(line, file=sys.stderr, flush=True)

    def samples_due(self, step: int) -> bool:
        """Whether ``step`` logs a sample table (every ``tracking.sample_table_every``)."""
        every = self.cfg.sample_table_every
        return bool(every) and step % every == 0

    def log_samples(self, step: int, rows: list[dict]) -> None:
        """A table of samples (``SAMPLE_COLUMNS`` each): appended to samples.jsonl, and to
        wandb (a Table), tensorboard (text) and MLflow (a JSON artifact) when enabled."""
        if not rows:
            return
        if self._samples is None:
            self._samples = (self.run_dir / "samples.jsonl").open("a")
        for row in rows:
            record = {"step": step, **{c: _jsonable(row[c]) for c in SAMPLE_COLUMNS}}
            self._samples.write(json.dumps(record) + "\n")
        self._samples.flush()
        if self._wandb is not None:
            import wandb

            data = [[row[c] for c in SAMPLE_COLUMNS] for row in rows]
            self._wandb.log({"samples": wandb.Table(list(SAMPLE_COLUMNS), data)}, step=step)
        if self._tb is not None:
            self._tb.add_text("samples", _markdown_table(rows), step)
        if self._mlflow is not None:
            self._mlflow.log_samples(step, rows)

    def format_line(self, step: int, metrics: dict[str, float], progress: str = "") -> str:
        """A one-line human summary of a step (``progress``: elapsed time and ETA)."""
        total = f"/{self.total_steps}" if self.total_steps else ""
        parts = [f"{self.prefix}step {step}{total}"]
        if progress:
            parts.append(progress)
        for key, label, fmt in _CONSOLE_KEYS:
            if key in metrics and metrics[key] is not None:
                parts.append(f"{label} {fmt.format(metrics[key])}")
        stages = [
            f"{k.removeprefix('time/')} {v:.2f}"
            for k, v in metrics.items()
            if k.startswith("time/") and not k.startswith(_PER_WORKER_TIME)
        ]
        if stages:
            parts.append("(" + ", ".join(stages) + ")")
        return " | ".join(parts)

    def close(self) -> None:
        self._jsonl.close()
        if self._samples is not None:
            self._samples.close()
        if self._wandb is not None:
            self._wandb.finish()
        if self._tb is not None:
            self._tb.close()
        if self._mlflow is not None:
            self._mlflow.close()
