"""curator: data for EAGLE-3 draft models, from Hub search to a checked, served draft."""

__version__ = "0.1.0"
