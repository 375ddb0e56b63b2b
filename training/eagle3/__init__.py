"""The EAGLE-3 draft kind: the model, its weights, its TTT attention and objective, its export layouts, its proposer
and simulated decoding; registered as a kind by training/drafts/eagle3.py."""
