"""vLLM speculators (0.9.0): an Arrow dataset of token rows, one `hs_{i}.safetensors` of states per row.

    OUT/                         `datasets.load_from_disk(OUT)`, format torch (speculators' ArrowDataset)
        data-*.arrow, state.json, dataset_info.json
                                 id (curator's; speculators' own prepare-data keeps none), input_ids int64 [T],
                                 loss_mask int64 [T], seq_len int64
        token_freq.pt            {token id: count} over the loss-masked tokens (its draft vocabulary)
        hidden_states/hs_{i}.safetensors      (with a store) row i: hidden_states bf16 [T, n_aux + 1, H]
                                 (the aux layers in order, then the final state BEFORE the final norm,
                                 which speculators' trainer norms itself) and token_ids int64 [T]

Row i of the dataset is file i: speculators pairs them by position and checks token_ids against
input_ids. Without a store only the dataset is written, and speculators draws the states from vLLM
as it trains (`--on-missing generate`). Layer ids are layer inputs, as curator's (`--target-layer-ids`).
"""

from __future__ import annotations

import shutil
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import numpy as np
import pyarrow as pa
import torch

from curator.handoff.layouts.base import FileSink, Layout, LayoutWriter, Trap
from curator.handoff.rows import HandoffRow, HandoffSource
from training.storage.shard_file import write_parts

STATES_DIR = "hidden_states"
TOKEN_FREQ = "token_freq.pt"
_SCRATCH = ".ids"  # the Arrow stream before `datasets` writes the dataset from it; removed
_BATCH_ROWS = 1024
SCHEMA = pa.schema([("id", pa.string()), ("input_ids", pa.list_(pa.int64())), ("loss_mask", pa.list_(pa.int64())),
                    ("seq_len", pa.int64())])


def states_file(index: int) -> str:
    return f"{STATES_DIR}/hs_{index}.safetensors"


class SpeculatorsWriter(LayoutWriter):
    def __init__(self, stage: Path, source: HandoffSource, sink: FileSink) -> None:
        super().__init__(stage, source, sink)
        (stage / _SCRATCH).mkdir()
        self._stream_path = stage / _SCRATCH / "rows.arrow"
        self._file = pa.OSFile(str(self._stream_path), "wb")
        self._stream = pa.ipc.new_stream(self._file, SCHEMA)
        self._rows: list[HandoffRow] = []
        self._freq = torch.zeros(source.meta.vocab_size if source.meta else 0, dtype=torch.long)

    def add(self, index: int, row: HandoffRow) -> None:
        self._rows.append(HandoffRow(row.id, row.input_ids, row.loss_mask))
        if len(self._rows) >= _BATCH_ROWS:
            self._flush()
        if row.aux is None:
            return
        assert row.final_prenorm is not None  # Layout.check refused a store without it
        t, h = len(row), row.final_prenorm.shape[-1]
        states = torch.cat([row.aux.reshape(t, -1, h), row.final_prenorm.reshape(t, 1, h)], dim=1)  # [T, n_aux+1, H]
        tensors = {"hidden_states": [states], "token_ids": [row.input_ids.long()]}
        self.sink.submit(self.stage / states_file(index), lambda path: _safetensors(path, tensors))

    def _flush(self) -> None:
        if not self._rows:
            return
        rows, self._rows = self._rows, []
        lengths = np.array([len(r) for r in rows], dtype=np.int32)
        offsets = pa.array(np.concatenate([[0], np.cumsum(lengths)]).astype(np.int32))
        all_ids, all_mask = torch.cat([r.input_ids for r in rows]).long(), torch.cat([r.loss_mask for r in rows]).bool()
        self._count(all_ids[all_mask])
        ids, mask = pa.array(all_ids.numpy()), pa.array(all_mask.long().numpy())
        batch = pa.record_batch([pa.array([r.id for r in rows], pa.string()), pa.ListArray.from_arrays(offsets, ids),
                                 pa.ListArray.from_arrays(offsets, mask), pa.array(lengths.astype(np.int64))],
                                schema=SCHEMA)
        self._stream.write_batch(batch)

    def _count(self, masked: torch.Tensor) -> None:
        """Add the loss-masked ids of a batch to the token frequencies (speculators' draft vocabulary)."""
        if not masked.numel():
            return
        counts = torch.bincount(masked, minlength=self._freq.numel())
        if counts.numel() > self._freq.numel():  # records only: the vocabulary is known as it is seen
            counts[: self._freq.numel()] += self._freq
            self._freq = counts
        else:
            self._freq += counts

    def close(self) -> dict[str, Any]:
        from datasets import Dataset
        from datasets.utils import are_progress_bars_disabled, disable_progress_bars, enable_progress_bars

        self._flush()
        self._stream.close()
        self._file.close()
        quiet = are_progress_bars_disabled()
        disable_progress_bars()  # the export's own progress is the one shown
        try:
            data = Dataset.from_file(str(self._stream_path), in_memory=False)
            data.set_format(type="torch")
            data.save_to_disk(str(self.stage))
            del data
        finally:
            if not quiet:
                enable_progress_bars()
        shutil.rmtree(self.stage / _SCRATCH)
        freq = {int(i): int(self._freq[i]) for i in torch.nonzero(self._freq).flatten()}
        self.sink.submit(self.stage / TOKEN_FREQ, lambda path: torch.save(freq, path))
        return {"states_files": f"{STATES_DIR}/hs_{{i}}.safetensors" if self.source.has_states else None}


def _safetensors(path: Path, tensors: dict[str, list[torch.Tensor]]) -> None:
    write_parts(path, tensors, {"format": "pt"}, fsync=False)  # the sink fsyncs


@dataclass(frozen=True)
class SpeculatorsLayout(Layout):
    def writer(self, stage: Path, source: HandoffSource, sink: FileSink) -> LayoutWriter:
        return SpeculatorsWriter(stage, source, sink)

    def launch(self, out: Path, target: str, layer_ids: list[int] | None) -> str:
        layers = f" --target-layer-ids {' '.join(map(str, layer_ids))}" if layer_ids else ""
        missing = "raise" if layer_ids else "generate --vllm-endpoint http://localhost:8000/v1"
        return (f"speculators train --speculator-type eagle3 --verifier-name-or-path {target} --data-path {out}"
                f"{layers} --on-missing {missing}")

    def traps(self) -> list[Trap]:
        return [Trap("speculators-layer-ids",
                     "speculators takes --target-layer-ids as layer inputs (curator's numbering) and appends the final "
                     "state itself; a launch without them uses [2, N//2, N-3], which must be the store's ids")]


LAYOUT = SpeculatorsLayout(
    name="speculators", trainer="vllm-project/speculators", verified="speculators 0.9.0", needs_states=False,
    final_norm="before", layer_offset=0,
    summary="Arrow dataset (id, input_ids, loss_mask, seq_len) + hidden_states/hs_{i}.safetensors [T, aux+1, H]")
