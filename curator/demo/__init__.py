"""The offline end-to-end demo: every stage on a tiny target made on the spot."""
