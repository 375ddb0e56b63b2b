"""Deployment checks for an exported EAGLE-3 draft: its layout, its fit with the target and the
data it was trained on, and the server command meant to serve it.

The costly failure this exists for: SGLang started with `--speculative-algorithm EAGLE` instead
of `EAGLE3` captures no aux layers and hands the draft the target's H-wide final states; the
draft applies `fc` only when the incoming width differs from its embedding width, so `fc` is
silently skipped, nothing crashes, and acceptance collapses to ~1. What a layout is comes from
training/eagle3/layouts/ and what an engine reads from curator/engines/: nothing here re-derives either.
Nothing is loaded onto a device; the weights are read once, one tensor at a time.
"""

from __future__ import annotations


from dataclasses import dataclass, replace
from pathlib import Path
from typing import Any


from curator.engines import ENGINE_OF_LAYOUT, ENGINES, parse_launch, vllm
from curator.engines.launch import Check, LaunchSpec, int_or_none
from curator.engines.draft import DraftLayout, read_draft, safetensors_files
from curator.engines.draft_variant import check_variant
from curator.engines.launch_checks import check_launch, suggested_launch
from curator.errors import ConfigError
from curator.http import public_url
from training.errors import ModelMismatchError
from training.eagle3.config_check import rope_measurable, size_problems
from training.drafts.registry import layouts
from training.target.config import read_target_config

__all__ = ["Check", "DoctorReport", "DraftLayout", "LaunchSpec", "check_launch", "diagnose", "parse_launch", "read_draft",
           "suggested_launch"]

@dataclass
class DoctorReport:
    """All checks made, and the launch command that serves this draft correctly."""

    checks: list[Check]
    launch_command: str

    @property
    def errors(self) -> list[Check]:
        return [c for c in self.checks if c.status == "error"]

    @property
    def ok(self) -> bool:
        return not self.errors


def check_layout(layout: DraftLayout) -> list[Check]:
    """Return checks of the export on its own: architecture, weight names and shapes, values, d2t/t2d."""
    checks: list[Check] = []
    archs = layout.architectures
    if layout.layout is None:
        known = " or ".join(f"[{lay.architecture!r}] ({lay.name})" for lay in layouts())
        return [Check("architecture", "error", f"architectures={archs!r}: expected {known}; re-export the checkpoint")]
    lay = layout.layout
    checks.append(Check("architecture", "ok", f"{archs[0] if archs else lay.name} ({lay.name} layout)"))
    # the check load_draft (so `curator eval`) makes of the same export: what one refuses, the other does
    checks += [Check(f"{lay.name} config", "error", problem) for problem in lay.config_problems(layout.config)]
    tensor_problems = lay.tensor_problems(layout.config, layout.tensors)
    checks += [Check("tensors", "error", problem) for problem in tensor_problems]
    if not tensor_problems:
        checks.append(Check("tensors", "ok", f"{len(layout.shapes)} tensors, each one a draft has, of a servable dtype; "
                                                    "the decoder and norms shaped as the config says"))
    if not rope_measurable(layout.decoder_config.get("rope_scaling")):
        checks.append(Check("rope", "warn", f"the engines build rope_scaling {layout.decoder_config['rope_scaling']!r}, "
                                            "but curator eval's draft does not: its acceptance cannot be measured here"))

    h, vocab, dvocab = layout.hidden_size, layout.vocab_size, layout.draft_vocab_size
    missing_cfg = [n for n, v in (("hidden_size", h), ("vocab_size", vocab), ("draft_vocab_size", dvocab)) if v is None]
    if missing_cfg or h is None or vocab is None or dvocab is None:
        return [*checks, Check("config fields", "error", f"config.json lacks {', '.join(missing_cfg)}")]
    if size_problems(layout.decoder_config, layout.config):
        return checks  # said above; nothing below can be worked out from sizes no draft has

    shapes = layout.shapes
    # d2t/t2d belong only to a draft vocabulary smaller than the target's (vLLM refuses them otherwise)
    small = dvocab != vocab
    missing = [k for k in lay.required_weights(small) if k not in shapes]
    other = next((o for o in layouts() if o.decoder_prefix != lay.decoder_prefix
                  and any(k.startswith(o.decoder_prefix) for k in shapes)), None)
    if missing and other is not None:
        checks.append(Check("weight names", "error",
                            f"weights are under {other.decoder_prefix}* but the config says the {lay.name} layout "
                            f"({lay.decoder_prefix}*); the server would skip them silently and run a random layer"))
    elif missing:
        checks.append(Check("weight names", "error", f"missing tensors: {', '.join(missing[:6])}"
                            + (f" and {len(missing) - 6} more" if len(missing) > 6 else "")))
    else:
        checks.append(Check("weight names", "ok", f"fc, {lay.decoder_prefix}*, norm, lm_head{', d2t, t2d' if small else ''} present"))

    verifier = layout.verifier
    if verifier is not None:
        if not vllm.takes_verifier(verifier):
            checks.append(Check("verifier", "warn",
                                f"speculators_config.verifier.name_or_path is {verifier!r}; `vllm serve` needs a Hub "
                                "repository id there: re-export with curator export --verifier ORG/NAME"))
    if "embed_tokens.weight" in shapes and not lay.carries_embeddings:
        checks.append(Check("embeddings", "warn",
                            "embed_tokens.weight is in the export; the engine replaces it with the target's "
                            "embedding, so it only costs disk"))
    checks.extend(_check_fc(layout, h))
    checks.extend(check_variant(layout))  # EAGLE-3.1's norms, as each engine builds them
    q = shapes.get(lay.decoder_prefix + "self_attn.q_proj.weight")
    if q is not None and len(q) == 2 and q[1] != 2 * h:
        checks.append(Check("midlayer input", "error",
                            f"{lay.decoder_prefix}self_attn.q_proj.weight takes {q[1]} inputs; an EAGLE-3 layer attends "
                            f"over [embedding; fused hidden] = 2 x {h} = {2 * h}"))
    head = shapes.get("lm_head.weight")
    if head is not None:
        ok = tuple(head) == (dvocab, h)
        checks.append(Check("lm_head shape", "ok" if ok else "error",
                            f"[{dvocab}, {h}]" if ok else f"lm_head.weight is {list(head)}, expected [draft_vocab_size={dvocab}, {h}]"))
    checks.extend(_check_values(layout, dvocab, vocab))
    if layout.aux_layer_ids is None:
        checks.append(Check("aux layer ids", "warn",
                            "config.json records no eagle_aux_hidden_state_layer_ids; the server falls back "
                            "to its default [2, N//2, N-3], which must be what the draft was trained on"))
    elif len(set(layout.aux_layer_ids)) != len(layout.aux_layer_ids):
        checks.append(Check("aux layer ids", "error", f"{layout.aux_layer_ids} repeats a layer"))
    else:
        fc, target_h = shapes.get("fc.weight"), _target_hidden(layout, h)
        n = len(layout.aux_layer_ids)
        if fc is not None and len(fc) == 2 and fc[1] != n * target_h:
            checks.append(Check("aux layer ids", "error",
                                f"{layout.aux_layer_ids}: the engine captures {n} layers, but fc fuses {fc[1] / target_h:g} "
                                f"states of {target_h}"))
    return checks


