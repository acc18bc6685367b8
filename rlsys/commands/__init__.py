"""The commands behind the CLI, one module each, wired from one validated config: ``train``
(RL), ``sft``, ``preference`` (``rm``, ``dpo``), ``evaluate`` (``eval``), ``export``;
``setup`` holds the set-up they share. Nothing is imported here: ``rlsys.cli`` imports the
command it runs, so a bad override fails before torch or Ray load."""
