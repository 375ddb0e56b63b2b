"""The hidden-state store: many samples per safetensors shard, a JSON index, and meta.json.

Layout of a store directory:

    meta.json                    StoreMeta (target, widths, layer ids and their convention, dtype, hashes)
    index.json                   merged index: {"samples": {id: entry}, "skipped": {id: reason}}
    index-parts/<writer>.json    one per writer session (a torchrun rank, a resumed run), same shape;
                                 readers merge index.json with every part, so an unmerged store is readable
    shards/<writer>-00000.safetensors

A shard holds its samples concatenated along the token axis, so its header stays small whatever
the sample count:

    input_ids  int32 [N]          loss_mask bool [N]
    aux        bf16|fp8 [N, 3H]   aux_scale  float32 [N, 3]   (fp8 only)
    final      bf16|fp8 [N, H]    final_scale float32 [N, 1]  (fp8 only; final only when has_final)
    final_prenorm  bf16 [N, H]    (only when has_final_prenorm: the same state before the target's
                                   final norm, which speculators trains on; bf16 stores only)

An index entry is {"shard", "offset", "length", "category", "mode"?}: the sample's rows are
[offset, offset + length) of every tensor in that shard.

fp8 is float8_e4m3fn with one float32 scale per token and captured layer (each H-wide row is scaled
by its own absmax / 448; layers differ in magnitude by orders, so one scale across the three would
waste the low layer's precision). Samples are dequantised to bf16 on read, or handed over as stored
(`HiddenStateStore.open(..., dequantize=False)`) for the trainer to dequantise on its GPU.

Writes are crash-safe: a shard is written under a temporary name and renamed, then the writer's
index part is rewritten the same way. A crash between the two leaves an unindexed shard, whose
samples are simply captured again on resume; nothing half-written is ever read. The index is the
store's manifest: readers see only the shards it names, and a run starting on a store removes
what is named nowhere (temporaries and unindexed shards of a killed run, `remove_stale_files`).

A store may come from elsewhere (copied, downloaded), so opening one checks its index against its
shards before anything is read (`check_entry`, `check_shards`): every shard named is a plain file
of `shards/`, every entry's rows lie inside its shard, and every tensor has the rows, widths and
dtype the meta promises. What does not fit is a StoreIntegrityError naming the file, the sample
and the field.

One run writes a store at a time (`lock_store`, a lock file naming the PID); within a run each
writer session (a torchrun rank) holds a lock on its own index part, so `merge_index` never
removes the part of a writer that is still running.
"""


from __future__ import annotations

import dataclasses
from dataclasses import asdict, dataclass, field
from typing import Any

import torch

from training.errors import StoreError
from training.target.layers import CONVENTION, normalise

FORMAT = "curator-hidden-states/1"
LOCK_FILE = ".hidden-states.lock"
DTYPES = ("bf16", "fp8")
# Fields that must agree when a writer reopens a store: mixing them would make samples incomparable.
COMPATIBLE_FIELDS = (
    "hidden_size",
    "num_layers",
    "aux_layer_ids",
    "layer_convention",
    "dtype",
    "has_final",
    "has_final_prenorm",
    "chat_template_sha256",
    "tokenizer_sha256",
)


