"""Reward scoring safety, built-in model/tokenizer, HF engine, weight encoding, trackers."""

from __future__ import annotations

import json
import time

import numpy as np
import pytest
import torch

from rlsys.config.errors import ConfigError
from rlsys.config.schema import TrackingConfig
from rlsys.models.loading import load_model, load_tokenizer
from rlsys.rewards import REWARDS, score
from rlsys.run.tracking import Tracker
from rlsys.weight_sync.object_store import decode, encode


def test_builtin_verifiers():
    exact = REWARDS.get("exact_match")
    assert exact("1+1=", " 200 ", {"answer": "200"}) == 1.0
    assert exact("1+1=", "201", {"answer": "200"}) == 0.0
    last = REWARDS.get("last_number")
    assert last("q", "first 3, then 1,024", {"answer": "1024"}) == 1.0
    assert last("q", "no digits", {"answer": "1"}) == 0.0
    with pytest.raises(ConfigError, match="task.reward"):
        REWARDS.get("nope")


def test_reward_exceptions_and_timeouts_become_zero_with_an_error():
    def broken(prompt, completion, metadata):
        raise RuntimeError("bug")

    def slow(prompt, completion, metadata):
        time.sleep(2)
        return 1.0

    async def async_ok(prompt, completion, metadata):
        return {"reward": 0.5, "correct": True}

    out = score(broken, "p", "c", {})
    assert out.reward == 0.0 and "RuntimeError" in out.error
    out = score(slow, "p", "c", {}, timeout_s=0.2)
    assert out.reward == 0.0 and "timeout" in out.error
    out = score(async_ok, "p", "c", {})
    assert out.reward == 0.5 and out.correct and out.error is None


def test_char_tokenizer_roundtrips_and_model_has_head_dim_32(tiny_model_dir):
    tok = load_tokenizer(tiny_model_dir)
    ids = tok.encode("12+34=", add_special_tokens=False)
    assert len(ids) == 6 and tok.decode(ids) == "12+34="
    assert tok.decode(ids + [tok.eos_token_id], skip_special_tokens=True) == "12+34="
    model = load_model(tiny_model_dir)
    cfg = model.config
    assert cfg.hidden_size // cfg.num_attention_heads >= 32
    assert cfg.vocab_size == len(tok)


def test_weight_encoding_roundtrips_bf16_and_fp32():
    bucket = {"a": torch.randn(3, 4), "b": torch.randn(5).to(torch.bfloat16)}
    payload = encode(bucket)
    assert all(isinstance(arr, np.ndarray) for arr, _ in payload.values())
    back = decode(payload)
    assert torch.equal(back["a"], bucket["a"]) and back["b"].dtype == torch.bfloat16
    assert torch.equal(back["b"], bucket["b"])


def test_tracker_writes_jsonl_tensorboard_and_offline_wandb(tmp_path, monkeypatch, capsys):
    monkeypatch.setenv("WANDB_SILENT", "true")
    cfg = TrackingConfig(wandb=True, wandb_mode="offline", tensorboard=True)
    tracker = Tracker(tmp_path, cfg, "t", {"x": 1}, total_steps=2)
    tracker.log(1, {"rollout/reward_mean": 0.5, "time/train": 0.1, "train/kl": float("nan")})
    tracker.log(2, {"eval/accuracy": 0.75})
    tracker.close()
    lines = [json.loads(x) for x in (tmp_path / "metrics.jsonl").read_text().splitlines()]
    assert lines[0]["rollout/reward_mean"] == 0.5 and lines[0]["train/kl"] is None
    assert lines[1]["eval/accuracy"] == 0.75
    assert list((tmp_path / "tensorboard").glob("events.out.tfevents.*"))
    assert list((tmp_path / "wandb").glob("offline-run-*"))
    assert "EVAL 0.750" in capsys.readouterr().err
