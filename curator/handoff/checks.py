"""`curator export-data --check OUT [--trainer-config FILE]`: the traps of handing an export to its trainer.

Named like doctor's findings. What is checked:
- the folder holds the files its manifest names and nothing else (a planted file is an error: SpecForge
  unpickles every .ckpt it finds), and each torch file loads with `weights_only=True` (tensors and plain
  values only: what curator writes, and nothing that runs code when read);
- a trainer config given (YAML or JSON) names the export's aux layer ids in the trainer's numbering, and
  for ModelOpt sets `answer_only_loss: true` (otherwise the stored mask is ignored and prompts are trained);
- the layout's traps, always listed.
"""

from __future__ import annotations

import json
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import torch
from safetensors import SafetensorError, safe_open

from curator.handoff.errors import HandoffError
from curator.handoff.export import FORMAT, MANIFEST, layout_named
from curator.handoff.layouts import modelopt, specforge, speculators
from training.errors import ConfigFileError
from training.io.config_file import read_config

LAYER_KEYS = ("eagle_aux_hidden_state_layer_ids", "aux_hidden_state_layer_ids", "target_layer_ids")


@dataclass(frozen=True)
class Finding:
    level: str  # "ok", "warn", "error"
    name: str
    message: str


def read_manifest(out: str | Path) -> dict[str, Any]:
    """Return an export's manifest; HandoffError when the folder is not an export of this toolkit."""
    path = Path(out) / MANIFEST
    try:
        manifest = json.loads(path.read_text(encoding="utf-8"))
    except (OSError, ValueError) as exc:
        raise HandoffError(f"{out} is not an export of `curator export-data` ({path}: {exc})") from None
    if not isinstance(manifest, dict) or manifest.get("format") != FORMAT:
        raise HandoffError(f"{path} is not a {FORMAT} manifest")
    return manifest


def expected_files(manifest: dict[str, Any]) -> set[str]:
    """Return the relative paths of the files an export of `manifest` holds (beside the manifest)."""
    n, name = int(manifest["rows"]), manifest["layout"]
    files = {MANIFEST}
    if name == specforge.OFFLINE.name:
        files |= {specforge.feature_file(i) for i in range(n)}
    elif name == specforge.ONLINE.name:
        files.add(specforge.PROMPTS_FILE)
    elif name == modelopt.LAYOUT.name:
        files |= {modelopt.conversation_file(i) for i in range(n)}
    elif name == speculators.LAYOUT.name:
        files.add(speculators.TOKEN_FREQ)
        if manifest.get("final_norm"):
            files |= {speculators.states_file(i) for i in range(n)}
    return files


def _arrow_files(out: Path) -> set[str]:
    state = out / "state.json"
    names = {"state.json", "dataset_info.json"} if state.exists() else set()
    if state.exists():
        names |= {f["filename"] for f in json.loads(state.read_text(encoding="utf-8")).get("_data_files", [])}
    return names


def check_files(out: Path, manifest: dict[str, Any]) -> Iterator[Finding]:
    """Yield findings on the export's files: foreign ones, missing ones, ones that need full unpickling."""
    want = expected_files(manifest)
    if manifest["layout"] == speculators.LAYOUT.name:
        want |= _arrow_files(out)
    have = {str(p.relative_to(out)) for p in out.rglob("*") if p.is_file() or p.is_symlink()}
    foreign, missing = sorted(have - want), sorted(want - have)
    if foreign:
        yield Finding("error", "foreign-files", f"{len(foreign)} file(s) the manifest does not name, e.g. {foreign[0]}: "
                      "not written by `curator export-data`; a trainer would read them (SpecForge unpickles them)")
    if missing:
        yield Finding("error", "missing-files", f"{len(missing)} file(s) of the export are missing, e.g. {missing[0]}")
    bad = 0
    first = ""
    for rel in sorted(want & have):
        path = out / rel
        if path.is_symlink():
            problem = "is a link"
        elif rel.endswith((".pt", ".ckpt")):
            problem = _torch_problem(path)
        elif rel.endswith(".safetensors"):
            problem = _safetensors_problem(path)
        else:
            continue
        if problem:
            bad += 1
            first = first or f"{rel} {problem}"
    if bad:
        yield Finding("error", "unsafe-files", f"{bad} file(s) are not plain tensors, e.g. {first}; do not train on them")
    elif not foreign and not missing:
        yield Finding("ok", "files", f"{len(want)} files, each loading with weights_only=True (tensors and plain values only)")


def _torch_problem(path: Path) -> str:
    try:
        torch.load(path, map_location="cpu", weights_only=True)
    except Exception as exc:  # noqa: BLE001 - any failure of the safe loader is the finding
        return f"does not load with weights_only=True ({type(exc).__name__})"
    return ""


def _safetensors_problem(path: Path) -> str:
    try:
        with safe_open(str(path), framework="pt"):
            return ""
    except (SafetensorError, OSError) as exc:
        return f"is not a whole safetensors file ({exc})"


def _find(config: Any, keys: tuple[str, ...]) -> Iterator[tuple[str, Any]]:
    if isinstance(config, dict):
        for k, v in config.items():
            if k in keys:
                yield k, v
            yield from _find(v, keys)
    elif isinstance(config, list):
        for v in config:
            yield from _find(v, keys)


def check_trainer_config(manifest: dict[str, Any], config_path: Path) -> Iterator[Finding]:
    """Yield findings on a trainer's run config against the export (layer ids; ModelOpt's answer_only_loss)."""
    try:  # the trainers' configs are YAML whatever their suffix, JSON where it says so
        config = read_config(config_path, "trainer config", "json" if config_path.suffix == ".json" else "yaml")
    except ConfigFileError as exc:
        raise HandoffError(f"cannot read the trainer config {config_path}: {exc}") from None
    want = manifest.get("aux_layer_ids")
    named = list(_find(config, LAYER_KEYS))
    if want is not None:
        wrong = [(k, v) for k, v in named if v is not None and list(v) != list(want)]
        if wrong:
            k, v = wrong[0]
            yield Finding("error", "layer-ids", f"{config_path} sets {k}: {v}, but the export's states are layers {want} "
                          f"in {manifest['trainer']}'s numbering ({manifest['layer_convention']}; curator's "
                          f"{manifest.get('aux_layer_ids_curator')})")
        elif not named:
            yield Finding("warn", "layer-ids", f"{config_path} names no aux layer ids: the trainer's default must be "
                          f"{want} ({manifest['layer_convention']}); set them to be sure")
        else:
            yield Finding("ok", "layer-ids", f"{config_path} names layers {want}, the export's")
    if manifest["layout"] == modelopt.LAYOUT.name:
        values = [v for _k, v in _find(config, ("answer_only_loss",))]
        if not values or not all(v is True for v in values):
            yield Finding("error", "modelopt-answer-only-loss",
                          f"{config_path} does not set answer_only_loss: true, so ModelOpt ignores the exported "
                          "loss_mask and trains every prompt token too")
        else:
            yield Finding("ok", "modelopt-answer-only-loss", "answer_only_loss: true (the exported loss mask is used)")


def check_export(out: str | Path, trainer_config: str | Path | None = None) -> list[Finding]:
    """Return the findings on an export (files, the trainer config when given, the layout's traps)."""
    root = Path(out)
    manifest = read_manifest(root)
    layout = layout_named(str(manifest.get("layout")))
    findings = list(check_files(root, manifest))
    if trainer_config is not None:
        findings += check_trainer_config(manifest, Path(trainer_config))
    seen = {f.name for f in findings}
    findings += [Finding("warn", t.name, t.message) for t in layout.traps() if t.name not in seen]
    return findings
