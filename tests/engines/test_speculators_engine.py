"""speculators 0.9.0 loads the speculators export as trained: every weight from the file (the
embedding included, finite), and its Eagle3 model computes the toolkit draft's logits."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

pytest.importorskip("speculators", reason="speculators is not installed: run .ci/engines.sh (tests/engines/requirements.txt)")

import torch  # noqa: E402

from engine_fixtures import run_dir, sharp_target, store_dir  # noqa: E402,F401  (fixtures)
from training.export.export import export_checkpoint  # noqa: E402
from training.eagle3.load import load_draft  # noqa: E402


@pytest.fixture(scope="module")
def speculators_export(run_dir: Path, sharp_target: Path, tmp_path_factory: pytest.TempPathFactory) -> Path:
    # the verifier is the local tiny target: speculators reads its config to resolve the layers
    return export_checkpoint(run_dir, tmp_path_factory.mktemp("spec") / "draft", fmt="speculators",
                             verifier=str(sharp_target))


def load_speculators(export: Path) -> torch.nn.Module:
    from speculators.models.eagle3 import Eagle3DraftModel

    model = Eagle3DraftModel.from_pretrained(str(export), torch_dtype=torch.float32)
    return model.float().eval()


def test_speculators_loads_every_weight_with_a_finite_embedding(speculators_export: Path, sharp_target: Path) -> None:
    model = load_speculators(speculators_export)
    ours = load_draft(speculators_export, target_dir=sharp_target)
    assert torch.isfinite(model.embed_tokens.weight).all()
    assert torch.allclose(model.embed_tokens.weight, ours.embed_tokens.weight)
    for name, tensor in model.state_dict().items():
        if name.startswith("verifier_"):
            continue  # training-only heads, filled from the verifier when training
        assert torch.isfinite(tensor.float()).all(), f"{name} was not loaded"
    assert torch.equal(model.d2t, ours.d2t) and torch.equal(model.t2d, ours.t2d)
    trained = json.loads((speculators_export / "config.json").read_text())["curator"]["aux_layer_inputs"]
    assert model.target_layer_ids == trained


def test_speculators_eagle3_computes_the_toolkit_drafts_logits(speculators_export: Path, sharp_target: Path) -> None:
    model = load_speculators(speculators_export)
    ours = load_draft(speculators_export, target_dir=sharp_target)
    T, H = 9, ours.config.hidden_size
    ids = torch.randint(0, ours.config.vocab_size, (1, T))
    aux = torch.randn(1, T, 3 * H)
    seen: list[torch.Tensor] = []
    hook = model.lm_head.register_forward_hook(lambda _m, _i, out: seen.append(out))
    with torch.no_grad():
        # one TTT step over one document: the draft's first prediction at each position
        model(aux, ids, document_ids=torch.zeros(1, T, dtype=torch.long), position_ids=torch.arange(T)[None],
              ttt_steps=1)
        want = ours(ids, aux).logits
    hook.remove()
    assert (seen[0] - want).abs().max() < 1e-4