def _target_hidden(layout: DraftLayout, h: int) -> int:
    """Return the width of one captured target state the config declares (else the draft's own)."""
    return layout.target_hidden_size or h


def _check_fc(layout: DraftLayout, h: int) -> list[Check]:
    """Return the check of fc [H, n_aux x target_hidden] against the config's widths and aux count."""
    fc = layout.shapes.get("fc.weight")
    if fc is None:
        return []
    target_h = _target_hidden(layout, h)
    n_aux = layout.layout.fc_aux_count(layout.config) if layout.layout else 3
    if len(fc) != 2 or fc[0] != h:
        return [Check("fc shape", "error", f"fc.weight is {list(fc)}, expected [{h}, {n_aux} x target_hidden]")]
    if fc[1] != n_aux * target_h:
        hint = ("set target_hidden_size in config.json" if fc[1] % n_aux == 0 and fc[1] // n_aux != h
                else f"the fc does not fuse {n_aux} aux layers; set num_aux_hidden_states (re-export with curator export)")
        return [Check("fc shape", "error",
                      f"fc.weight is {list(fc)} but the config implies [{h}, {n_aux * target_h}] ({n_aux} x {target_h}); "
                      f"the server builds fc from the config and will refuse or misread it ({hint})")]
    return [Check("fc shape", "ok", f"[{fc[0]}, {fc[1]}] = [H, {n_aux} x {target_h}]")]


