"""Rooflines: the FLOPs and bytes a step needs (``flops``), what this machine can do
(``machine``: measured matmul peak and copy bandwidth, GPUs' published peaks) and the step's
floor from both (``roofline``). See docs/roofline.md."""
