"""Does a server launch command serve this draft as trained: the doctor's checks of a command, and
the command that would (curator/doctor.py runs them; each engine's own rules are its module's)."""

from __future__ import annotations

from pathlib import Path
from curator.engines import ENGINE_OF_LAYOUT, ENGINES, sglang
from curator.engines.draft import DraftLayout
from curator.engines.launch import Check, LaunchSpec, same_path

FC_BYPASS = (
    "with {algo} the server captures no aux layers and hands the draft the target's final hidden "
    "state ({h} wide) instead of the {n} aux states ({hn} wide) it was trained on; the draft applies fc "
    "only when the incoming width differs from its embedding width, so fc is silently skipped, "
    "nothing crashes, and acceptance collapses to ~1 token per step"
)


def check_launch(spec: LaunchSpec, layout: DraftLayout, target: str | Path | None = None,
                 target_hidden: int | None = None) -> list[Check]:
    """Return checks of a launch command against this draft (algorithm, path, step settings)."""
    checks = list(spec.problems)
    h = target_hidden or layout.hidden_size or 0
    n_aux = len(layout.aux_layer_ids or []) or 3
    engine = ENGINES[spec.engine]
    checks.extend(engine.layout_problems(layout))
    checks.extend(engine.export_checks(spec, layout, target))
    algo = (spec.algorithm or "").upper()
    if spec.algorithm is None:
        checks.append(engine.missing_algorithm(spec, layout.fmt))
    elif algo == "EAGLE3":
        checks.append(Check("algorithm", "ok", spec.algorithm))
    elif algo == "EAGLE" and (refusal := getattr(engine, "EAGLE_FOR_EAGLE3", None)):
        # an engine that says what it does with EAGLE on an EAGLE-3 draft (vLLM: refuses to start)
        checks.append(Check("algorithm", "error", f"{spec.algorithm} instead of eagle3: {refusal}"))
    elif algo == "EAGLE":
        checks.append(Check("algorithm", "error",
                            f"{spec.algorithm} instead of EAGLE3: " + FC_BYPASS.format(algo=spec.algorithm, h=h, n=n_aux, hn=n_aux * h)))
    else:
        checks.append(Check("algorithm", "error", f"{spec.algorithm} does not run an EAGLE-3 draft; use EAGLE3"))

    if spec.draft_path is None:
        checks.append(Check("draft path", "error", "no draft model path in the command"))
    else:
        status = same_path(spec.draft_path, layout.path)
        detail = {"ok": spec.draft_path,
                  "warn": f"{spec.draft_path} has this export's name but another path: make sure it is a copy of {layout.path}",
                  "error": f"{spec.draft_path} is not this draft ({layout.path})"}[status]
        checks.append(Check("draft path", status, detail))

    if target is not None and not spec.serves_export:
        if spec.target is None:
            checks.append(Check("target model", "error", "the command names no target model"))
        else:
            status = same_path(spec.target, target)
            detail = {"ok": spec.target,
                      "warn": f"{spec.target} has the target's name but another path than {target}",
                      "error": f"the command serves {spec.target}, but the draft was checked against {target}"}[status]
            checks.append(Check("target model", status, detail))
    checks.extend(engine.step_checks(spec))
    return checks


def suggested_launch(layout: DraftLayout, target: str | Path | None = None, spec: LaunchSpec | None = None) -> str:
    """Return a launch command that serves this draft correctly, keeping the user's other flags."""
    engine = ENGINES[spec.engine if spec else ENGINE_OF_LAYOUT.get(layout.fmt, sglang.NAME)]
    # a `vllm serve EXPORT` that cannot resolve its verifier names the export, not a target
    model = str(target) if target is not None else (spec.target if spec and spec.target and not spec.serves_export else None)
    if model is None:
        model = layout.verifier or "TARGET_MODEL_PATH"
    steps = spec.steps if spec and spec.steps and spec.steps >= 1 else 3
    return engine.suggested_launch(model, str(layout.path), steps, spec)
