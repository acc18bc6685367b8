"""The shapes task: deterministic scenes, answers that match the pixels, held-out splits,
difficulty knobs, and image columns of jsonl/parquet datasets."""

from __future__ import annotations

import base64
import json

import numpy as np
import pytest

from rlsys.config.errors import ConfigError
from rlsys.config.schema import ShapesConfig, TaskConfig
from rlsys.data.images import image_bytes, load_image
from rlsys.data.shapes import COLOURS, ShapeScene, shape_splits
from rlsys.data.tasks import load_task


def _count_blobs(scene: ShapeScene, colour: str) -> int:
    """Cells whose centre pixel has ``colour`` (each shape fills the middle of its cell)."""
    pixels = np.asarray(scene.render())
    cell = scene.size / scene.grid
    found = 0
    for index in range(scene.grid * scene.grid):
        row, col = divmod(index, scene.grid)
        y, x = int((row + 0.5) * cell), int((col + 0.5) * cell)
        found += tuple(pixels[y, x]) == COLOURS[colour]
    return found


def test_answers_match_the_rendered_pixels():
    train, evals = shape_splits(ShapesConfig(), 200, 50, seed=3)
    for p in train + evals:
        scene = p.images[0]
        assert p.answer == str(_count_blobs(scene, p.meta["colour"]))
        assert p.text == f"How many {p.meta['colour']}?"
        assert scene.render().size == (56, 56)


def test_splits_are_deterministic_and_held_out():
    a_train, a_eval = shape_splits(ShapesConfig(), 300, 60, seed=0)
    b_train, b_eval = shape_splits(ShapesConfig(), 300, 60, seed=0)
    assert a_train == b_train and a_eval == b_eval
    seen = {(p.images[0], p.text) for p in a_train}
    assert not any((p.images[0], p.text) in seen for p in a_eval)
    c_train, _ = shape_splits(ShapesConfig(), 300, 60, seed=1)
    assert c_train != a_train


def test_difficulty_knobs():
    cfg = ShapesConfig(max_shapes=2, colours=["red"], image_size=84, grid=3)
    train, _ = shape_splits(cfg, 100, 10, seed=0)
    assert {len(p.images[0].shapes) for p in train} <= {1, 2}
    assert {p.meta["colour"] for p in train} == {"red"}
    assert train[0].images[0].render().size == (84, 84)
    with pytest.raises(ConfigError, match="task.shapes.max_shapes"):
        ShapesConfig(max_shapes=10)
    with pytest.raises(ConfigError, match="task.shapes.colours"):
        ShapesConfig(colours=["mauve"])


def test_task_registry_builds_shapes():
    task = load_task(TaskConfig(name="shapes", train_size=50, eval_size=10), seed=0)
    assert len(task.train) == 50 and len(task.eval) == 10
    assert task.max_new_tokens == 2  # a digit and EOS


def test_image_sources(tmp_path):
    scene = ShapeScene((("square", "blue", 0),))
    png = image_bytes(scene.render())
    path = tmp_path / "a.png"
    path.write_bytes(png)
    url = "data:image/png;base64," + base64.b64encode(png).decode()
    expected = np.asarray(scene.render())
    for source in (scene, png, str(path), url):
        assert np.array_equal(np.asarray(load_image(source)), expected)
    with pytest.raises(FileNotFoundError, match="is not a file"):
        load_image(str(tmp_path / "missing.png"))


def test_file_datasets_with_an_image_column(tmp_path):
    scene = ShapeScene((("circle", "red", 5),))
    png = image_bytes(scene.render())
    (tmp_path / "img.png").write_bytes(png)
    rows = [
        {"q": f"How many red? {i}", "a": "1", "img": str(tmp_path / "img.png")} for i in range(10)
    ]
    rows.append({"q": "no image", "a": "0"})  # skipped: the image column is missing
    jsonl = tmp_path / "d.jsonl"
    jsonl.write_text("\n".join(json.dumps(r) for r in rows))
    cfg = TaskConfig(
        name="file",
        train_path=str(jsonl),
        prompt_key="q",
        answer_key="a",
        image_key="img",
        eval_size=2,
    )
    task = load_task(cfg, seed=0)
    assert task.skipped_rows == 1
    prompt = task.train[0]
    assert prompt.images == [str(tmp_path / "img.png")] and "img" not in prompt.meta
    pq = pytest.importorskip("pyarrow.parquet")
    import pyarrow as pa

    table = pa.table({"q": ["How many red?"] * 10, "a": ["1"] * 10, "img": [png] * 10})
    pq.write_table(table, tmp_path / "d.parquet")
    cfg.train_path = str(tmp_path / "d.parquet")
    task = load_task(cfg, seed=0)
    assert np.array_equal(
        np.asarray(load_image(task.train[0].images[0])), np.asarray(scene.render())
    )


def test_image_prompts_ride_in_trainer_state(tmp_path):
    """The buffer's queued groups are checkpointed: a shapes prompt with its processed
    images reads back equal (no pickle: rlsys.checkpoint.state_file)."""
    import dataclasses

    from rlsys.checkpoint.state_file import read_state, write_state
    from rlsys.types import PromptPixels

    prompt = shape_splits(ShapesConfig(), 2, 1, seed=0)[0][0]
    pixels = PromptPixels(np.ones((64, 294), np.float32), np.array([[1, 8, 8]]))
    prompt = dataclasses.replace(prompt, pixels=pixels)
    write_state(tmp_path / "s.json", {"prompts": [prompt]})
    back = read_state(tmp_path / "s.json")["prompts"][0]
    assert back.images == prompt.images and back.answer == prompt.answer
    assert np.array_equal(back.pixels.pixel_values, pixels.pixel_values)
