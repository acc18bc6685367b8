"""Checkpoints are read in formats that cannot run code: a payload planted in a downloaded
checkpoint's controller state is refused, never executed."""

from __future__ import annotations

import pickle

import numpy as np
import pytest

from rlsys.checkpoint.store import (
    CheckpointError,
    CheckpointStore,
    read_trainer_state,
    write_trainer_state,
)
from rlsys.commands.train import _resume_point
from rlsys.resolve import load_config


class _Payload:
    """Unpickling this runs ``open(marker, "w")``: proof that pickle ran code."""

    def __init__(self, marker: str) -> None:
        self.marker = marker

    def __reduce__(self):
        return (open, (self.marker, "w"))


def _planted_run(tmp_path, plant) -> CheckpointStore:
    store = CheckpointStore(tmp_path / "run" / "checkpoints", 2)
    store.save(1, plant)
    return store


def test_a_planted_trainer_pkl_is_never_unpickled(tmp_path):
    marker = tmp_path / "pwned"
    store = _planted_run(
        tmp_path,
        lambda tmp: (tmp / "trainer.pkl").write_bytes(pickle.dumps(_Payload(str(marker)))),
    )
    cfg = load_config([f"run.output_dir={tmp_path}", "run.name=run", "resume=auto"])
    with pytest.raises(CheckpointError, match="trainer.pkl.*can run code when read"):
        read_trainer_state(store.latest())
    with pytest.raises(CheckpointError, match="no checkpoint of .* loads"):
        _resume_point(cfg)
    assert not marker.exists()


def test_a_planted_object_array_is_never_unpickled(tmp_path):
    """The arrays file is read with allow_pickle=False: an object array in it (a pickle)
    makes the checkpoint unreadable instead of running."""
    marker = tmp_path / "pwned"

    def plant(tmp):
        write_trainer_state(tmp, {"run_info": {}, "rng": np.arange(3)})
        payload = np.array([_Payload(str(marker))], dtype=object)
        with (tmp / "trainer.npz").open("wb") as fh:
            np.savez(fh, a0=payload)

    store = _planted_run(tmp_path, plant)
    with pytest.raises(CheckpointError, match="trainer.npz is unreadable"):
        read_trainer_state(store.latest())
    assert not marker.exists()


def test_a_class_named_in_the_state_is_never_imported(tmp_path):
    """Only rlsys.types' dataclasses may be named; any other name is an error."""
    text = (
        '{"format": "rlsys.trainer_state", "version": 1, "arrays": [], "state": '
        '{"__dataclass__": "os.system", "fields": {"command": "touch pwned"}}}'
    )
    (tmp_path / "trainer.json").write_text(text)
    with pytest.raises(CheckpointError, match="'os.system' is not a class a trainer state"):
        read_trainer_state(tmp_path)


def test_a_planted_dcp_metadata_is_never_unpickled(tmp_path):
    """torch reads DCP's .metadata with pickle.load: rlsys scans its opcodes first and
    refuses a file naming anything a DCP checkpoint never holds (export and resume alike)."""
    import json

    from rlsys.backends.checkpoint import BackendCheckpointError
    from rlsys.backends.export import export_hf

    marker = tmp_path / "pwned"
    policy = tmp_path / "policy"
    (policy / "dcp").mkdir(parents=True)
    info = {"backend": "fsdp2", "role": "policy", "model_path": "builtin:tiny"}
    (policy / "backend.json").write_text(json.dumps({**info, "dtype": "float32"}))
    (policy / "dcp" / ".metadata").write_bytes(pickle.dumps(_Payload(str(marker))))
    with pytest.raises(BackendCheckpointError, match=r"names \['io open'\].*not read"):
        export_hf(str(policy), str(tmp_path / "out"))
    assert not marker.exists()


def test_a_planted_dcp_byte_item_is_never_unpickled(tmp_path):
    """DCP keeps non-tensor state (optimizer param_groups) as torch.save'd byte items, and
    torch's default planner reads them with weights_only=False. rlsys's planner does not:
    the same checkpoint that runs the payload under torch's planner is refused under ours."""
    import torch
    import torch.distributed.checkpoint as dcp
    from torch.distributed.checkpoint.api import CheckpointException
    from torch.distributed.checkpoint.default_planner import DefaultLoadPlanner

    from rlsys.backends.checkpoint import check_dcp_metadata, safe_load_planner

    marker = tmp_path / "pwned"
    root = tmp_path / "dcp"
    state = {"model": {"w": torch.ones(2)}, "optim": {"param_groups": [_Payload(str(marker))]}}
    dcp.save(state, checkpoint_id=str(root), no_dist=True)
    check_dcp_metadata(root)  # the metadata itself is clean: the payload is in a .distcp

    def load(planner) -> None:
        target = {"model": {"w": torch.zeros(2)}, "optim": {"param_groups": [None]}}
        dcp.load(target, checkpoint_id=str(root), planner=planner, no_dist=True)

    with pytest.raises(CheckpointException) as refused:  # a BaseException
        load(safe_load_planner())
    assert "Weights only load failed" in str(refused.value)
    assert not marker.exists()
    load(DefaultLoadPlanner())  # the attack is real: torch's own planner runs it
    assert marker.exists()


def test_a_planted_deepspeed_file_is_never_unpickled(tmp_path):
    """DeepSpeed reads its checkpoint files with torch.load(weights_only=False): rlsys scans
    each file's pickle first and refuses one naming anything a ZeRO checkpoint never holds."""
    import json

    import torch

    from rlsys.backends.checkpoint import BackendCheckpointError
    from rlsys.backends.export import export_hf

    marker = tmp_path / "pwned"
    policy = tmp_path / "policy"
    state = policy / "deepspeed" / "state"
    state.mkdir(parents=True)
    info = {"backend": "deepspeed", "role": "policy", "model_path": "builtin:tiny"}
    (policy / "backend.json").write_text(json.dumps({**info, "dtype": "float32"}))
    torch.save({"module": {"w": torch.ones(2)}}, state / "mp_rank_00_model_states.pt")
    torch.save({"loss_scaler": _Payload(str(marker))}, state / "zero_pp_rank_0_optim_states.pt")
    with pytest.raises(BackendCheckpointError, match=r"optim_states.pt .*names \['io open'\]"):
        export_hf(str(policy), str(tmp_path / "out"))
    assert not marker.exists()
