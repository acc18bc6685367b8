"""rlsys: RL post-training for language models on Ray."""

__version__ = "0.1.0"
