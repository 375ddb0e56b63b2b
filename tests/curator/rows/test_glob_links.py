"""A `data_files` glob does not follow links (issue 49 item 4): a folder linking to itself made
`d/**/*.jsonl` walk 2^40 paths."""

from __future__ import annotations

import subprocess
import sys

import pytest
import yaml


def test_a_glob_does_not_follow_a_folder_linking_to_itself(tmp_path):
    data = tmp_path / "d"
    data.mkdir()
    (data / "a.jsonl").write_text('{"messages": [{"role": "user", "content": "hi"}]}\n')
    (data / "loop1").symlink_to(".", target_is_directory=True)
    (data / "loop2").symlink_to(".", target_is_directory=True)
    (tmp_path / "r.yaml").write_text(yaml.safe_dump({"name": "links", "sources": [
        {"dataset": "json", "data_files": "d/**/*.jsonl", "samples": 1}]}))
    # In a child process: before the fix the walk runs through 2^40 paths, and must be killed.
    # `datasets` is imported before the clock starts: its import alone takes seconds on a busy machine.
    code = ("import time, sys; import datasets.packaged_modules; from curator.mix.recipe import load_recipe; "
            "from curator.rows.readers import open_source; r = load_recipe(sys.argv[1]); t = time.monotonic(); "
            "[open_source(s, r.base_dir, 0, r.path_root) for s in r.sources]; "
            "[open_source(s, r.base_dir, 0, None) for s in r.sources]; print(time.monotonic() - t)")
    try:
        done = subprocess.run([sys.executable, "-c", code, str(tmp_path / "r.yaml")], capture_output=True,
                              text=True, timeout=60)
    except subprocess.TimeoutExpired:
        pytest.fail("the glob walked the self-links for 60 s")
    assert done.returncode == 0, done.stderr
    assert float(done.stdout) < 2.0


def test_a_glob_matches_real_files_under_double_star(tmp_path):
    from curator.rows.readers import glob_files

    (tmp_path / "d" / "x" / "y").mkdir(parents=True)
    for rel in ("d/top.jsonl", "d/x/mid.jsonl", "d/x/y/deep.jsonl", "d/x/y/other.txt", "d/.hidden.jsonl"):
        (tmp_path / rel).write_text("{}\n")
    assert [p.relative_to(tmp_path).as_posix() for p in glob_files("d/**/*.jsonl", tmp_path)] == [
        "d/top.jsonl", "d/x/mid.jsonl", "d/x/y/deep.jsonl"]
    assert glob_files("d/x/*.jsonl", tmp_path) == [tmp_path / "d/x/mid.jsonl"]
    assert glob_files(str(tmp_path / "d/top.jsonl"), tmp_path) == [tmp_path / "d/top.jsonl"]


def test_a_path_folder_with_self_links_lists_its_real_files_once(tmp_path):
    from curator.rows.readers import local_files

    data = tmp_path / "d"
    (data / "sub").mkdir(parents=True)
    (data / "sub" / "a.jsonl").write_text("{}\n")
    (data / "loop").symlink_to(".", target_is_directory=True)
    (data / "sub" / "up").symlink_to("..", target_is_directory=True)
    assert local_files(data) == [data / "sub" / "a.jsonl"]
