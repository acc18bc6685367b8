"""``auto`` precision (rlsys/resolve/precision.py): bf16 where the pool's hardware has bf16
units, fp32 elsewhere, each decision said."""

from __future__ import annotations

import pytest

from rlsys.config import ConfigError
from rlsys.config.loader import read_config
from rlsys.resolve import load_config
from rlsys.resolve.precision import Bf16Units, resolve_precision

BF16_CPU = Bf16Units(True, "this CPU has avx512_bf16", True, "H100 has bf16")
PLAIN_CPU = Bf16Units(False, "this CPU has no AMX or avx512_bf16", False, "V100 lacks bf16")
AUTO = ["learner.mixed_precision=auto", "critic.mixed_precision=auto", "rollout.dtype=auto"]


def test_cpu_with_bf16_units_gets_bf16_everywhere():
    cfg, notes = resolve_precision(read_config(AUTO), BF16_CPU)
    assert cfg.learner.mixed_precision == "bfloat16"
    assert cfg.critic.mixed_precision == "bfloat16"
    assert cfg.rollout.dtype == "bfloat16"
    assert notes == [
        "learner.mixed_precision=auto -> bfloat16: this CPU has avx512_bf16",
        "critic.mixed_precision=auto -> bfloat16: this CPU has avx512_bf16",
        "rollout.dtype=auto -> bfloat16: this CPU has avx512_bf16",
    ]


def test_cpu_without_bf16_units_stays_fp32_and_says_why():
    cfg, notes = resolve_precision(read_config(AUTO), PLAIN_CPU)
    assert cfg.learner.mixed_precision is None and cfg.critic.mixed_precision is None
    assert cfg.rollout.dtype is None  # the engines take model.dtype
    assert notes[0] == "learner.mixed_precision=auto -> null (fp32): " + PLAIN_CPU.cpu_reason
    assert notes[2] == "rollout.dtype=auto -> null (float32): " + PLAIN_CPU.cpu_reason


def test_each_pool_is_decided_by_its_own_hardware():
    overrides = [*AUTO, "rollout.num_gpus_per_worker=1"]
    cfg, notes = resolve_precision(read_config(overrides), PLAIN_CPU)
    assert cfg.learner.mixed_precision is None  # CPU learner on a CPU without bf16 units
    assert cfg.rollout.dtype is None  # this machine's GPUs lack bf16
    assert notes[2].endswith("V100 lacks bf16")
    gpu = Bf16Units(False, PLAIN_CPU.cpu_reason, True, "H100 has bf16")
    cfg, _ = resolve_precision(read_config(overrides), gpu)
    assert (cfg.learner.mixed_precision, cfg.rollout.dtype) == (None, "bfloat16")


def test_bf16_master_weights_get_no_mixed_precision():
    overrides = ["learner.mixed_precision=auto", "model.dtype=bfloat16"]
    cfg, notes = resolve_precision(read_config(overrides), BF16_CPU)
    assert cfg.learner.mixed_precision is None
    assert "needs fp32 master weights" in notes[0]


def test_explicit_settings_are_left_alone_and_nothing_is_measured():
    cfg = read_config(["learner.mixed_precision=bfloat16"])
    assert resolve_precision(cfg, units=None) == (cfg, [])  # units=None would measure


def test_load_config_decides_and_logs(caplog):
    with caplog.at_level("INFO", logger="rlsys"):
        cfg = load_config(["rollout.dtype=auto"])
    assert cfg.rollout.dtype in ("bfloat16", None)
    assert any("rollout.dtype=auto -> " in record.message for record in caplog.records)


def test_a_wrong_value_names_auto_among_the_choices():
    with pytest.raises(ConfigError, match="auto"):
        read_config(["learner.mixed_precision=bf16"])
