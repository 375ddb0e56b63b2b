"""Recipes: the bundled ones validate against the real schemas; bad ones name the key and the file."""

from __future__ import annotations

from pathlib import Path

import pytest

from curator.errors import ConfigError
from curator.mix import load_recipe, read_manifest
from curator.rows.schema import MANIFEST
from training.errors import ConfigFileError

RECIPES = Path(__file__).resolve().parents[3] / "recipes"


def _write(tmp_path: Path, text: str) -> Path:
    path = tmp_path / "r.yaml"
    path.write_text(text)
    return path


def test_bundled_recipes_load_with_the_documented_splits_and_configs():
    agentic = load_recipe(RECIPES / "agentic-coding-100k.yaml")
    by_id = {s.dataset: s for s in agentic.sources}
    assert by_id["nvidia/OpenCodeInstruct"].config == "train"
    assert by_id["HuggingFaceH4/ultrachat_200k"].split == "train_sft"
    assert by_id["Aeala/ShareGPT_Vicuna_unfiltered"].split == "train"
    assert by_id["open-r1/Mixture-of-Thoughts"].config in ("all", "code")
    assert by_id["SWE-Factory/DeepSWE-Agent-Kimi-K2-Trajectories-2.8K"].keep_responses
    assert sum(s.samples for s in agentic.sources if s.category == "agentic") == 22800
    paper = load_recipe(RECIPES / "eagle3-paper.yaml")
    assert [s.samples for s in paper.sources][0] == 68000
    assert sum(s.samples for s in paper.sources[1:]) == pytest.approx(464000, rel=0.01)
    assert load_recipe(RECIPES / "perfectblend-100k.yaml").total_samples() == 100000


def test_unknown_key_is_an_error_naming_key_and_file(tmp_path):
    path = _write(tmp_path, "name: x\nsources:\n  - path: a.jsonl\n    samples: 5\n    formt: sharegpt\n")
    with pytest.raises(ConfigError) as err:
        load_recipe(path)
    assert str(path) in str(err.value) and "sources[0].formt: unknown key" in str(err.value)


def test_a_misspelt_key_gets_a_did_you_mean_at_every_level(tmp_path):
    path = _write(tmp_path, "name: x\nsede: 3\nsources:\n  - path: a.jsonl\n    sampels: 5\n    keep_response: true\n"
                            "dedup: {neer: 0.9}\nfilters: {max_prompt_char: 10}\n")
    with pytest.raises(ConfigError) as err:
        load_recipe(path)
    msg = str(err.value)
    for typo, key in (("sede", "seed"), ("sources[0].sampels", "samples"), ("sources[0].keep_response", "keep_responses"),
                      ("dedup.neer", "near"), ("filters.max_prompt_char", "max_prompt_chars")):
        assert f"{typo}: unknown key; did you mean `{key}`?" in msg
    path = _write(tmp_path, "name: x\nsources:\n  - path: a.jsonl\n    samples: 5\n    format: sharegtp\n")
    with pytest.raises(ConfigError, match=r"sources\[0\]\.format: Input should be .*; did you mean 'sharegpt'\?"):
        load_recipe(path)
    path = _write(tmp_path, "name: x\nsources:\n  - path: a.jsonl\n    samples: 5\n    colour: blue\n")
    with pytest.raises(ConfigError, match=r"sources\[0\]\.colour: unknown key \(keys here: dataset, path, "):
        load_recipe(path)


@pytest.mark.parametrize("key, text", [("samples", "samples: true"), ("scan", "samples: 5\n    scan: true"),
                                       ("seed", "samples: 5\nseed: false")])
def test_a_boolean_is_no_count(tmp_path, key, text):
    path = _write(tmp_path, f"name: x\nsources:\n  - path: a.jsonl\n    {text}\n")
    with pytest.raises(ConfigError) as err:
        load_recipe(path)
    assert f"{key}: " in str(err.value) and "is not a number; give a count such as 1000" in str(err.value)
    assert "Value error" not in str(err.value)


def test_bad_values_are_errors_naming_the_key(tmp_path):
    path = _write(tmp_path, "name: x\nsources:\n  - path: a.jsonl\n    samples: -1\n    format: csv\ndedup: {near: 1.5}\n")
    with pytest.raises(ConfigError) as err:
        load_recipe(path)
    msg = str(err.value)
    assert "sources[0].samples" in msg and "sources[0].format" in msg and "dedup.near" in msg and str(path) in msg


