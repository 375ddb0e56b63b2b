"""`curator export-data`: each trainer's layout holds the store's rows losslessly (read back with plain
torch, safetensors and datasets; the trainers' own loaders judge them in tests/engines/), and bad input
is one named error with nothing half-written."""

from __future__ import annotations

import json
import os
from pathlib import Path

import pytest
import torch
from datasets import load_from_disk
from safetensors.torch import load_file

from curator.cli import main as cli_main
from curator.handoff.checks import check_export
from curator.handoff.errors import (
    Fp8StoreError,
    HandoffError,
    LayoutCannotHoldError,
    MissingStatesError,
    RetokenisedRowsError,
    StoreMismatchError,
)
from curator.handoff.export import MANIFEST, export_data
from curator.engines.vllm_capture import load_final_norm, rms_norm
from tests.curator.handoff.handoff_fixtures import capture_store, token_record, write_records
from training.storage.fp8 import dequantize_fp8
from training.storage.reader import HiddenStateStore

ROWS = 12


@pytest.fixture(scope="module")
def data(tiny_target: Path, tmp_path_factory: pytest.TempPathFactory) -> dict[str, Path]:
    root = tmp_path_factory.mktemp("handoff")
    records = write_records(root / "gen", ROWS)
    return {"root": root, "records": records, "target": tiny_target,
            "store": capture_store(tiny_target, records, root / "store", prenorm=True),
            "postnorm": capture_store(tiny_target, records, root / "postnorm", prenorm=False)}


def manifest(out: Path) -> dict:
    return json.loads((out / MANIFEST).read_text())


def listing(folder: Path) -> list[str]:
    return sorted(str(p.relative_to(folder)) for p in folder.rglob("*"))


def test_the_capture_keeps_the_final_state_before_the_norm_beside_the_one_after(data: dict[str, Path]) -> None:
    st = HiddenStateStore.open(data["store"], prenorm=True)
    weight, eps = load_final_norm(data["target"])
    for sid in st.ids():
        s = st[sid]
        assert s.final_prenorm is not None and s.final_prenorm.shape == s.final.shape
        assert (rms_norm(s.final_prenorm.float(), weight.float(), eps) - s.final.float()).abs().max() < 0.05
    assert HiddenStateStore.open(data["store"])[st.ids()[0]].final_prenorm is None  # the trainer does not read it


