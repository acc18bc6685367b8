"""Where a prompt's images come from: a file path, encoded bytes, a data URL, or an object
that draws itself (``render() -> PIL.Image``, e.g. a ``rlsys.data.shapes.ShapeScene``, which
keeps prompts small and picklable: the picture is drawn from its description on use)."""

from __future__ import annotations

import base64
import io
import os

DATA_URL = "data:"  # data:image/png;base64,... (any media type: the bytes tell the format)
BINARY_URL = "data:application/octet-stream;base64,"  # how a parquet bytes column is kept


def load_image(source, key: str = "prompt image"):
    """``source`` as an RGB ``PIL.Image``; ``key`` names it in errors."""
    from PIL import Image

    if hasattr(source, "render"):
        image = source.render()
    elif isinstance(source, (bytes, bytearray)):
        image = Image.open(io.BytesIO(source))
    elif isinstance(source, str) and source.startswith(DATA_URL):
        image = Image.open(io.BytesIO(base64.b64decode(source.split(",", 1)[1])))
    elif isinstance(source, str):
        path = os.path.expanduser(source)
        if not os.path.isfile(path):
            raise FileNotFoundError(
                f"{key} {source!r} is not a file; give a path to an image, its bytes or a "
                "data:image/png;base64,... URL"
            )
        image = Image.open(path)
    elif isinstance(source, Image.Image):
        image = source
    else:
        raise TypeError(
            f"{key} is a {type(source).__name__}; give a path, bytes, a data URL or an object "
            "with render()"
        )
    return image.convert("RGB")


def image_bytes(image, fmt: str = "PNG") -> bytes:
    """``image`` (a ``PIL.Image``) encoded as ``fmt`` (what a dataset's image column holds)."""
    out = io.BytesIO()
    image.save(out, format=fmt)
    return out.getvalue()