def test_source_needs_exactly_one_location(tmp_path):
    path = _write(tmp_path, "name: x\nsources:\n  - dataset: a/b\n    path: c.jsonl\n    samples: 1\n")
    with pytest.raises(ConfigError, match="exactly one of `dataset`"):
        load_recipe(path)


def test_duplicate_source_names_are_refused(tmp_path):
    path = _write(tmp_path, "name: x\nsources:\n  - dataset: a/b\n    samples: 1\n  - dataset: a/b\n    samples: 2\n")
    with pytest.raises(ConfigError, match="give it a `name:`"):
        load_recipe(path)


def test_broken_yaml_names_file_and_line(tmp_path):
    path = _write(tmp_path, "name: x\nsources: [\n  - bad: {\n")
    with pytest.raises(ConfigFileError, match=rf"{path}: line \d+"):
        load_recipe(path)


def test_near_false_switches_near_dedup_off(tmp_path):
    path = _write(tmp_path, "name: x\nsources:\n  - path: a.jsonl\n    samples: 1\ndedup: {exact: true, near: false}\n")
    assert load_recipe(path).dedup.near is None


def test_recipe_paths_are_confined_to_the_recipe_folder_unless_allowed(tmp_path, capsys):
    from curator.cli import main

    secret = tmp_path / "secretdir"
    secret.mkdir()
    (secret / "creds.json").write_text('{"conversations": [{"from": "human", "value": "API_KEY=sk-very-secret"}]}\n')
    project = tmp_path / "project"
    (project / "data").mkdir(parents=True)
    (project / "data" / "link.json").symlink_to(secret / "creds.json")
    catalog = ["--catalog", str(tmp_path / "c.duckdb")]
    for source in ("../secretdir/creds.json", str(secret / "creds.json"), "data/link.json", "data"):
        recipe = project / "recipe.yaml"
        recipe.write_text(f"name: confined\nsources:\n  - path: {source}\n    samples: 1\n")
        capsys.readouterr()
        assert main(["build-mix", "--recipe", str(recipe), "--out", str(project / "mix"), *catalog]) == 1
        err = " ".join(capsys.readouterr().err.split())
        assert "outside the recipe's folder" in err and "--allow-outside-paths" in err
        assert not (project / "mix" / MANIFEST).exists()
    # The permission is the caller's: a recipe that grants it to itself is refused, naming the flag.
    recipe.write_text("name: opted-out\nallow_outside_paths: true\nsources:\n  - path: ../secretdir/creds.json\n    samples: 1\n")
    capsys.readouterr()
    assert main(["build-mix", "--recipe", str(recipe), "--out", str(project / "mix"), *catalog]) == 1
    err = " ".join(capsys.readouterr().err.split())
    assert "`allow_outside_paths` is not a recipe key" in err and "--allow-outside-paths" in err
    assert not (project / "mix").exists()
    recipe.write_text("name: opted-out\nsources:\n  - path: ../secretdir/creds.json\n    samples: 1\n")
    assert main(["build-mix", "--recipe", str(recipe), "--out", str(project / "mix"), "--allow-outside-paths", *catalog]) == 0
    assert read_manifest(project / "mix")["rows"] == 1


