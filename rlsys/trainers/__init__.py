"""The programs a command runs: RL (``rl/``), SFT (``sft.py``), preference training
(``preference/``)."""
