"""Backend checkpoints on gloo in real processes: a load restores exactly the saved state
(FSDP2, DeepSpeed ZeRO-2 and ZeRO-3), FSDP2 checkpoints reshard between world sizes, the
offline export equals the live weights, and bad checkpoints fail naming their path."""

from __future__ import annotations

import json
import shutil

import pytest
import torch
from backend_harness import NO_DEEPSPEED, build, full_state, run_ranks, toy_batch, train_on

from rlsys.algorithms.objectives import PolicyObjective
from rlsys.algorithms.policy_losses import ClipSettings
from rlsys.backends.checkpoint import BackendCheckpointError
from rlsys.models.loading import load_tokenizer

OBJECTIVE = PolicyObjective(loss_settings=ClipSettings(dual_clip=3.0))
KINDS = ["fsdp2", "zero2", "zero3"]
TOP_LEVEL = {"backend.json", "state.json", "rng"}
SHARDS = {"fsdp2": "dcp", "zero2": "deepspeed", "zero3": "deepspeed"}
OPTIM = {"warmup_steps": 2, "min_lr_ratio": 0.5}  # the run's config (set_lr's values are state)


def _needs(kind: str) -> None:
    if kind != "fsdp2":
        pytest.importorskip("deepspeed", reason=NO_DEEPSPEED)


def _save_then_train(rank, world_size, model_dir, kind, ckpt_dir, hf_dir):
    """One step (warm-up + cosine schedule), save, train on; then load into this used
    backend and train the same batches again."""
    backend = build(kind, model_dir, **OPTIM)
    backend.set_lr(2e-3, decay_steps=6)
    backend.train_step(toy_batch(model_dir, 0), OBJECTIVE, 2, 1, seed=0)
    backend.save_checkpoint(ckpt_dir)
    backend.save_hf(hf_dir)
    out = {"at_save": full_state(backend), "rand": torch.rand(3)}
    out["continued"] = train_on(backend, model_dir, OBJECTIVE)
    backend.load_checkpoint(ckpt_dir)
    out["rand_reloaded"] = torch.rand(3)
    out["reloaded"] = train_on(backend, model_dir, OBJECTIVE)
    return out


def _load_then_train(rank, world_size, model_dir, kind, ckpt_dir, resave_dir=None):
    """A fresh backend (set_lr never called) loads the checkpoint and trains on."""
    backend = build(kind, model_dir, **OPTIM)
    backend.load_checkpoint(ckpt_dir)
    out = {"rand": torch.rand(3), "loaded": full_state(backend)}
    if resave_dir:
        backend.save_checkpoint(resave_dir)
    out["continued"] = train_on(backend, model_dir, OBJECTIVE)
    return out


@pytest.fixture(scope="module")
def saved(tiny_model_dir, tmp_path_factory):
    """``saved(kind) -> (dir, per-rank results of _save_then_train)`` on 2 ranks, run once."""
    cache = {}

    def get(kind):
        if kind not in cache:
            root = tmp_path_factory.mktemp(kind)
            results = run_ranks(
                _save_then_train,
                2,
                root / "out",
                tiny_model_dir,
                kind,
                str(root / "ckpt"),
                str(root / "hf"),
            )
            cache[kind] = root, results
        return cache[kind]

    return get


def _assert_equal_runs(a: dict, b: dict, what: str) -> None:
    assert a["metrics"] == b["metrics"], f"{what}: losses/metrics differ"
    assert a["state"].keys() == b["state"].keys()
    for name, tensor in a["state"].items():
        assert torch.equal(tensor, b["state"][name]), f"{what}: {name} differs"