def _check_values(layout: DraftLayout, dvocab: int, vocab: int) -> list[Check]:
    """Return checks of the weights' values: all finite, d2t [draft_vocab] mapping into the target's vocabulary."""
    import torch  # here, not at the top: a usage error of `curator doctor` loads no torch

    from training.eagle3.weights import vocab_map_problem
    from training.io.weights import nonfinite_tensors

    bad: list[str] = []
    maps: dict[str, torch.Tensor] = {}
    for _, handle in safetensors_files(layout.path):
        for key in handle.keys():
            tensor = handle.get_tensor(key)  # one at a time: a large draft's weights never all in memory
            bad += nonfinite_tensors({key: tensor})
            if key in ("d2t", "t2d"):
                maps[key] = tensor
    checks = []
    if bad:
        checks.append(Check("weight values", "error",
                            f"NaN or inf in {', '.join(bad[:5])}{' and more' if len(bad) > 5 else ''}: the training run "
                            "diverged; the draft would propose garbage (retrain with a lower lr, or export an earlier checkpoint)"))
    else:
        checks.append(Check("weight values", "ok", "all finite"))
    if "d2t" in maps:
        if tuple(maps["d2t"].shape) != (dvocab,):
            return [*checks, Check("d2t/t2d", "error", f"d2t is {list(maps['d2t'].shape)}, expected [draft_vocab_size={dvocab}]")]
        problem = vocab_map_problem(maps["d2t"], maps.get("t2d"), vocab)
        if problem:
            return [*checks, Check("d2t/t2d", "error", problem)]
        if "t2d" in maps:  # d2t is sound (vocab_map_problem): does t2d mark exactly its target ids?
            marked = maps["t2d"].bool()
            target_ids = maps["d2t"].long() + torch.arange(dvocab)
            if int(marked.sum()) != dvocab or not bool(marked[target_ids].all()):
                return [*checks, Check("d2t/t2d", "warn", "t2d does not mark exactly the ids d2t maps to (SGLang ignores t2d; vLLM uses it)")]
        checks.append(Check("d2t/t2d", "ok", f"{dvocab:,} draft ids -> distinct target ids of {vocab:,}"))
    return checks


def check_target(layout: DraftLayout, target_config: dict[str, Any]) -> list[Check]:
    """Return checks that the draft fits the target: widths, heads, vocab, layer ids in depth."""
    checks: list[Check] = []
    th = int_or_none(target_config.get("hidden_size"))
    tvocab = int_or_none(target_config.get("vocab_size"))
    tlayers = int_or_none(target_config.get("num_hidden_layers"))
    theads = int_or_none(target_config.get("num_attention_heads"))
    h = layout.hidden_size
    if th is None or tvocab is None or tlayers is None:
        return [Check("target config", "error", "target config.json lacks hidden_size, vocab_size or num_hidden_layers")]
    bad = [f"{k} {v}" for k, v in (("hidden_size", th), ("vocab_size", tvocab), ("num_hidden_layers", tlayers),
                                   ("num_attention_heads", theads)) if v is not None and v < 1]
    if bad:  # a target with -1 layers serves nothing: never "ready to serve"
        return [Check("target config", "error", f"target config.json states {', '.join(bad)}: not a model's sizes")]

    fc = layout.shapes.get("fc.weight")
    if fc is not None and len(fc) == 2:
        if fc[1] % th:
            checks.append(Check("fc width vs target", "error",
                                f"fc takes {fc[1]} inputs, not a multiple of the target hidden {th}: this draft "
                                f"was trained for another target"))
        else:
            checks.append(Check("fc width vs target", "ok", f"{fc[1]} = {fc[1] // th} x {th}"))
    if h is not None:
        if h != th:
            checks.append(Check("hidden size", "error",
                                f"draft hidden {h} != target hidden {th}; the server gives the draft the "
                                f"target's embedding ({th} wide)"))
        else:
            checks.append(Check("hidden size", "ok", f"{h}"))
    heads = layout.num_attention_heads
    if heads is not None and theads is not None:
        if heads != theads:
            checks.append(Check("attention heads", "warn",
                                f"draft has {heads} heads, target {theads}: legal, but drafts normally copy "
                                f"the target's attention shape"))
        else:
            checks.append(Check("attention heads", "ok", f"{heads}"))
    vocab = layout.vocab_size
    if vocab is not None:
        if vocab != tvocab:
            checks.append(Check("vocab size", "error",
                                f"draft vocab_size {vocab} != target {tvocab}: d2t/t2d index another tokenizer"))
        else:
            checks.append(Check("vocab size", "ok", f"{vocab:,}"))
    checks.extend(check_served_layers(layout, target_config))
    return checks


