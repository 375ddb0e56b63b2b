"""Errors raised by the model side; the CLI reports them as one line, like CuratorError."""


class TrainingError(Exception):
    """Base of every error the model side raises on purpose."""


class StoreError(TrainingError):
    """A hidden-state store is missing, incomplete or inconsistent."""


class ModelMismatchError(TrainingError):
    """A draft, target or data set do not fit together (widths, vocab, layer ids)."""