@pytest.mark.parametrize("kind", KINDS)
def test_load_restores_exactly_the_saved_state(saved, tiny_model_dir, tmp_path, kind):
    """Save after step 1, train 2 more; fresh processes load and train the same batches:
    identical losses, learning rates and weights, and each rank's RNG stream goes on where it
    was. Loading into the used backend does the same."""
    _needs(kind)
    root, first = saved(kind)
    ckpt = root / "ckpt"
    assert {p.name for p in ckpt.iterdir()} == TOP_LEVEL | {SHARDS[kind]}
    assert sorted(p.name for p in (ckpt / "rng").iterdir()) == ["rank_00000.pt", "rank_00001.pt"]
    info = json.loads((ckpt / "backend.json").read_text())
    assert info["backend"] == ("fsdp2" if kind == "fsdp2" else "deepspeed")
    assert info["zero_stage"] == {"fsdp2": None, "zero2": 2, "zero3": 3}[kind]
    assert (info["role"], info["world_size"], info["dtype"]) == ("policy", 2, "float32")
    assert info["model_path"] == tiny_model_dir

    second = run_ranks(_load_then_train, 2, tmp_path, tiny_model_dir, kind, str(ckpt))
    lrs = [m["lr"] for m in first[0]["continued"]["metrics"]]
    assert lrs[0] != lrs[1] != 2e-3  # the schedule moves: a wrong restore would show
    _assert_equal_runs(first[0]["continued"], second[0]["continued"], f"{kind} fresh load")
    _assert_equal_runs(first[0]["continued"], first[0]["reloaded"], f"{kind} load in place")
    for rank in (0, 1):
        assert torch.equal(second[rank]["rand"], first[rank]["rand"])
        assert torch.equal(first[rank]["rand_reloaded"], first[rank]["rand"])


@pytest.mark.parametrize("kind", KINDS)
def test_export_hf_equals_the_live_weights(saved, tiny_model_dir, tmp_path, kind):
    """The offline export (no process group) loads with transformers and holds exactly the
    weights the live backend had at the save (what its save_hf wrote)."""
    _needs(kind)
    import torch.distributed as dist
    from transformers import AutoModelForCausalLM

    from rlsys.backends.export import export_hf

    root, first = saved(kind)
    export_hf(str(root / "ckpt"), str(tmp_path / "export"))
    assert not dist.is_initialized()
    exported = AutoModelForCausalLM.from_pretrained(tmp_path / "export").state_dict()
    live = AutoModelForCausalLM.from_pretrained(root / "hf").state_dict()
    assert exported.keys() == live.keys()
    for name, tensor in live.items():
        assert torch.equal(exported[name], tensor), name
    for name, tensor in first[0]["at_save"].items():
        assert torch.equal(exported[name], tensor), name
    # both directories read back the source's tokenizer: the same ids for the same text (a
    # re-save through AutoTokenizer turned the built-in char tokenizer into byte-level BPE)
    text = "the soup at the cafe was great and 12+34=46"
    expected = load_tokenizer(str(tiny_model_dir)).encode(text, add_special_tokens=False)
    for saved_dir in (tmp_path / "export", root / "hf"):
        assert load_tokenizer(str(saved_dir)).encode(text, add_special_tokens=False) == expected


def test_fsdp_checkpoints_reshard_between_world_sizes(saved, tiny_model_dir, tmp_path):
    """A 2-rank FSDP2 checkpoint loads into 1 rank with the same weights (and trains on like
    2 ranks); saved again from 1 rank, it loads into 2 ranks and trains on exactly as the
    original 2 ranks did."""
    root, first = saved("fsdp2")
    resaved = tmp_path / "ws1_ckpt"
    one = run_ranks(
        _load_then_train,
        1,
        tmp_path / "ws1",
        tiny_model_dir,
        "fsdp2",
        str(root / "ckpt"),
        str(resaved),
    )[0]
    for name, tensor in first[0]["at_save"].items():
        assert torch.equal(one["loaded"][name], tensor), f"2 -> 1 ranks: {name}"
    for a, b in zip(one["continued"]["metrics"], first[0]["continued"]["metrics"], strict=True):
        assert a["loss"] == pytest.approx(b["loss"], rel=1e-4)
        assert a["lr"] == b["lr"]
    for name, tensor in first[0]["continued"]["state"].items():
        torch.testing.assert_close(one["continued"]["state"][name], tensor, atol=2e-5, rtol=1e-4)

    two = run_ranks(_load_then_train, 2, tmp_path / "ws2", tiny_model_dir, "fsdp2", str(resaved))
    for name, tensor in first[0]["at_save"].items():
        assert torch.equal(two[0]["loaded"][name], tensor), f"1 -> 2 ranks: {name}"
    _assert_equal_runs(first[0]["continued"], two[0]["continued"], "1 -> 2 ranks")