def test_every_layout_holds_the_rows_losslessly_in_its_numbering_and_norm(data: dict[str, Path]) -> None:
    st = HiddenStateStore.open(data["store"], prenorm=True)
    outs = {layout: export_data(layout, data["root"] / "all" / layout, store=data["store"], records=data["records"],
                                target=data["target"]).out
            for layout in ("speculators", "specforge-offline", "specforge-online", "modelopt")}
    ids = manifest(outs["speculators"])["ids"]
    assert sorted(ids) == sorted(st.ids()) and {"r001", "r002#1", "r002"} <= set(ids)  # multi-turn, tool call, own row
    for layout, out in outs.items():
        m = manifest(out)
        assert m["ids"] == ids and m["rows"] == len(ids)
        assert m["aux_layer_ids_curator"] == [1, 2, 3]
        assert m["aux_layer_ids"] == ([1, 2, 3] if layout == "speculators" else [0, 1, 2])
    arrow = load_from_disk(str(outs["speculators"]))
    assert arrow.column_names == ["id", "input_ids", "loss_mask", "seq_len"] and arrow.format["type"] == "torch"
    assert manifest(outs["speculators"])["final_norm"] == "before"
    prompts = [json.loads(line) for line in (outs["specforge-online"] / "prompts.jsonl").read_text().splitlines()]
    for i, sid in enumerate(ids):
        s = st[sid]
        row = arrow[i]
        assert row["id"] == sid and torch.equal(row["input_ids"], s.input_ids) and row["seq_len"] == len(s)
        assert torch.equal(row["loss_mask"].bool(), s.loss_mask)
        hs = load_file(str(outs["speculators"] / "hidden_states" / f"hs_{i}.safetensors"))
        assert torch.equal(hs["token_ids"], s.input_ids)
        assert torch.equal(hs["hidden_states"][:, :3].flatten(1), s.aux)
        assert torch.equal(hs["hidden_states"][:, 3], s.final_prenorm)
        ckpt = next(outs["specforge-offline"].glob(f"rows_*/data_{i:08d}.ckpt"))
        sf = torch.load(ckpt, weights_only=True)
        assert torch.equal(sf["input_ids"], s.input_ids) and torch.equal(sf["loss_mask"].bool(), s.loss_mask)
        assert torch.equal(sf["aux_hidden_state"][0], s.aux) and torch.equal(sf["hidden_state"][0], s.final)
        mo = torch.load(outs["modelopt"] / f"{i:08d}.pt", weights_only=True)
        assert mo["conversation_id"] == sid and torch.equal(mo["hidden_states"], s.final)
        assert torch.equal(mo["aux_hidden_states"], s.aux) and torch.equal(mo["loss_mask"].bool(), s.loss_mask)
        assert prompts[i] == {"id": sid, "input_ids": s.input_ids.tolist(), "loss_mask": s.loss_mask.long().tolist()}
        # each file holds its own row: a row read from a shard is a view, and torch.save would write the shard
        row_bytes = len(s) * (4 * st.meta.hidden_size * 2 + 2 * 8)
        for path in (ckpt, outs["modelopt"] / f"{i:08d}.pt"):
            assert path.stat().st_size < row_bytes + 4096
    freq = torch.load(outs["speculators"] / "token_freq.pt", weights_only=True)
    assert sum(freq.values()) == sum(int(st[i].loss_mask.sum()) for i in ids)


def test_records_alone_give_the_token_layouts_the_targets_own_ids(data: dict[str, Path]) -> None:
    out = export_data("specforge-online", data["root"] / "records-only", records=data["records"]).out
    rows = [json.loads(line) for line in (out / "prompts.jsonl").read_text().splitlines()]
    first = token_record(0)["generations"][0]
    assert rows[0]["input_ids"] == first["prompt_ids"] + first["completion_ids"]
    assert rows[0]["loss_mask"] == [0] * len(first["prompt_ids"]) + [1] * len(first["completion_ids"])
    spec = export_data("speculators", data["root"] / "records-spec", records=data["records"]).out
    assert not (spec / "hidden_states").exists() and "--on-missing generate" in manifest(spec)["launch"]


def test_a_layout_the_data_cannot_hold_is_refused_by_name_and_nothing_is_written(data: dict[str, Path]) -> None:
    root = data["root"] / "refused"
    with pytest.raises(LayoutCannotHoldError, match="--store"):
        export_data("modelopt", root / "a", records=data["records"])
    with pytest.raises(LayoutCannotHoldError, match="--final-prenorm"):
        export_data("speculators", root / "b", store=data["postnorm"])
    assert not root.exists() or not any(root.iterdir())


def test_a_store_of_another_target_is_refused(data: dict[str, Path], tmp_path: Path) -> None:
    other = tmp_path / "other"
    other.mkdir()
    cfg = json.loads((data["target"] / "config.json").read_text())
    (other / "config.json").write_text(json.dumps({**cfg, "hidden_size": cfg["hidden_size"] * 2}))
    with pytest.raises(StoreMismatchError, match="hidden_size"):
        export_data("modelopt", tmp_path / "out", store=data["store"], target=other)
    shifted = write_records(tmp_path / "gen", ROWS, vocab=150)  # same ids, other tokens: other data
    with pytest.raises(StoreMismatchError, match="other token ids"):
        export_data("modelopt", tmp_path / "out", store=data["store"], records=shifted)
    assert listing(tmp_path) == sorted(["other", "other/config.json", "gen", "gen/shard-00000.jsonl"])


