"""A careless user's inputs: bad dataset files, batch sizes, model paths, output directories,
presets and export paths each end ``rlsys`` with exit code 2 and one line naming the key,
file or line at fault and the fix, within seconds, before Ray starts and before a run
directory exists (the real CLI entry point, in this process)."""

from __future__ import annotations

import json
import logging
import time

import pytest

from rlsys.cli import main
from rlsys.data.rows import read_rows

FAST_S = 5.0  # config and data errors come back within this (imports aside: they are warm)


@pytest.fixture(autouse=True)
def no_ray(monkeypatch):
    """Fail the test if a command gets as far as starting or joining Ray (``ray`` itself may
    be initialised already: other tests of the session share one local Ray)."""

    def refuse(*args, **kwargs):
        raise AssertionError("the command reached connect_ray: the error came too late")

    monkeypatch.setattr("rlsys.app.connect_ray", refuse)


def _train(capsys, tmp_path, *overrides: str) -> str:
    """``rlsys train`` with ``overrides``: exit code 2 within FAST_S, before Ray (the
    no_ray fixture), no run directory; returns what it printed to stderr."""
    out = tmp_path / "runs"
    start = time.monotonic()
    code = main(["train", f"run.output_dir={out}", "run.name=r", *overrides])
    took = time.monotonic() - start
    err = capsys.readouterr().err
    assert code == 2, err
    assert took < FAST_S, f"{took:.1f}s: {err}"
    assert not (out / "r").exists()
    return err


def _file_task(path) -> list[str]:
    return [
        "task.name=file",
        f"task.train_path={path}",
        "task.eval_size=200",
        "eval.num_prompts=2",
    ]


def test_dataset_files_that_cannot_be_used(capsys, tmp_path):
    missing = tmp_path / "nope.jsonl"
    assert f"task.train_path='{missing}' does not exist" in _train(
        capsys, tmp_path, *_file_task(missing)
    )
    empty = tmp_path / "empty.jsonl"
    empty.write_text("\n")
    assert "holds no rows" in _train(capsys, tmp_path, *_file_task(empty))
    wrong = tmp_path / "wrong.jsonl"
    wrong.write_text('{"q": "1+1=", "a": "2"}\n' * 3)
    err = _train(capsys, tmp_path, *_file_task(wrong))
    assert "none of its 3 rows has usable ['prompt', 'answer'] columns" in err
    assert "its columns are ['a', 'q']" in err and "task.prompt_key" in err
    junk = tmp_path / "junk.jsonl"
    junk.write_bytes(b"[1, 2]\n42\n\xff\xfe\nnot json\n")
    assert "none of its 4 rows" in _train(capsys, tmp_path, *_file_task(junk))
    assert "is a directory; pass a .jsonl or .parquet" in _train(
        capsys, tmp_path, *_file_task(tmp_path)
    )
    csv = tmp_path / "rows.csv"
    csv.write_text("prompt,answer\n")
    assert "use a .jsonl or .parquet file" in _train(capsys, tmp_path, *_file_task(csv))


def test_bad_lines_are_skipped_and_counted_with_their_line_numbers(tmp_path, caplog):
    path = tmp_path / "mixed.jsonl"
    good = [json.dumps({"prompt": f"{i}+1=", "answer": str(i + 1)}) for i in range(3)]
    lines = [good[0], "[1, 2]", "42", good[1], "not json", good[2]]
    path.write_bytes("\n".join(lines).encode() + b"\n\xff oops\n")
    with caplog.at_level(logging.WARNING):
        rows = read_rows(str(path))
    assert [r for r in rows if r] == [json.loads(g) for g in good]
    assert len(rows) == 7  # the bad ones are {} for the caller to count as malformed
    assert "2 lines not a JSON object (lines 2, 3)" in caplog.text
    assert "1 lines not JSON (lines 5)" in caplog.text
    assert "1 lines not UTF-8 (lines 7)" in caplog.text


def test_a_batch_larger_than_the_training_split(capsys, tmp_path):
    err = _train(capsys, tmp_path, "data.batch_size=100000000", "task.train_size=64")
    assert "data.batch_size=100000000 exceeds the 64 usable training prompts" in err


