"""Curated data handed off to other trainers (speculators, SpecForge, ModelOpt), in each one's layout.

`export.export_data` is the whole job; `layouts/` holds one module per trainer (its files, its layer
numbering, its norm convention, its launch line), `checks.py` the traps a run of that trainer falls
into. The contract: docs/own-trainer.md.
"""