@dataclass
class StoreMeta:
    """What a store holds and how it was made (written to meta.json)."""

    target: str
    hidden_size: int
    num_layers: int
    vocab_size: int
    aux_layer_ids: list[int]
    layer_convention: str = CONVENTION  # see training.target.layers; normalised to it when the meta is made
    dtype: str = "bf16"
    has_final: bool = True
    # The last layer's output before the final norm, kept beside `final` (which is after it):
    # speculators trains on that state and applies the norm itself; an RMSNorm cannot be undone.
    has_final_prenorm: bool = False
    chat_template_sha256: str = ""
    tokenizer_sha256: str = ""
    extra: dict[str, Any] = field(default_factory=dict)

    def __post_init__(self) -> None:
        if self.dtype not in DTYPES:
            raise StoreError(f"store dtype must be one of {DTYPES}, not {self.dtype!r}")
        if self.has_final_prenorm and not self.has_final:
            raise StoreError("a store keeps the pre-norm final state beside the final state; do not drop the final state")
        if self.has_final_prenorm and self.dtype != "bf16":
            raise StoreError("a store keeps the pre-norm final state in bf16 only; capture it with dtype bf16")
        # One numbering everywhere after this point, whatever an older store recorded.
        self.aux_layer_ids = normalise(self.aux_layer_ids, self.layer_convention)
        self.layer_convention = CONVENTION

    @property
    def aux_width(self) -> int:
        """Return the width of the stored aux row (n_aux_layers * hidden_size)."""
        return len(self.aux_layer_ids) * self.hidden_size

    def bytes_per_token(self) -> int:
        """Return the bytes one stored token costs (hidden rows + scales + ids + mask)."""
        return bytes_per_token(self.hidden_size, len(self.aux_layer_ids), self.dtype, self.has_final,
                               self.has_final_prenorm)

    def to_json(self) -> dict[str, Any]:
        """Return meta.json's content."""
        return {"format": FORMAT, **asdict(self)}

    @classmethod
    def from_json(cls, data: dict[str, Any]) -> StoreMeta:
        """Return the meta read from meta.json's content (unknown keys go to `extra`)."""
        data = dict(data)
        fmt = data.pop("format", None)
        if fmt != FORMAT:
            raise StoreError(f"meta.json has format {fmt!r}, expected {FORMAT!r}: not a store written by this toolkit")
        known = set(cls.__dataclass_fields__)
        extra = dict(data.pop("extra", {}) or {})
        extra.update({k: v for k, v in data.items() if k not in known})
        required = [n for n, f in cls.__dataclass_fields__.items()
                    if f.default is dataclasses.MISSING and f.default_factory is dataclasses.MISSING]
        missing = [n for n in required if n not in data]
        if missing:
            raise StoreError(f"meta.json lacks {', '.join(missing)}: the store is damaged or was written by another tool")
        return cls(**{k: v for k, v in data.items() if k in known}, extra=extra)


def bytes_per_token(hidden_size: int, n_aux: int, dtype: str, has_final: bool, has_final_prenorm: bool = False) -> int:
    """Return the stored bytes per token: hidden rows, fp8 scales, int32 id and bool mask, and the
    pre-norm final state where kept (always bf16)."""
    rows = n_aux + (1 if has_final else 0)
    per_row = hidden_size * (1 if dtype == "fp8" else 2) + (4 if dtype == "fp8" else 0)
    return rows * per_row + 4 + 1 + (2 * hidden_size if has_final_prenorm else 0)


@dataclass
class HiddenStateSample:
    """One captured sample: token ids, loss mask, aux states [T, n_aux*H] and the final state [T, H]."""

    id: str
    input_ids: torch.Tensor
    loss_mask: torch.Tensor
    aux: torch.Tensor
    final: torch.Tensor | None = None
    category: str = ""
    mode: str = ""  # which generation mode made the sample's ids: "token" (stored ids) or "text" (re-tokenised)
    # Checked where the states were made (one reduction on the GPU) instead of by a pass over
    # the host copy in the writer thread; None: check here.
    finite: bool | None = None
    # Set when aux/final arrive already quantised to fp8 (on the GPU, before the copy to the
    # host: half the bytes to move): float32 scales [T, n_rows], as quantize_fp8 returns them.
    aux_scale: torch.Tensor | None = None
    final_scale: torch.Tensor | None = None
    final_prenorm: torch.Tensor | None = None  # [T, H] bf16, before the final norm (has_final_prenorm stores)

    def __len__(self) -> int:
        return int(self.input_ids.shape[0])

    def is_finite(self) -> bool:
        """Return False when any captured state holds NaN or inf."""
        if self.finite is not None:
            return self.finite
        # fp8 values read as stored come with their scales: a NaN/inf scale poisons the row too
        parts = (self.aux, self.final, self.aux_scale, self.final_scale)
        return all(bool(torch.isfinite(t.float()).all()) for t in parts if t is not None)



def shard_tensors(meta: StoreMeta) -> dict[str, tuple[tuple[str, ...], tuple[int, ...]]]:
    """Return what every shard of a store holds: tensor name -> (allowed safetensors dtypes, shape after the rows)."""
    states = ("F8_E4M3",) if meta.dtype == "fp8" else ("BF16",)
    want: dict[str, tuple[tuple[str, ...], tuple[int, ...]]] = {
        "input_ids": (("I32", "I64"), ()),
        "loss_mask": (("BOOL",), ()),
        "aux": (states, (meta.aux_width,)),
    }
    if meta.has_final:
        want["final"] = (states, (meta.hidden_size,))
    if meta.has_final_prenorm:
        want["final_prenorm"] = (("BF16",), (meta.hidden_size,))
    if meta.dtype == "fp8":
        want["aux_scale"] = (("F32",), (len(meta.aux_layer_ids),))
        if meta.has_final:
            want["final_scale"] = (("F32",), (1,))
    return want