def test_model_paths_that_are_not_models(capsys, tmp_path):
    missing = tmp_path / "no_model"
    assert f"model.path='{missing}' does not exist" in _train(
        capsys, tmp_path, f"model.path={missing}"
    )
    empty = tmp_path / "empty_model"
    empty.mkdir()
    assert "has no config.json" in _train(capsys, tmp_path, f"model.path={empty}")
    (empty / "config.json").write_text("{broken")
    assert "config.json is unreadable" in _train(capsys, tmp_path, f"model.path={empty}")


def test_model_weights_that_cannot_load_are_refused_before_ray(capsys, tmp_path, tiny_model_dir):
    """Issue 47: a truncated model.safetensors, or a config.json whose vocab_size is absurd or
    not the weights', passed the checks and failed in every actor half a minute after Ray
    started; the safetensors headers and config.json are checked first (headers only)."""
    import json
    import shutil

    def copy(name: str):
        model = tmp_path / name
        shutil.copytree(tiny_model_dir, model)
        return model, json.loads((model / "config.json").read_text())

    truncated, _ = copy("truncated")
    weights = truncated / "model.safetensors"
    weights.write_bytes(weights.read_bytes()[: weights.stat().st_size // 2])
    err = _train(capsys, tmp_path, f"model.path={truncated}")
    assert "model.safetensors is truncated or damaged" in err and "re-download" in err
    garbage, _ = copy("garbage")
    (garbage / "model.safetensors").write_bytes(b"\xff" * 64)
    assert "is not a readable safetensors file" in _train(capsys, tmp_path, f"model.path={garbage}")
    absurd, config = copy("absurd")
    (absurd / "config.json").write_text(json.dumps({**config, "vocab_size": 10**12}))
    assert "beyond any real model" in _train(capsys, tmp_path, f"model.path={absurd}")
    other, config = copy("other")
    (other / "config.json").write_text(json.dumps({**config, "vocab_size": 1000}))
    assert "of different models" in _train(capsys, tmp_path, f"model.path={other}")


def test_an_output_directory_that_cannot_be_written(capsys, tmp_path):
    a_file = tmp_path / "a_file"
    a_file.write_text("x")
    start = time.monotonic()
    code = main(["train", f"run.output_dir={a_file}/runs", "run.name=r"])
    err = capsys.readouterr().err
    assert code == 2 and time.monotonic() - start < FAST_S
    assert f"run.output_dir={a_file}/runs: cannot create the run directory there" in err
    assert "(Not a directory" in err and "set run.output_dir to a directory you can write" in err
    code = main(["train", "run.output_dir=/proc/rlsys-runs", "run.name=r"])  # a system dir
    err = capsys.readouterr().err
    assert code == 2 and "run.output_dir=/proc/rlsys-runs: cannot create the run directory" in err
    assert time.monotonic() - start < 2 * FAST_S


@pytest.mark.parametrize(
    "override, words",
    [
        ("=5", "override '=5' is not key=value"),
        ("task=nope", "task=nope: no preset"),
        ("task=nope", "use one of ['arithmetic'"),
        ("badpreset=1", "unknown config key 'badpreset'"),
    ],
)
def test_config_overrides_that_cannot_compose(capsys, tmp_path, override, words):
    assert words in _train(capsys, tmp_path, override)


def test_user_presets_that_cannot_compose(capsys, tmp_path, monkeypatch):
    import shutil

    from rlsys.config.loader import conf_dir

    presets = tmp_path / "conf"
    shutil.copytree(conf_dir(), presets)
    (presets / "task" / "bad_yaml.yaml").write_text("name: file\n  oops: [\n")
    (presets / "task" / "bad_key.yaml").write_text("name: arithmetic\nnot_a_key: 3\n")
    monkeypatch.setenv("RLSYS_CONF_DIR", str(presets))
    err = _train(capsys, tmp_path, "task=bad_yaml")
    assert f"invalid YAML in {presets}/task/bad_yaml.yaml, line 2, column 7" in err
    err = _train(capsys, tmp_path, "task=bad_key")
    assert f"unknown config key 'task.not_a_key' (in preset {presets}/task/bad_key.yaml)" in err
    monkeypatch.setenv("RLSYS_CONF_DIR", str(tmp_path / "missing"))
    assert f"RLSYS_CONF_DIR={tmp_path / 'missing'} is not a directory of presets" in _train(
        capsys, tmp_path
    )


def test_export_inputs_that_cannot_be_exported(capsys, tmp_path):
    a_file = tmp_path / "a_file"
    a_file.write_text("x")
    assert main(["export", str(tmp_path / "nowhere"), str(tmp_path / "out")]) == 2
    assert "is not a directory; pass a run directory" in capsys.readouterr().err
    run = tmp_path / "run"
    (run / "checkpoints").mkdir(parents=True)
    assert main(["export", str(run), str(tmp_path / "out")]) == 2
    assert f"run directory {run} has no complete checkpoint" in capsys.readouterr().err
    assert main(["export", str(run / "checkpoints"), str(a_file / "out")]) == 2
    assert "is not a run directory, a checkpoint or a policy directory" in capsys.readouterr().err
    shards = tmp_path / "policy"  # a backend checkpoint whose shard index is garbage
    (shards / "dcp").mkdir(parents=True)
    info = {"backend": "fsdp2", "role": "policy", "model_path": "builtin:tiny"}
    (shards / "backend.json").write_text(json.dumps({**info, "dtype": "float32"}))
    (shards / "dcp" / ".metadata").write_bytes(b"\x80\x04garbage")
    assert main(["export", str(shards), str(a_file / "out")]) == 2
    assert "cannot create the output directory" in capsys.readouterr().err
    assert main(["export", str(shards), str(tmp_path / "out")]) == 2
    err = capsys.readouterr().err
    assert "DCP metadata" in err and "not a valid pickle" in err
    assert "weights_only" not in err and "Traceback" not in err


@pytest.mark.parametrize("damage", ["random bytes", "truncated", "zeros"])
def test_export_of_a_damaged_shard_names_the_file(capsys, tmp_path, damage):
    """A DCP shard (``.distcp``) that is not what its metadata says: exit 2 naming the file,
    without torch's advice to load it with ``weights_only=False`` (issue 47 item 18)."""
    import random

    import torch
    import torch.distributed.checkpoint as dcp

    policy = tmp_path / "policy"
    state = {"model": {"w": torch.ones(64)}, "optim": {"param_groups": [{"lr": 0.1}]}}
    dcp.save(state, checkpoint_id=str(policy / "dcp"), no_dist=True)
    info = {"backend": "fsdp2", "role": "policy", "model_path": "builtin:tiny"}
    (policy / "backend.json").write_text(json.dumps({**info, "dtype": "float32"}))
    (shard,) = (policy / "dcp").glob("*.distcp")
    size = shard.stat().st_size
    if damage == "random bytes":
        shard.write_bytes(random.Random(0).randbytes(size))
    elif damage == "truncated":
        shard.write_bytes(shard.read_bytes()[: size // 2])
    else:
        shard.write_bytes(bytes(size))
    assert main(["export", str(policy), str(tmp_path / "out")]) == 2
    err = capsys.readouterr().err
    assert f"{shard}" in err and "damaged" in err and "export an earlier one" in err, err
    assert "weights_only" not in err and "Traceback" not in err, err


def test_resume_over_damaged_checkpoints_changes_nothing(capsys, tmp_path):
    """resume=auto over checkpoints none of which is complete: exit 2 naming them, within
    seconds, and the old run's files are as they were (nothing deleted, nothing appended)."""
    from rlsys.checkpoint.store import CheckpointStore, write_trainer_state

    run = tmp_path / "runs" / "r"
    store = CheckpointStore(run / "checkpoints", 2)
    for step in (1, 2):
        path = store.save(step, lambda tmp: write_trainer_state(tmp, {"run_info": {}}))
        (path / "manifest.json").unlink()
    (run / "metrics.jsonl").write_text('{"step": 1}\n{"step": 2}\n')
    before = sorted((p, p.stat().st_size, p.stat().st_mtime_ns) for p in run.rglob("*"))
    start = time.monotonic()
    code = main(["train", f"run.output_dir={tmp_path / 'runs'}", "run.name=r", "resume=auto"])
    err = capsys.readouterr().err
    assert code == 2 and time.monotonic() - start < FAST_S, err
    assert "checkpoint error: resume=auto: no checkpoint of" in err and "step_000002" in err
    assert sorted((p, p.stat().st_size, p.stat().st_mtime_ns) for p in run.rglob("*")) == before