def test_missing_states_fail_the_export_and_the_earlier_export_stays_whole(data: dict[str, Path], tmp_path: Path) -> None:
    out = export_data("modelopt", tmp_path / "out", store=data["store"]).out
    before = {p: p.read_bytes() for p in out.rglob("*") if p.is_file()}
    more = write_records(tmp_path / "gen", ROWS + 2)  # two records the store never captured
    with pytest.raises(MissingStatesError, match="r012"):
        export_data("modelopt", out, store=data["store"], records=more)
    assert {p: p.read_bytes() for p in out.rglob("*") if p.is_file()} == before
    assert sorted(p.name for p in tmp_path.iterdir()) == ["gen", "out"]  # no staging folder left


def test_text_mode_rows_are_refused_as_retokenised(data: dict[str, Path], tmp_path: Path) -> None:
    rec = token_record(0)
    rec.pop("generations")
    rec["mode"] = "text"
    (tmp_path / "gen").mkdir()
    (tmp_path / "gen" / "shard-00000.jsonl").write_text(json.dumps(rec) + "\n")
    with pytest.raises(RetokenisedRowsError, match="text mode"):
        export_data("specforge-online", tmp_path / "out", records=tmp_path / "gen")
    assert not (tmp_path / "out").exists()


def test_an_fp8_store_is_refused_unless_converted_by_name(data: dict[str, Path], tmp_path: Path) -> None:
    fp8 = capture_store(data["target"], data["records"], tmp_path / "fp8", prenorm=False, dtype="fp8")
    with pytest.raises(Fp8StoreError, match="--fp8-to-bf16"):
        export_data("specforge-offline", tmp_path / "out", store=fp8)
    out = export_data("specforge-offline", tmp_path / "out", store=fp8, fp8_to_bf16=True).out
    m = manifest(out)
    assert m["source"]["converted_from"] == "fp8"
    st = HiddenStateStore.open(fp8)
    raw = HiddenStateStore.open(fp8, dequantize=False)
    for i, sid in enumerate(m["ids"]):
        sf = torch.load(next(out.glob(f"rows_*/data_{i:08d}.ckpt")), weights_only=True)
        assert sf["aux_hidden_state"].dtype == torch.bfloat16 and torch.equal(sf["aux_hidden_state"][0], st[sid].aux)
        r = raw[sid]
        assert torch.equal(sf["aux_hidden_state"][0], dequantize_fp8(r.aux, r.aux_scale))


def test_check_names_planted_files_and_each_trainers_traps(data: dict[str, Path], tmp_path: Path) -> None:
    out = export_data("modelopt", tmp_path / "mo", store=data["store"]).out
    config = tmp_path / "recipe.yaml"
    config.write_text("training:\n  answer_only_loss: false\neagle:\n  eagle_aux_hidden_state_layer_ids: [1, 2, 3]\n")
    found = {f.name: f.level for f in check_export(out, config)}
    assert found["files"] == "ok" and found["modelopt-answer-only-loss"] == "error" and found["layer-ids"] == "error"
    config.write_text("training:\n  answer_only_loss: true\neagle:\n  eagle_aux_hidden_state_layer_ids: [0, 1, 2]\n")
    found = {f.name: f.level for f in check_export(out, config)}
    assert found["modelopt-answer-only-loss"] == "ok" and found["layer-ids"] == "ok"

    sf = export_data("specforge-offline", tmp_path / "sf", store=data["store"]).out
    found = {f.name: f.level for f in check_export(sf)}
    assert found["files"] == "ok" and found["specforge-pickle"] == "warn" and found["specforge-layer-ids"] == "warn"

    class Planted:
        def __reduce__(self):  # type: ignore[no-untyped-def]
            return (os.getcwd, ())

    torch.save({"x": Planted()}, sf / "rows_00000000-00000999" / "data_00000000.ckpt")
    torch.save({"input_ids": torch.zeros(1)}, sf / "rows_00000000-00000999" / "data_99999999.ckpt")
    found = {f.name: f.level for f in check_export(sf)}
    assert found["unsafe-files"] == "error" and found["foreign-files"] == "error"


