"""Trackers write what they are given: tensorboard scalars and text, wandb offline runs and
tables, MLflow's offline store, samples.jsonl (trimmed on a rewind); the console line's ETA."""

from __future__ import annotations

import json
import socket
import time

import pytest

from rlsys.config.errors import ConfigError
from rlsys.config.schema import TrackingConfig
from rlsys.run.progress import Progress, format_duration
from rlsys.run.tracking import Tracker, flatten
from rlsys.trainers.rl.sample_metrics import sample_rows
from rlsys.types import Completion, Prompt, RolloutGroup, Sample

ROW = {"prompt": "1+2=", "answer": "300", "response": "300", "reward": 1.0, "correct": True}


def _tracker(tmp_path, **cfg) -> Tracker:
    return Tracker(tmp_path, TrackingConfig(**cfg), "t", {"a": {"b": 1}}, total_steps=4)


def test_tensorboard_writes_scalars_and_the_sample_table(tmp_path):
    from tensorboard.backend.event_processing.event_accumulator import EventAccumulator

    tracker = _tracker(tmp_path, tensorboard=True, console=False)
    tracker.log(1, {"rollout/reward_mean": 0.25})
    tracker.log(2, {"rollout/reward_mean": 0.5})
    tracker.log_samples(2, [ROW])
    tracker.close()
    events = EventAccumulator(str(tmp_path / "tensorboard"), size_guidance={"tensors": 0})
    events.Reload()
    scalars = events.Scalars("rollout/reward_mean")
    assert [(e.step, e.value) for e in scalars] == [(1, 0.25), (2, 0.5)]
    text = events.Tensors("samples/text_summary")[0]
    assert (
        text.step == 2 and b"| 1+2= | 300 | 300 | 1.0 | True |" in text.tensor_proto.string_val[0]
    )


def test_wandb_offline_run_holds_the_metrics_and_the_table(tmp_path, monkeypatch):
    monkeypatch.setenv("WANDB_SILENT", "true")
    tracker = _tracker(tmp_path, wandb=True, console=False)
    tracker.log(1, {"rollout/reward_mean": 0.25})
    tracker.log_samples(1, [ROW])
    tracker.close()
    (run,) = (tmp_path / "wandb").glob("offline-run-*")
    (log,) = run.glob("run-*.wandb")
    # wandb-core can finish writing its transaction log just after finish() returns (a CI run
    # on a loaded machine read the 7-byte header alone): wait for it, a bounded time
    deadline = time.monotonic() + 30
    while b"rollout/reward_mean" not in log.read_bytes() and time.monotonic() < deadline:
        time.sleep(0.2)
    assert b"rollout/reward_mean" in log.read_bytes()
    assert list(run.glob("files/media/table/samples_*.table.json"))


def test_mlflow_offline_store_params_metrics_tables_and_a_continued_run(tmp_path):
    from mlflow.tracking import MlflowClient

    tracker = _tracker(tmp_path, mlflow=True, console=False)
    tracker.log(1, {"rollout/reward_mean": 0.25, "train/kl": float("nan"), "x": None})
    tracker.log_samples(1, [ROW])
    tracker.close()
    resumed = _tracker(tmp_path, mlflow=True, console=False)  # same run dir: same MLflow run
    resumed.log(2, {"rollout/reward_mean": 0.5})
    resumed.close()
    client = MlflowClient(f"sqlite:///{tmp_path / 'mlflow.db'}")
    (run,) = client.search_runs([client.get_experiment_by_name("rlsys").experiment_id])
    assert run.info.status == "FINISHED" and run.data.params == {"a.b": "1"}
    history = client.get_metric_history(run.info.run_id, "rollout/reward_mean")
    assert [(m.step, m.value) for m in history] == [(1, 0.25), (2, 0.5)]
    (table,) = tmp_path.glob("mlartifacts/*/artifacts/samples/step_000001.json")
    assert json.loads(table.read_text())["data"] == [["1+2=", "300", "300", 1.0, True]]


def test_an_mlflow_server_that_does_not_answer_fails_fast_naming_the_key(tmp_path):
    with socket.socket() as sock:  # a port nothing listens on once closed
        sock.bind(("127.0.0.1", 0))
        port = sock.getsockname()[1]
    started = time.perf_counter()
    with pytest.raises(ConfigError, match=f"tracking.mlflow_tracking_uri=http://127.0.0.1:{port}"):
        _tracker(tmp_path, mlflow=True, mlflow_tracking_uri=f"http://127.0.0.1:{port}")
    assert time.perf_counter() - started < 10


