"""The model side of curator: hidden states, draft vocabulary, the EAGLE-3 draft, its trainer,
export and evaluation.

Imports only torch, transformers, safetensors and numpy (and the standard library), so that
it runs on a GPU machine that has nothing else installed.
"""