def test_cli_export_data_prints_the_launch_line_and_refuses_in_one_line(
        data: dict[str, Path], tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    out = tmp_path / "spec"
    assert cli_main(["export-data", "--layout", "speculators", "--store", str(data["store"]), "--out", str(out),
                     "--target", str(data["target"])]) in (0, None)
    printed = capsys.readouterr()
    assert f"--data-path {out}" in printed.out.replace("\n", "") and "--target-layer-ids 1 2 3" in printed.out
    assert cli_main(["export-data", "--check", "--out", str(out)]) in (0, None)
    assert cli_main(["export-data", "--layout", "speculators", "--store", str(data["postnorm"]),
                     "--out", str(tmp_path / "x")]) == 1
    err = capsys.readouterr().err
    assert "--final-prenorm" in err and not (tmp_path / "x").exists()


def test_a_killed_exports_staging_folder_is_removed_by_the_next_and_foreign_folders_are_kept(
        data: dict[str, Path], tmp_path: Path) -> None:
    killed = tmp_path / ".out.export-data.tmp-999999"  # what a SIGKILL'd export leaves beside --out
    killed.mkdir()
    (killed / ".curator-handoff-stage").touch()
    (killed / "00000000.pt").write_bytes(b"half")
    mine = tmp_path / ".out.export-data.tmp-999998"  # the user's, by chance under that name: kept
    mine.mkdir()
    (mine / "notes.txt").write_text("mine")
    export_data("modelopt", tmp_path / "out", store=data["store"])
    assert not killed.exists() and (mine / "notes.txt").read_text() == "mine"
    (tmp_path / "plain").mkdir()
    (tmp_path / "plain" / "a.txt").write_text("x")
    with pytest.raises(HandoffError, match="not an export"):
        export_data("modelopt", tmp_path / "plain", store=data["store"])
    assert (tmp_path / "plain" / "a.txt").read_text() == "x"


def test_curator_hidden_states_final_prenorm_keeps_the_state_speculators_reads(data: dict[str, Path], tmp_path: Path) -> None:
    out = tmp_path / "states"
    assert cli_main(["hidden-states", "--model", str(data["target"]), "--data", str(data["records"]), "--out", str(out),
                     "--final-prenorm", "--force"]) in (0, None)
    st = HiddenStateStore.open(out, prenorm=True)
    assert st.meta.has_final_prenorm and len(st) == len(HiddenStateStore.open(data["store"]))
    sid = st.ids()[0]
    assert torch.equal(st[sid].final_prenorm, HiddenStateStore.open(data["store"], prenorm=True)[sid].final_prenorm)
    export_data("speculators", tmp_path / "spec", store=out)  # what the flag is for


def test_the_vllm_backend_keeps_the_pre_norm_state_it_receives(data: dict[str, Path], tmp_path: Path) -> None:
    from tests.fakes.vllm_server import FakeVllmServer

    out = tmp_path / "states"
    with FakeVllmServer(data["target"], tmp_path / "shared", [1, 2, 3, 4]) as server:  # aux [1, 2, 3] + N=4
        assert cli_main(["hidden-states", "--backend", "vllm", "--endpoint", server.url, "--model", str(data["target"]),
                         "--data", str(data["records"]), "--out", str(out), "--force", "--shared-dir",
                         str(tmp_path / "shared"), "--final-prenorm"]) in (0, None)
    vl, hf = HiddenStateStore.open(out, prenorm=True), HiddenStateStore.open(data["store"], prenorm=True)
    assert vl.meta.has_final_prenorm and sorted(vl.ids()) == sorted(hf.ids())
    weight, eps = load_final_norm(data["target"])
    for sid in hf.ids():
        a, b = hf[sid], vl[sid]
        assert torch.allclose(a.final_prenorm.float(), b.final_prenorm.float(), rtol=2e-2, atol=3e-2)
        assert torch.equal(rms_norm(b.final_prenorm, weight, eps), b.final)  # the final state is the normed one
