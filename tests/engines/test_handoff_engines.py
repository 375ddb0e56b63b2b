"""`curator export-data` judged by the trainers' own loaders: speculators 0.9.0 (ArrowDataset, CollateFn,
and a few steps of its EAGLE-3 trainer on the CPU), SpecForge 0.2.0 (OfflineManifestReader,
normalize_offline_sample, prepare_prompt_tasks) and ModelOpt 0.47.0 (OfflineSupervisedDataset,
EagleOfflineDataCollator) read the files and give the store's tensors."""

from __future__ import annotations

import json
import math
from importlib.metadata import version
from pathlib import Path

import pytest

pytest.importorskip("speculators", reason="speculators is not installed: run .ci/engines.sh (tests/engines/requirements.txt)")
pytest.importorskip("specforge", reason="SpecForge is not installed: run .ci/engines.sh (tests/engines/requirements.txt)")
pytest.importorskip("modelopt", reason="ModelOpt is not installed: run .ci/engines.sh (tests/engines/requirements.txt)")

import torch  # noqa: E402

from curator.handoff.export import MANIFEST, export_data  # noqa: E402
from curator.engines.vllm_capture import load_final_norm, rms_norm  # noqa: E402
from tests.curator.handoff.handoff_fixtures import capture_store, write_records  # noqa: E402
from training.feed.packing import pack_samples  # noqa: E402
from training.storage.reader import HiddenStateStore  # noqa: E402

ROWS = 18
LAYOUTS = ("speculators", "specforge-offline", "specforge-online", "modelopt")


def test_the_trainers_verified_are_the_pinned_versions() -> None:
    assert (version("speculators"), version("specforge"), version("nvidia-modelopt")) == ("0.9.0", "0.2.0", "0.47.0")


@pytest.fixture(autouse=True)
def _as_a_user_runs_them(monkeypatch: pytest.MonkeyPatch) -> None:
    """The trainers' loaders as a user's process sees them, not as the rest of this group leaves it:
    the group's CPU stand-in for torchvision (cpu_stubs.py) sits in sys.modules, where `datasets`'
    tensor formatter would take it for the real one, and a torchrun-style LOCAL_RANK another test
    set would send speculators' trainer to an accelerator."""
    import datasets.config

    monkeypatch.setattr(datasets.config, "TORCHVISION_AVAILABLE", False)
    monkeypatch.delenv("LOCAL_RANK", raising=False)


@pytest.fixture(scope="module")
def data(tiny_target: Path, tmp_path_factory: pytest.TempPathFactory) -> dict[str, Path]:
    root = tmp_path_factory.mktemp("handoff")
    records = write_records(root / "gen", ROWS)
    store = capture_store(tiny_target, records, root / "store", prenorm=True)
    out = {"records": records, "store": store, "target": tiny_target}
    for layout in LAYOUTS:
        out[layout] = export_data(layout, root / layout, store=store, records=records, target=tiny_target).out
    return out


def manifest(out: Path) -> dict:
    return json.loads((out / MANIFEST).read_text())


def store(data: dict[str, Path]) -> HiddenStateStore:
    return HiddenStateStore.open(data["store"], prenorm=True)


def test_speculators_batches_equal_curators_own_training_batch(data: dict[str, Path]) -> None:
    from speculators.train.data import ArrowDataset, CollateFn

    ids = manifest(data["speculators"])["ids"]
    st = store(data)
    H = st.meta.hidden_size
    ds = ArrowDataset(max_len=4096, datapath=str(data["speculators"]), on_missing="raise")
    assert len(ds) == len(ids) == ROWS + ROWS // 3 and any("#" in i for i in ids)  # rows of their own kept
    for lo in range(0, len(ids), 5):
        chunk = ids[lo:lo + 5]
        theirs = CollateFn(max_len=4096, hidden_size=H, num_target_layers=3)([ds[i] for i in range(lo, lo + len(chunk))])
        ours = pack_samples(st, chunk, max_length=4096)
        n = ours.tokens
        assert torch.equal(theirs["input_ids"][0, :n], ours.input_ids[0])
        assert torch.equal(theirs["loss_mask"][0, :n].bool(), ours.loss_mask[0])
        assert torch.equal(theirs["hidden_states"][0, :n], ours.aux[0])
        assert torch.equal(theirs["position_ids"][0, :n], ours.positions[0])
        assert torch.equal(theirs["document_ids"][0, :n], ours.doc_ids[0].long())
        assert (theirs["document_ids"][0, n:] == -1).all()
        # speculators' final state is the one before the norm; its trainer norms it as the target does
        prenorm = torch.cat([st[i].final_prenorm for i in chunk])
        assert torch.equal(theirs["verifier_last_hidden_states"][0, :n], prenorm)
        weight, eps = load_final_norm(data["target"])
        normed = rms_norm(theirs["verifier_last_hidden_states"][0, :n].float(), weight.float(), eps)
        assert (normed - ours.final[0].float()).abs().max() < 0.05


