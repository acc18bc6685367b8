"""The commands behind the CLI (``train.py``), wired from one validated config. Nothing is
imported here: ``rlsys.cli`` imports the command it runs, so a bad override fails before
torch or Ray load."""
