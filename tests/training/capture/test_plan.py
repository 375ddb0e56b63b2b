"""The disk planner: the original case's arithmetic, real length distributions, and refusing runs that will not fit."""

from __future__ import annotations

import json
import shutil
from collections import namedtuple
from pathlib import Path

import pytest
from typer.testing import CliRunner

from curator.cli import app, main
from training.errors import TrainingError
from training.capture.plan import load_shape, make_plan, refuse_if_it_will_not_fit

KIMI = {"architectures": ["KimiK25ForConditionalGeneration"], "model_type": "kimi_k25",
        "text_config": {"hidden_size": 7168, "num_hidden_layers": 61, "vocab_size": 163840}}


@pytest.fixture
def kimi(tmp_path: Path) -> Path:
    d = tmp_path / "Kimi-K2.5"
    d.mkdir()
    (d / "config.json").write_text(json.dumps(KIMI))
    return d


def test_kimi_10k_samples_of_2103_tokens_cost_0_9_tb_for_three_bf16_layers(kimi: Path) -> None:
    plan = make_plan(load_shape(kimi), samples=10_000, avg_tokens=2103)
    none = plan.rows[0]
    assert none.max_len is None and none.tokens == 21_030_000
    # 10,000 x 2,103 x 3 x 7,168 x 2 bytes = 0.904 TB (plus 5 bytes a token for the id and mask)
    assert none.aux_bytes == pytest.approx(10_000 * 2103 * 3 * 7168 * 2, rel=1e-3)
    assert 0.90e12 < none.aux_bytes < 0.91e12
    # The default store also keeps the final state: 4H instead of 3H.
    assert none.store_bytes == none.aux_final_bytes == pytest.approx(none.aux_bytes * 4 / 3, rel=1e-3)


def test_kimi_100k_samples_cost_9_tb_and_max_len_saves_half_or_more(kimi: Path) -> None:
    plan = make_plan(load_shape(kimi / "config.json"), samples=100_000, avg_tokens=2103, n_aux=3, has_final=False)
    by_len = {r.max_len: r for r in plan.rows}
    assert 9.0e12 < by_len[None].store_bytes < 9.1e12
    assert by_len[1024].store_bytes == pytest.approx(by_len[None].store_bytes * 1024 / 2103, rel=1e-6)
    assert by_len[512].saving == pytest.approx(1 - 512 / 2103, rel=1e-6)


def test_fp8_halves_the_bill(kimi: Path) -> None:
    shape = load_shape(kimi)
    b16 = make_plan(shape, samples=10, avg_tokens=100)
    f8 = make_plan(shape, samples=10, avg_tokens=100, dtype="fp8")
    assert f8.store_bytes_per_token / b16.store_bytes_per_token == pytest.approx(0.5, abs=0.01)


def test_real_length_distribution_clips_each_sample(kimi: Path) -> None:
    plan = make_plan(load_shape(kimi), lengths=[100, 600, 3000], max_len=1024, has_final=False)
    assert plan.chosen.max_len == 1024 and plan.chosen.tokens == 100 + 600 + 1024
    assert {r.max_len: r.tokens for r in plan.rows}[512] == 100 + 512 + 512


def test_shape_from_a_config_dict_file_and_bad_configs(tmp_path: Path) -> None:
    f = tmp_path / "llama8b.json"
    f.write_text(json.dumps({"hidden_size": 4096, "num_hidden_layers": 32, "vocab_size": 128256}))
    assert load_shape(f).hidden_size == 4096 and load_shape(f).name == "llama8b"
    (tmp_path / "bad.json").write_text('{"hidden": 1}')
    with pytest.raises(TrainingError, match="hidden_size"):
        load_shape(tmp_path / "bad.json")
    with pytest.raises(TrainingError, match="no such config"):
        load_shape(tmp_path / "missing")


def test_plan_refuses_what_will_not_fit(kimi: Path, tmp_path: Path) -> None:
    plan = make_plan(load_shape(kimi), samples=100_000, avg_tokens=2103, out_dir=tmp_path / "not" / "yet")
    assert plan.out_dir == str(tmp_path) and plan.free_bytes > 0
    if plan.fits:
        pytest.skip("this disk holds 12 TB")
    with pytest.raises(TrainingError, match="--force"):
        refuse_if_it_will_not_fit(plan)


def test_plan_cli_prints_the_bill_and_json(kimi: Path, tmp_path: Path) -> None:
    res = CliRunner().invoke(app, ["plan", "--model", str(kimi), "--samples", "10000", "--avg-tokens", "2103",
                                   "--out", str(tmp_path), "--json"])
    assert res.exit_code == 0, res.output
    data = json.loads(res.stdout)
    assert data["rows"][0]["tokens"] == 21_030_000 and data["free_bytes"] > 0
    assert [r["max_len"] for r in data["rows"]] == [None, 1024, 512]
    assert main(["plan", "--model", str(kimi)]) == 1  # neither --data nor --samples
    assert main(["plan", "--model", str(tmp_path / "nope"), "--samples", "1", "--avg-tokens", "1"]) == 1


def test_plan_with_data_uses_the_targets_chat_template_lengths(tiny_target: Path, tmp_path: Path) -> None:
    from tests.training.capture.test_hidden_states import conversation, write_gen

    gen = write_gen(tmp_path / "gen", [conversation(i) for i in range(5)] + ["{broken"])
    res = CliRunner().invoke(app, ["plan", "--model", str(tiny_target), "--data", str(gen), "--json"])
    assert res.exit_code == 0, res.output
    data = json.loads(res.stdout)
    assert data["samples"] == 5 and "chat template" in data["lengths_from"] and "1 malformed" in data["lengths_from"]
    from transformers import AutoTokenizer

    tok = AutoTokenizer.from_pretrained(tiny_target)
    want = sum(
        len(tok.apply_chat_template([{k: v for k, v in m.items() if k != "train"} for m in conversation(i)["messages"]],
                                    tokenize=True, return_dict=False))
        for i in range(5)
    )
    assert data["rows"][0]["tokens"] == want


def test_hidden_states_refuses_a_run_that_will_not_fit_unless_forced(
    tiny_target: Path, tmp_path: Path, monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]
) -> None:
    from tests.training.capture.test_hidden_states import conversation, write_gen

    gen = write_gen(tmp_path / "gen", [conversation(i) for i in range(3)])
    usage = namedtuple("usage", "total used free")
    monkeypatch.setattr(shutil, "disk_usage", lambda p: usage(10**6, 10**6 - 1000, 1000))
    args = ["hidden-states", "--model", str(tiny_target), "--data", str(gen), "--out", str(tmp_path / "store")]
    assert main(args) == 1
    err = capsys.readouterr().err
    assert "--force" in err and "1.0 KB free" in err
    assert not (tmp_path / "store" / "meta.json").exists()
    assert main([*args, "--force"]) == 0
    assert "stored now" in capsys.readouterr().err


def test_plan_counts_a_record_with_an_id_past_int64_as_malformed(tiny_target: Path, tmp_path: Path) -> None:
    from tests.training.capture.test_hidden_states import _token_record, conversation, write_gen

    gen = write_gen(tmp_path / "gen", [conversation(0), _token_record("huge", [8, 2**64]), _token_record("past", [8, 10**6])])
    res = CliRunner().invoke(app, ["plan", "--model", str(tiny_target), "--data", str(gen), "--json"])
    assert res.exit_code == 0, res.output
    data = json.loads(res.stdout)
    assert data["samples"] == 1 and "2 malformed" in data["lengths_from"]
