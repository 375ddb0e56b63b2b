"""`curator train --online`: the target runs beside the draft, nothing is written, and the draft
sees exactly the states an offline capture would have stored."""

from __future__ import annotations

import json
from pathlib import Path

import torch

from tests.conftest import toy_corpus
from training.capture.hidden_states import run as capture
from training.capture.online import OnlineStates
from training.storage.reader import HiddenStateStore
from training.train.config import TrainConfig
from training.train.trainer import train


def write_generation(out: Path, n: int = 24) -> Path:
    """A generation output (CONTRACTS: shards of JSON lines) of `n` one-turn conversations."""
    out.mkdir(parents=True)
    texts = toy_corpus(2 * n, seed=3)
    rows = [{"id": f"g{i:03d}", "source": "toy", "category": "code", "turns": "all",
             "messages": [{"role": "user", "content": texts[2 * i], "train": False},
                          {"role": "assistant", "content": texts[2 * i + 1], "train": True}]}
            for i in range(n)]
    (out / "shard-00000.jsonl").write_text("".join(json.dumps(r) + "\n" for r in rows))
    return out


def test_online_states_equal_what_an_offline_capture_stores(tiny_target: Path, tmp_path: Path) -> None:
    gen = write_generation(tmp_path / "gen")
    capture(tiny_target, gen, tmp_path / "store")
    stored = HiddenStateStore.open(tmp_path / "store")
    online = OnlineStates.open(tiny_target, gen, device="cpu")
    assert sorted(online.ids()) == sorted(stored.ids())
    assert online.meta.aux_layer_ids == stored.meta.aux_layer_ids
    for got, sid in zip(online.load_many(["g003", "g011"]), ["g003", "g011"]):
        want = stored[sid]
        assert torch.equal(got.input_ids, want.input_ids) and torch.equal(got.loss_mask, want.loss_mask)
        torch.testing.assert_close(got.aux.to(torch.bfloat16).float(), want.aux.float(), atol=2e-2, rtol=2e-2)


def test_online_training_writes_a_checkpoint_and_no_states(tiny_target: Path, tmp_path: Path) -> None:
    gen = write_generation(tmp_path / "gen")
    run = tmp_path / "run"
    cfg = TrainConfig(data=str(gen), online=True, target=str(tiny_target), out=str(run), draft_vocab_size=128,
                      ttt_steps=2, global_batch_size=4, micro_batch_size=4, max_steps=3, log_every=1,
                      eval_fraction=0.2, device="cpu")
    result = train(cfg)
    assert result.step == 3 and (result.checkpoint / "draft.safetensors").is_file()
    written = list(tmp_path.rglob("*.safetensors"))
    assert written and all((run / "checkpoints") in p.parents for p in written)  # no stored states
    meta = json.loads((result.checkpoint / "meta.json").read_text())
    assert meta["draft_config"]["aux_layer_ids"] and meta["train_config"]["online"] is True
