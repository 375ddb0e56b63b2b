"""Small targets made on the spot: written whole or refused with a named error."""

from __future__ import annotations

import sys
from pathlib import Path

import pytest

# Builds a 64-wide Llama (about 1 MB of safetensors) into $1; run on a 256 KiB disk it cannot fit.
BUILD = ("import sys; from training.target.toy import build_target\n"
         "from training.errors import TrainingError\n"
         "try:\n"
         "    build_target(['a small text about cats and dogs'] * 20, sys.argv[1], vocab_size=300)\n"
         "except TrainingError as exc:\n"
         "    print(f'error: {exc}', file=sys.stderr); sys.exit(1)\n")


def test_a_target_saved_on_a_full_disk_says_so(tmp_path: Path) -> None:
    """The demo on a full disk ended in "unexpected SafetensorError ... (os error 28) ... please report it"
    (issue 49 item 8): saving the target is a named disk-full like every other write."""
    from tests.reliability.test_reliability_diskfull import _assert_disk_full, _small_disk_works, on_small_disk

    if not _small_disk_works():
        pytest.skip("needs unshare -rm and tmpfs mounts")
    disk = tmp_path / "disk"
    rc, err, _ = on_small_disk("256k", disk, sys.executable, "-c", BUILD, str(disk / "target"))
    _assert_disk_full(rc, err, disk / "target")