def test_an_mlflow_failure_mid_run_warns_once_and_training_goes_on(tmp_path, caplog):
    class DownStore:
        calls = 0

        def log_batch(self, *args, **kwargs):
            DownStore.calls += 1
            raise ConnectionError("server went away")

    tracker = _tracker(tmp_path, mlflow=True, console=False)
    tracker._mlflow.client = DownStore()
    tracker.log(1, {"rollout/reward_mean": 0.25})
    tracker.log(2, {"rollout/reward_mean": 0.5})
    tracker.close()
    assert DownStore.calls == 1 and "no more MLflow logging" in caplog.text
    assert len((tmp_path / "metrics.jsonl").read_text().splitlines()) == 2


def test_samples_jsonl_is_appended_and_trimmed_on_rewind(tmp_path):
    tracker = _tracker(tmp_path, console=False, sample_table_every=2)
    assert [s for s in range(1, 7) if tracker.samples_due(s)] == [2, 4, 6]
    for step in (2, 4):
        tracker.log(step, {"rollout/reward_mean": 0.5})
        tracker.log_samples(step, [ROW, {**ROW, "response": "301", "correct": False}])
    tracker.rewind(2)  # recovered from a step-2 checkpoint: step 4 is logged again
    tracker.log_samples(4, [ROW])
    tracker.close()
    records = [json.loads(x) for x in (tmp_path / "samples.jsonl").read_text().splitlines()]
    assert [(r["step"], r["response"]) for r in records] == [(2, "300"), (2, "301"), (4, "300")]
    assert records[1] == {**ROW, "step": 2, "response": "301", "correct": False}
    assert not _tracker(tmp_path, sample_table_every=0).samples_due(25)


def test_sample_rows_take_one_sample_per_prompt_first():
    def group(uid: int, rewards: list[float]) -> RolloutGroup:
        prompt = Prompt(uid, f"{uid}+0=", f"{uid:03d}")
        samples = [
            Sample(prompt, [1], Completion([2], [0.0], "stop", 0), f"r{uid}.{i}", r, r > 0)
            for i, r in enumerate(rewards)
        ]
        return RolloutGroup(prompt, samples)

    rows = sample_rows([group(1, [1.0, 0.0]), group(2, [0.0, 0.0])], 3)
    assert [r["response"] for r in rows] == ["r1.0", "r2.0", "r1.1"]
    assert rows[0] == {
        "prompt": "1+0=",
        "answer": "001",
        "response": "r1.0",
        "reward": 1.0,
        "correct": True,
    }


def test_console_line_has_elapsed_time_and_eta_but_not_per_worker_times(tmp_path, capsys):
    now = [100.0]
    progress = Progress(10, clock=lambda: now[0])
    assert progress.text(0) == "elapsed 0s"  # no pace yet
    now[0] = 130.0
    assert progress.text(2) == "elapsed 30s, eta 2m00s"  # 15 s a step, 8 to go
    assert Progress(10, start_step=0, clock=lambda: 100.0).text(0) == "elapsed 0s"
    assert [format_duration(s) for s in (5, 65, 3725)] == ["5s", "1m05s", "1h02m"]
    tracker = _tracker(tmp_path)
    tracker.log(1, {"time/train": 0.5, "time/rollout_worker_0": 0.2})
    tracker.close()
    line = capsys.readouterr().err
    assert line.startswith("step 1/4 | elapsed 0s | (train 0.50)"), line


@pytest.mark.parametrize(
    ("field", "value", "needle"),
    [
        ("sample_table_every", -1, "tracking.sample_table_every=-1 must be >= 0"),
        ("sample_table_rows", 0, "tracking.sample_table_rows=0 must be > 0"),
        ("mlflow_experiment", "", "tracking.mlflow_experiment is empty"),
    ],
)
def test_bad_tracking_values_name_the_key(field, value, needle):
    with pytest.raises(ConfigError, match=needle):
        TrackingConfig(**{field: value})


def test_flatten_gives_dotted_string_params():
    config = {"a": {"b": 1, "c": [1, 2], "d": {}}, "e": None, "f": "x", "g": True}
    assert flatten(config) == {
        "a.b": "1",
        "a.c": "[1, 2]",
        "a.d": "{}",
        "e": "null",
        "f": "x",
        "g": "true",
    }