def _load_errors(rank, world_size, model_dir, cases):
    """The error message (or None) of each (kind, path) load."""
    backends = {kind: build(kind, model_dir) for kind in {kind for kind, _ in cases.values()}}
    out = {}
    for name, (kind, path) in cases.items():
        try:
            backends[kind].load_checkpoint(path)
            out[name] = None
        except BackendCheckpointError as exc:
            out[name] = str(exc)
    return out


def test_bad_checkpoints_fail_naming_the_path_and_the_fix(saved, tiny_model_dir, tmp_path):
    """Missing, damaged, other-backend and other-world-size checkpoints raise
    BackendCheckpointError naming the path; export_hf refuses a critic checkpoint."""
    pytest.importorskip("deepspeed", reason=NO_DEEPSPEED)
    fsdp_ckpt = saved("fsdp2")[0] / "ckpt"
    zero2_ckpt = saved("zero2")[0] / "ckpt"
    corrupt = tmp_path / "corrupt"
    shutil.copytree(fsdp_ckpt, corrupt)
    (corrupt / "backend.json").write_text("{")
    no_metadata = tmp_path / "no_metadata"
    shutil.copytree(fsdp_ckpt, no_metadata)
    (no_metadata / "dcp" / ".metadata").unlink()
    no_state = tmp_path / "no_state"
    shutil.copytree(fsdp_ckpt, no_state)
    (no_state / "state.json").unlink()
    cases = {
        "missing": ("fsdp2", str(tmp_path / "nowhere")),
        "corrupt": ("fsdp2", str(corrupt)),
        "no_metadata": ("fsdp2", str(no_metadata)),
        "no_state": ("fsdp2", str(no_state)),
        "other_backend": ("zero2", str(fsdp_ckpt)),
        "other_world_size": ("zero2", str(zero2_ckpt)),
    }
    errors = run_ranks(_load_errors, 1, tmp_path / "out", tiny_model_dir, cases)[0]
    expected = {
        "missing": "does not exist",
        "corrupt": "backend.json is unreadable",
        "no_metadata": "has no dcp/.metadata",
        "no_state": "has no state.json",
        "other_backend": "backend='fsdp2'",
        "other_world_size": "world_size=2",
    }
    for name, words in expected.items():
        assert errors[name] is not None, f"{name}: loaded without an error"
        assert cases[name][1] in errors[name] and words in errors[name], errors[name]

    from rlsys.backends.export import export_hf

    critic = tmp_path / "critic"
    shutil.copytree(fsdp_ckpt, critic)
    info = json.loads((critic / "backend.json").read_text())
    (critic / "backend.json").write_text(json.dumps({**info, "role": "value"}))
    with pytest.raises(BackendCheckpointError, match="critic"):
        export_hf(str(critic), str(tmp_path / "out_hf"))
    with pytest.raises(BackendCheckpointError, match="does not exist"):
        export_hf(str(tmp_path / "nowhere"), str(tmp_path / "out_hf"))


def test_learner_group_picks_deepspeed_and_checkpoints_through_ray(
    ray_cpu, tiny_model_dir, tmp_path
):
    """LearnerGroup with backend=deepspeed: its ranks build ZeRO engines on their process
    group; save_checkpoint / load_checkpoint on every rank rewind training exactly."""
    pytest.importorskip("deepspeed", reason=NO_DEEPSPEED)
    from backend_harness import learner_config

    from rlsys.placement.resources import ActorResources
    from rlsys.workers.learner import LearnerGroup

    cfg = learner_config("zero2")
    group = LearnerGroup(cfg, ActorResources(1, 0, 1), tiny_model_dir, "float32", 1.0)
    try:
        batch = toy_batch(tiny_model_dir)
        group.train_step(batch, OBJECTIVE, seed=0)
        group.save_checkpoint(str(tmp_path / "ckpt"))
        after = group.train_step(batch, OBJECTIVE, seed=1)
        group.load_checkpoint(str(tmp_path / "ckpt"))
        again = group.train_step(batch, OBJECTIVE, seed=1)
    finally:
        group.shutdown()
    assert after == again and after["skipped_steps"] == 0
    info = json.loads((tmp_path / "ckpt" / "backend.json").read_text())
    assert (info["backend"], info["zero_stage"], info["world_size"]) == ("deepspeed", 2, 2)
