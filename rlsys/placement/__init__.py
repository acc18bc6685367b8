"""Where a run's actors go: ``resources`` (the Ray resource requests of every pool, derived
from the placement config), ``gpu_slots`` (placement groups binding every GPU actor to whole
GPUs), ``check`` (``python -m rlsys.placement.check``: a config's actors placed on a live
cluster, the layout checked). Nothing is imported here: the three sit at different layers
(pyproject.toml's layers contract), so importing one must not import the others."""
