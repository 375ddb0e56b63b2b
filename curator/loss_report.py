"""How a training run's loss is reported to a reader: the console, the demo report and the catalog
all say the same thing (a lower layer than curator/commands/, so any of them may import it)."""

from __future__ import annotations

from typing import Any


def loss_text(record: dict[str, Any]) -> str:
    """Return the loss as a reader should take it: the KL to the target where the record holds
    the target's entropy, else the cross-entropy, named so (its floor is that entropy, not 0)."""
    if record.get("target_entropy") is not None:
        return f"KL {record['loss'] - record['target_entropy']:.3f}"
    return f"CE {record['loss']:.3f}"


LOSS_NOTE = ("CE: soft cross-entropy against the target's distribution on the draft vocabulary, summed over TTT "
             "steps with weights 0.8^k. It includes the target's own entropy, so it levels off above 0: "
             "read the accuracies and the accept length for progress.")
