"""The ``shapes`` task: count the shapes of one colour in a small rendered picture.

A scene is a few circles and squares of a few colours, each in its own cell of a grid over
the picture (no overlaps). The question asks how many shapes have a given colour; the answer
is one digit. Everything is deterministic in the seed, and a prompt carries its scene's
description (``ShapeScene``), drawn with Pillow when the prompt is encoded, not the pixels.
Difficulty knobs (``task.shapes``): the most shapes per scene, the colours in play, the
picture size and the grid.
"""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np

from rlsys.config.shapes import COLOURS, ShapesConfig
from rlsys.types import Prompt

KINDS = ("circle", "square")


@dataclass(frozen=True)
class ShapeScene:
    """A picture described, not drawn: ``(kind, colour, cell)`` per shape on a
    ``grid`` x ``grid`` layout of a ``size`` x ``size`` white picture."""

    shapes: tuple[tuple[str, str, int], ...]
    size: int = 56
    grid: int = 4

    def render(self):
        """The picture as an RGB ``PIL.Image``."""
        from PIL import Image, ImageDraw

        image = Image.new("RGB", (self.size, self.size), (255, 255, 255))
        draw = ImageDraw.Draw(image)
        cell = self.size / self.grid
        margin = max(1.0, cell * 0.15)
        for kind, colour, index in self.shapes:
            row, col = divmod(index, self.grid)
            box = (
                col * cell + margin,
                row * cell + margin,
                (col + 1) * cell - margin,
                (row + 1) * cell - margin,
            )
            fill = COLOURS[colour]
            if kind == "circle":
                draw.ellipse(box, fill=fill)
            else:
                draw.rectangle(box, fill=fill)
        return image

    def count(self, colour: str) -> int:
        """Shapes of ``colour``."""
        return sum(c == colour for _, c, _ in self.shapes)


def random_scene(rng: np.random.Generator, cfg: ShapesConfig) -> ShapeScene:
    """1..``cfg.max_shapes`` shapes of random kinds and colours in distinct cells."""
    count = int(rng.integers(1, cfg.max_shapes + 1))
    cells = rng.choice(cfg.grid * cfg.grid, size=count, replace=False)
    shapes = tuple(
        (str(rng.choice(KINDS)), str(rng.choice(cfg.colours)), int(cell)) for cell in cells
    )
    return ShapeScene(shapes, cfg.image_size, cfg.grid)


def shape_prompt(uid: int, rng: np.random.Generator, cfg: ShapesConfig) -> Prompt:
    """One counting question about a fresh scene."""
    scene = random_scene(rng, cfg)
    colour = str(rng.choice(cfg.colours))
    return Prompt(
        uid=uid,
        text=f"How many {colour}?",
        answer=str(scene.count(colour)),
        meta={"colour": colour, "shapes": len(scene.shapes)},
        images=[scene],
    )


def shape_splits(cfg: ShapesConfig, train_size: int, eval_size: int, seed: int):
    """(train, eval) prompts; eval scenes are drawn from a stream of their own, and any that
    equals a training scene with the same question is redrawn (held out for real)."""
    train_rng = np.random.default_rng([seed, 1])
    train = [shape_prompt(i, train_rng, cfg) for i in range(train_size)]
    seen = {(p.images[0], p.text) for p in train}
    eval_rng = np.random.default_rng([seed, 2])
    evals: list[Prompt] = []
    tries = 0
    while len(evals) < eval_size and tries < 50 * eval_size:
        tries += 1
        p = shape_prompt(train_size + len(evals), eval_rng, cfg)
        if (p.images[0], p.text) not in seen:
            evals.append(p)
    return train, evals