def test_speculators_eagle3_trainer_on_the_cpu_gives_a_finite_falling_loss(data: dict[str, Path], tmp_path: Path,
                                                                          monkeypatch: pytest.MonkeyPatch) -> None:
    import speculators.train.trainer as trainer
    from speculators.models.eagle3 import Eagle3DraftModel
    from speculators.train.cli import main
    from speculators.train.config import TrainConfig

    # The two places its trainer assumes an accelerator: the device it moves to, and step timing's synchronize.
    monkeypatch.setattr(trainer, "get_local_rank", lambda: "cpu")
    reset = trainer._StepTimer.reset
    monkeypatch.setattr(trainer._StepTimer, "reset", lambda self, enabled: reset(self, False))
    losses: list[float] = []
    forward = Eagle3DraftModel.forward

    def recorded(self, *args, **kwargs):  # type: ignore[no-untyped-def]
        out = forward(self, *args, **kwargs)
        if torch.is_grad_enabled():
            losses.append(float(out[1]))
        return out

    monkeypatch.setattr(Eagle3DraftModel, "forward", recorded)
    launch = manifest(data["speculators"])["launch"].split()
    assert launch[:2] == ["speculators", "train"]
    cfg = TrainConfig.resolve(launch[2:] + ["--save-path", str(tmp_path / "run"), "--epochs", "6", "--total-seq-len", "128",
                                            "--num-workers", "0", "--draft-attn-impl", "sdpa",  # flex: no CPU backward
                                            "--loss-implementation", "eager"])  # fused: Triton, a GPU
    assert cfg.flatten()["target_layer_ids"] == [1, 2, 3]
    main(cfg)
    assert len(losses) >= 12 and all(math.isfinite(x) for x in losses)
    assert sum(losses[-4:]) / 4 < sum(losses[:4]) / 4


def test_specforge_offline_reader_gives_the_stores_tensors(data: dict[str, Path]) -> None:
    from specforge.algorithms.eagle3.data import normalize_offline_sample
    from specforge.runtime.data_plane.feature_store import load_feature_file
    from specforge.runtime.data_plane.offline_reader import OfflineManifestReader

    m = manifest(data["specforge-offline"])
    assert m["aux_layer_ids"] == [0, 1, 2] and m["aux_layer_ids_curator"] == [1, 2, 3]  # layer outputs: one below
    refs = OfflineManifestReader(str(data["specforge-offline"]), validate_files=True).read()
    st = store(data)
    assert len(refs) == len(m["ids"])
    for ref, sid in zip(refs, m["ids"]):
        s = st[sid]
        assert ref.num_tokens == len(s)
        got = normalize_offline_sample(load_feature_file(ref.feature_store_uri.removeprefix("file://")), max_len=4096)
        assert torch.equal(got["input_ids"][0], s.input_ids)
        mask = s.loss_mask.long().clone()
        mask[-1] = 0  # SpecForge never trains the last position (no next token)
        assert torch.equal(got["loss_mask"][0], mask)
        assert torch.equal(got["hidden_state"][0], s.aux) and torch.equal(got["target"][0], s.final)


def test_specforge_takes_the_launch_lines_overrides_and_the_layer_ids_of_its_run_file(data: dict[str, Path]) -> None:
    from specforge.algorithms.model_providers import resolve_eagle_capture_layers
    from specforge.config.schema import Config, apply_overrides

    m = manifest(data["specforge-offline"])
    line, _, note = m["launch"].partition("#")
    words = line.split()
    assert words[:4] == ["specforge", "train", "--config", "YOUR_RUN.yaml"] and str(m["aux_layer_ids"]) in note
    run = Config.model_validate({"model": {"target_model_path": "T", "aux_hidden_state_layer_ids": m["aux_layer_ids"]},
                                 "data": {"hidden_states_path": "elsewhere"}})  # YOUR_RUN.yaml, with the ids
    cfg = apply_overrides(run, words[4:])
    assert cfg.data.hidden_states_path == str(data["specforge-offline"]) and cfg.model.target_model_path == str(data["target"])
    assert resolve_eagle_capture_layers(cfg, {}, None) == [0, 1, 2]


def test_specforge_online_prompts_are_the_rows_ids(data: dict[str, Path]) -> None:
    from specforge.data.prompt_builder import prepare_prompt_tasks

    m = manifest(data["specforge-online"])
    tasks = prepare_prompt_tasks(data["specforge-online"] / "prompts.jsonl", None, chat_template=None, max_length=4096,
                                 is_preformatted=False, train_only_last_turn=False, cache_dir=None, cache_key=None,
                                 num_proc=None)
    st = store(data)
    assert len(tasks) == len(m["ids"])
    for task, sid in zip(tasks, m["ids"]):
        assert task["payload"]["input_ids"] == st[sid].input_ids.tolist()
        assert task["payload"]["loss_mask"] == st[sid].loss_mask.long().tolist()


def test_modelopt_offline_dataset_gives_the_stores_tensors_and_ignores_the_mask_without_answer_only_loss(
        data: dict[str, Path]) -> None:
    from modelopt.torch.speculative.eagle.utils import EagleOfflineDataCollator, OfflineSupervisedDataset

    m = manifest(data["modelopt"])
    assert m["aux_layer_ids"] == [0, 1, 2]
    files = sorted(str(p) for p in data["modelopt"].glob("*.pt"))
    st = store(data)
    answer_only = OfflineSupervisedDataset(files, answer_only_loss=True)
    every_token = OfflineSupervisedDataset(files)
    for i, sid in enumerate(m["ids"]):
        s, item = st[sid], answer_only[i]
        assert torch.equal(item["input_ids"], s.input_ids) and torch.equal(item["loss_mask"].bool(), s.loss_mask)
        assert torch.equal(item["base_model_hidden_states"], s.final) and torch.equal(item["aux_hidden_states"], s.aux)
        assert item["base_hidden_prenorm"] is False
        assert bool(every_token[i]["loss_mask"].all()) and not bool(s.loss_mask.all())  # the trap: prompts trained
        assert torch.load(files[i], weights_only=True)["conversation_id"] == sid
    batch = EagleOfflineDataCollator(train_len=64)([answer_only[0], answer_only[1]])
    assert batch["base_model_outputs"]["aux_hidden_states"].shape == (2, 64, 3 * st.meta.hidden_size)