@pytest.mark.parametrize("offline", [True, False])
def test_a_recipes_dataset_entries_read_the_hub_only_unless_allowed(tmp_path, capsys, monkeypatch, offline):
    """`dataset: json` with outside data_files, a local folder as a dataset, `text` on /etc/passwd and
    a decontaminate entry doing the same are refused before anything is read (issue 38 item 1)."""
    from curator.cli import main

    monkeypatch.delenv("HF_HUB_OFFLINE", raising=False)  # --offline sets it; restored after the test
    monkeypatch.setenv("HF_ENDPOINT", "http://127.0.0.1:9")  # no Hub here: a probe fails at once
    outside = tmp_path / "outside"
    outside.mkdir()
    row = '{"conversations": [{"from": "human", "value": "OUTSIDE-ROW"}, {"from": "gpt", "value": "x"}]}\n'
    (outside / "rows.jsonl").write_text(row)
    project = tmp_path / "project"
    (project / "data").mkdir(parents=True)
    (project / "data" / "rows.jsonl").write_text(row.replace("OUTSIDE-ROW", "INSIDE-ROW"))
    (project / "data" / "link.jsonl").symlink_to(outside / "rows.jsonl")
    catalog = ["--catalog", str(tmp_path / "c.duckdb"), *(["--offline"] if offline else [])]
    cases = {
        "json outside": f"  - dataset: json\n    data_files: {outside / 'rows.jsonl'}\n    samples: 1\n",
        "json dotdot": "  - dataset: json\n    data_files: ../outside/rows.jsonl\n    samples: 1\n",
        "json glob": "  - dataset: json\n    data_files: ../outside/*.jsonl\n    samples: 1\n",
        "json link": "  - dataset: json\n    data_files: [data/link.jsonl]\n    samples: 1\n",
        "json bare": "  - dataset: json\n    samples: 1\n",
        "folder": f"  - dataset: {outside}\n    samples: 1\n",
        "passwd": "  - dataset: text\n    data_files: /etc/passwd\n    samples: 1\n",
        "hub abs": "  - dataset: owner/name\n    data_files: /etc/passwd\n    samples: 1\n",
        "decontam": f"  - path: data/rows.jsonl\n    samples: 1\ndecontaminate:\n  - dataset: json\n"
                    f"    data_files: {outside / 'rows.jsonl'}\n",
    }
    recipe = project / "recipe.yaml"
    for case, sources in cases.items():
        recipe.write_text(f"name: confined\nsources:\n{sources}")
        capsys.readouterr()
        assert main(["build-mix", "--recipe", str(recipe), "--out", str(project / "mix"), *catalog]) == 1, case
        err = " ".join(capsys.readouterr().err.split())
        assert "--allow-outside-paths" in err and ("outside the recipe's folder" in err or "Hub" in err), (case, err)
        assert not (project / "mix" / MANIFEST).exists(), case
    # A packaged builder reading files in the recipe's folder is fine; relative data_files resolve there.
    recipe.write_text("name: inside\nsources:\n  - dataset: json\n    data_files: data/rows.jsonl\n    samples: 1\n")
    monkeypatch.chdir(tmp_path)
    assert main(["build-mix", "--recipe", str(recipe), "--out", str(project / "mix"), *catalog, "--offline"]) == 0
    assert read_manifest(project / "mix")["rows"] == 1
    # The runner's flag lets the same recipe read outside.
    recipe.write_text(f"name: allowed\nsources:\n{cases['json outside']}")
    assert main(["build-mix", "--recipe", str(recipe), "--out", str(tmp_path / "mix2"), *catalog, "--offline",
                 "--allow-outside-paths"]) == 0
    assert read_manifest(tmp_path / "mix2")["rows"] == 1


def test_a_sources_traffic_is_a_traffic_category_named_with_the_source(tmp_path):
    path = _write(tmp_path, "name: x\nsources:\n  - path: a.jsonl\n    name: coder\n    samples: 5\n    category: coding\n"
                            "    traffic: programming\n")
    with pytest.raises(ConfigError) as err:
        load_recipe(path)
    msg = str(err.value)
    assert str(path) in msg and "sources[0]" in msg and "source 'coder'" in msg
    assert "'programming' is not a traffic category; use one of agentic, code, reasoning, chat" in msg


def test_a_category_serves_one_traffic_category(tmp_path):
    two = ("name: x\nsources:\n  - path: a.jsonl\n    samples: 5\n    category: coding\n    traffic: code\n"
           "  - path: b.jsonl\n    samples: 5\n    category: coding\n    traffic: chat\n")
    with pytest.raises(ConfigError, match=r"sources of category 'coding' serve different traffic categories "
                                          r"\(a.jsonl: code, b.jsonl: chat\)"):
        load_recipe(_write(tmp_path, two))
    with pytest.raises(ConfigError, match="a traffic source's categories are the traffic's own; remove `traffic:`"):
        load_recipe(_write(tmp_path, "name: x\nsources:\n  - path: t.jsonl\n    format: traffic\n    samples: 5\n"
                                     "    traffic: code\n"))
    recipe = load_recipe(_write(tmp_path, "name: x\nsources:\n"
                                          "  - path: a.jsonl\n    samples: 5\n    category: coding\n    traffic: code\n"
                                          "  - path: b.jsonl\n    samples: 5\n    category: coding\n"
                                          "  - path: c.jsonl\n    samples: 5\n    category: chat\n"
                                          "  - path: d.jsonl\n    samples: 5\n    category: general\n"))
    # a source without `traffic:` takes its category's; a traffic category's name stands for itself
    assert recipe.served_categories() == {"coding": "code", "chat": "chat", "general": None}
