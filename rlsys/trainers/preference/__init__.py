"""Preference training: pairs, Bradley-Terry reward models, DPO and its variants, the RLHF
example's summary."""
