"""CLI commands, one module per stage; each exposes `register(app)`. Thin: parse, call, render."""
