"""Checkpoints: the store of atomic, verified step checkpoints (``store``), the small JSON state
files beside them (``state_file``), and the scan that refuses pickles which could run code
(``pickle_scan``)."""
