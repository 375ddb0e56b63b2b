"""Errors raised by the model side; the CLI reports them as one line, like CuratorError."""


class TrainingError(Exception):
    """Base of every error the model side raises on purpose."""


class StoreError(TrainingError):
    """A hidden-state store is missing, incomplete or inconsistent."""


class ModelMismatchError(TrainingError):
    """A draft, target or data set do not fit together (widths, vocab, layer ids)."""


class StoreIntegrityError(StoreError):
    """A store's index or data cannot be trusted: it names a file outside the store, rows past a
    shard's end, a field of the wrong type, or states that are NaN/inf."""


class DivergedError(TrainingError):
    """Training produced a non-finite loss or non-finite weights; nothing after it was saved."""
