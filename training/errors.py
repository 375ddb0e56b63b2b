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


class ConfigFileError(TrainingError):
    """A file a user hands in (a recipe, a run config, a traffic profile, a brief, a model's config.json)
    cannot be read: missing, unreadable, not UTF-8 text, or not valid JSON or YAML. The message names the
    file and why; `reason` says which ("missing", "unreadable", "not text", "syntax")."""

    def __init__(self, message: str, reason: str = "syntax") -> None:
        super().__init__(message)
        self.reason = reason
