"""Why an export for another trainer was refused: each names the data, the layout and the fix."""

from __future__ import annotations

from curator.errors import CuratorError


class HandoffError(CuratorError):
    """An export for another trainer cannot be written as asked; nothing was published."""


class LayoutCannotHoldError(HandoffError):
    """The layout asked for needs what the data does not have (hidden states, the pre-norm final state)."""


class StoreMismatchError(HandoffError):
    """The store was captured for another target, or from other token ids than the records."""


class MissingStatesError(HandoffError):
    """Rows of the records have no hidden states in the store (skipped or never captured)."""


class Fp8StoreError(HandoffError):
    """The store keeps fp8 states, which no trainer's offline reader takes; convert them or capture bf16."""


class RetokenisedRowsError(HandoffError):
    """Rows whose ids were re-tokenised from text, not emitted by the target: not handed off as the target's."""