def check_served_layers(layout: DraftLayout, target_config: dict[str, Any]) -> list[Check]:
    """Return, per engine that reads the layout, whether the layers it captures are those the draft was trained on.

    A target class SGLang's rule table does not know (or that SGLang cannot serve EAGLE-3 on) is an
    error with its reason, not an assumption.
    """
    n = int(target_config["num_hidden_layers"])
    trained = layout.provenance.get("aux_layer_inputs")
    expected = sorted(int(i) for i in trained) if trained else None
    if layout.layout is None:
        return []  # not a layout the toolkit knows: check_layout said so
    try:
        served = layout.layout.served(layout.config, target_config)
    except ModelMismatchError as exc:
        return [Check("aux layers served", "error", str(exc))]
    checks: list[Check] = []
    for engine, layers in served.items():
        short = next((e.LABEL for e in ENGINES.values() if engine.startswith(e.LABEL)), engine)
        count = len(expected) if expected else len(layout.aux_layer_ids or []) or 3
        if len(layers) != count or any(not 0 <= i <= n for i in layers):
            checks.append(Check(f"aux layers ({short})", "error",
                                f"{engine} captures the inputs of layers {layers} of a {n}-layer target: "
                                "ids past the model are never captured and the draft gets a narrower fc input"))
        elif expected is not None and layers != expected:
            # the engine the layout is written for must be right; another reader's miss is a warning
            main = ENGINE_OF_LAYOUT[layout.fmt] == short.lower()
            checks.append(Check(f"aux layers ({short})", "error" if main else "warn",
                                f"{engine} feeds the draft the inputs of layers {layers}, but it was trained on "
                                f"{expected}: re-export with curator export"))
        else:
            checks.append(Check(f"aux layers ({short})", "ok", f"{engine} feeds the inputs of layers {layers}"
                                + (", as trained" if expected is not None else " (training layers not recorded)")))
    # one line per engine: the worst runner of vLLM stands for it
    merged: dict[str, Check] = {}
    rank = {"ok": 0, "warn": 1, "error": 2}
    for c in checks:
        if c.name not in merged or rank[c.status] > rank[merged[c.name].status]:
            merged[c.name] = c
    return list(merged.values())


def check_store(layout: DraftLayout, store_meta: Any, target_config: dict[str, Any] | None = None) -> list[Check]:
    """Return checks that the layers the engine will feed the draft are those its data was captured at."""
    if layout.layout is None:  # check_layout already names the unknown architecture
        return []
    checks: list[Check] = []
    ids = list(store_meta.aux_layer_ids)  # inputs of layers, whatever the store recorded
    arch = layout.provenance.get("target_architecture")
    target = target_config or {"num_hidden_layers": store_meta.num_layers, "architectures": [arch]}
    try:
        served = layout.layout.served_layer_inputs(layout.config, target)
    except ModelMismatchError as exc:
        return [Check("layer ids vs data", "error", str(exc))]
    if served != ids:
        written = layout.aux_layer_ids
        how = (f"the export writes {written}, which the engine reads as" if written is not None
               else "the export writes no layer ids, so the engine uses its default,")
        checks.append(Check("layer ids vs data", "error",
                            f"{how} inputs of layers {served}, but the draft learned from {ids}: the server "
                            "would feed the draft other layers than it learned; re-export with curator export"))
    else:
        checks.append(Check("layer ids vs data", "ok", f"the engine feeds inputs of layers {ids}, as captured"))
    fc = layout.shapes.get("fc.weight")
    if fc is not None and len(fc) == 2 and fc[1] != len(ids) * int(store_meta.hidden_size):
        checks.append(Check("fc width vs data", "error",
                            f"fc takes {fc[1]} inputs but the data's aux states are {len(ids)} x {store_meta.hidden_size}"))
    if layout.vocab_size is not None and int(store_meta.vocab_size) != layout.vocab_size:
        checks.append(Check("vocab vs data", "error",
                            f"data was captured from a target with vocab {store_meta.vocab_size}, draft says {layout.vocab_size}"))
    return checks


def diagnose(draft: str | Path, target: str | Path | None = None, store: str | Path | None = None,
             launch: str | None = None) -> DoctorReport:
    """Return every check on a draft export, optionally against its target, data and launch command."""
    layout = read_draft(draft)
    checks = check_layout(layout)
    target_hidden = None
    if target is not None:
        target_config = read_target_config(target)
        target_hidden = int_or_none(target_config.get("hidden_size"))
        checks.extend(check_target(layout, target_config))
    if store is not None:
        from training.errors import StoreError
        from training.storage.reader import HiddenStateStore

        try:
            meta = HiddenStateStore.open(store).meta
        except StoreError as exc:
            raise ConfigError(f"cannot read the hidden-state store {store}: {exc}") from None
        checks.extend(check_store(layout, meta, read_target_config(target) if target is not None else None))
    spec = parse_launch(launch) if launch is not None else None
    if spec is not None:
        # the launch names the engine that reads the export: its layer mismatch is an error, not the
        # other reader's warning (vLLM 0.32 serves a SGLang-layout export with wrong top-level ids
        # silently, at a lower acceptance: tests/serving/test_served_doctor.py)
        served_by = f"aux layers ({'vLLM' if spec.engine == 'vllm' else 'SGLang'})"
        checks = [replace(c, status="error") if c.name == served_by and c.status == "warn" else c
                  for c in checks]
        checks.extend(check_launch(spec, layout, target, target_hidden))
    # a launch command may name a URL with its user:password (a model path, --dist-init-addr): the
    # table and the command to copy name it without (the user puts the credential back in their shell)
    return DoctorReport(checks=[replace(c, detail=public_url(c.detail)) for c in checks],
                        launch_command=public_url(suggested_launch(layout, target, spec)))
