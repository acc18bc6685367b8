"""Config of the ``shapes`` task's pictures (``task.shapes``): see docs/vision.md and
``rlsys.data.shapes``."""

from __future__ import annotations

from dataclasses import dataclass, field

from rlsys.config.checks import positive
from rlsys.config.errors import ConfigError

# The colours ``task.shapes.colours`` may name, with the RGB they are drawn in
COLOURS = {
    "red": (220, 30, 30),
    "green": (30, 170, 30),
    "blue": (30, 60, 220),
    "yellow": (230, 200, 20),
    "purple": (150, 40, 170),
}


@dataclass
class ShapesConfig:
    """Difficulty knobs of the ``shapes`` task (count the shapes of one colour in a picture;
    rlsys.data.shapes)."""

    max_shapes: int = 4  # shapes per picture: 1..max_shapes, each in its own grid cell
    colours: list[str] = field(default_factory=lambda: ["red", "green", "blue"])  # in play
    image_size: int = 56  # picture width and height in pixels
    grid: int = 4  # cells per side (a shape fills most of one cell)

    def __post_init__(self) -> None:
        positive("task.shapes.image_size", self.image_size)
        positive("task.shapes.grid", self.grid)
        if not 1 <= self.max_shapes <= min(9, self.grid * self.grid):
            raise ConfigError(
                f"task.shapes.max_shapes={self.max_shapes} must be 1..9 (a one-digit answer) "
                f"and at most task.shapes.grid^2={self.grid * self.grid}; change either"
            )
        bad = [c for c in self.colours if c not in COLOURS]
        if bad or not self.colours:
            raise ConfigError(
                f"task.shapes.colours={list(self.colours)} must be a non-empty subset of "
                f"{list(COLOURS)}"
            )
