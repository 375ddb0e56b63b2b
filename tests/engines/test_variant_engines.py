"""EAGLE-3.1 drafts read by the engines' own code as trained (docs/eagle3-variants.md): speculators 0.9.0's
Eagle3DraftModel and SGLang 0.5.23's LlamaForCausalLMEagle3 compute the toolkit draft's logits and fed-back
state for each norm; vLLM 0.33's own config parser builds the norms from the export and its own loader puts
each norm weight where its draft reads it (and drops an input_norm its config does not turn on)."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

pytest.importorskip("speculators", reason="speculators is not installed: run .ci/engines.sh (tests/engines/requirements.txt)")
pytest.importorskip("sglang", reason="SGLang is not installed: run .ci/engines.sh (tests/engines/requirements.txt)")

import torch  # noqa: E402
from safetensors.torch import load_file  # noqa: E402

from engine_fixtures import sharp_target, store_dir, tiny_config  # noqa: E402,F401  (fixtures)
from training.eagle3.load import load_draft  # noqa: E402
from training.export.export import export_checkpoint  # noqa: E402
from training.target.head import load_embeddings  # noqa: E402

VARIANTS = {
    "norm_before_fc": {"norm_before_fc": True},
    "fc_norm": {"fc_norm": True},
    "norm_output": {"norm_output": True},
    "norm_before_residual": {"norm_before_residual": True},
    "eagle3.1": {"norm_before_fc": True, "norm_output": True, "norm_before_residual": True},
}


@pytest.fixture(scope="module", params=list(VARIANTS))
def variant_run(request: pytest.FixtureRequest, store_dir: Path, sharp_target: Path,  # noqa: F811
                tmp_path_factory: pytest.TempPathFactory) -> tuple[str, Path]:
    from training.train.trainer import train

    out = tmp_path_factory.mktemp(f"variant-{request.param}") / "run"
    threads = torch.get_num_threads()
    torch.set_num_threads(1)
    try:
        # a few steps at a high rate: the norm weights move away from 1, so a dropped norm shows
        train(tiny_config(store_dir, sharp_target, out, max_steps=6, lr=3e-2, draft_vocab_size=64, eval_fraction=0.0,
                          **VARIANTS[request.param]))
    finally:
        torch.set_num_threads(threads)
    return request.param, out


def test_speculators_computes_the_toolkit_drafts_logits_and_fed_back_state(variant_run: tuple[str, Path],
                                                                           sharp_target: Path, tmp_path: Path) -> None:  # noqa: F811
    from speculators.models.eagle3 import Eagle3DraftModel

    name, run = variant_run
    export = export_checkpoint(run, tmp_path / "spec", fmt="speculators", verifier=str(sharp_target))
    from speculators.models.eagle3 import Eagle3SpeculatorConfig

    # speculators' eager attention (its float mask): its flex-attention block mask needs 128-token blocks
    config = Eagle3SpeculatorConfig.from_pretrained(str(export))
    config.transformer_layer_config._attn_implementation = "eager"
    model = Eagle3DraftModel.from_pretrained(str(export), config=config, torch_dtype=torch.float32).float().eval()
    ours = load_draft(export, target_dir=sharp_target)
    assert {k: bool(getattr(model.config, k)) for k in VARIANTS["eagle3.1"] | {"fc_norm": 0}} == ours.config.variant()
    T, H = 9, ours.config.hidden_size
    ids = torch.randint(0, ours.config.vocab_size, (1, T))
    aux = torch.randn(1, T, 3 * H) * 4
    logits: list[torch.Tensor] = []
    layer_inputs: list[torch.Tensor] = []
    hooks = [model.lm_head.register_forward_hook(lambda _m, _i, out: logits.append(out)),
             model.layers[0].register_forward_pre_hook(lambda _m, args, kwargs: layer_inputs.append(
                 (args[0] if args else kwargs["hidden_states"]).detach().clone()), with_kwargs=True)]
    with torch.no_grad():
        model(aux, ids, document_ids=torch.zeros(1, T, dtype=torch.long), position_ids=torch.arange(T)[None], ttt_steps=2)
        want = ours(ids, aux)
    for h in hooks:
        h.remove()
    assert (logits[0] - want.logits).abs().max() < 1e-4
    # the second step's decoder input is [embeds, fed-back hidden]: the draft's DraftOutput.hidden
    fed_back = layer_inputs[1][..., H:]
    assert (fed_back - want.hidden).abs().max() < 1e-4


def test_sglang_computes_the_toolkit_drafts_logits_and_fed_back_state(variant_run: tuple[str, Path],
                                                                      sharp_target: Path, tmp_path: Path) -> None:  # noqa: F811
    from sglang_cpu import SGLangDraft

    from training.errors import ModelMismatchError

    name, run = variant_run
    if VARIANTS[name].get("norm_before_residual"):
        with pytest.raises(ModelMismatchError, match="SGLang 0.5.23"):
            export_checkpoint(run, tmp_path / "sg", fmt="sglang")
        return
    export = export_checkpoint(run, tmp_path / "sg", fmt="sglang")
    sg = SGLangDraft(export, load_embeddings(sharp_target))
    ours = load_draft(export, target_dir=sharp_target)
    params = dict(sg.model.named_parameters())
    for key, tensor in ours.trainable_state_dict().items():
        if key.startswith(("input_norm", "fc_norm")):
            assert torch.equal(params[f"model.{key}"], tensor), key  # SGLang built and loaded the norm
    T, H = 7, ours.config.hidden_size
    ids = torch.randint(0, ours.config.vocab_size, (T,))
    aux = torch.randn(T, 3 * H) * 4
    logits, hidden = sg.forward(ids, aux, torch.arange(T))
    with torch.no_grad():
        from training.eagle3.model import KVCache

        cache = KVCache()
        want = ours(ids[None], aux[None], cache=cache)
        nxt = torch.randint(0, ours.config.vocab_size, (1,))
        # a drafting step: the draft's own state fed back (fc skipped), as SGLang's draft decode does
        step_logits, _ = sg.forward(nxt, hidden[-1:], torch.tensor([T]))
        step_want = ours(nxt[None], want.hidden[:, -1:], cache=cache)
    assert (logits - want.logits[0]).abs().max() < 1e-4
    assert (hidden - want.hidden[0]).abs().max() < 1e-4
    assert (step_logits - step_want.logits[0]).abs().max() < 1e-4


def test_vllm_builds_the_norms_and_loads_their_weights(variant_run: tuple[str, Path], sharp_target: Path,
                                                       tmp_path: Path) -> None:  # noqa: F811
    import inspect

    from vllm_cpu import parsed_config

    from vllm.model_executor.models import llama_eagle3

    name, run = variant_run
    layouts = ["speculators"] + ([] if VARIANTS[name].get("norm_before_residual") else ["sglang"])
    # what vLLM's draft reads from its hf_config, as its own source says (a change there fails this test)
    init = inspect.getsource(llama_eagle3)  # its LlamaModel.__init__ is wrapped by support_torch_compile
    assert 'getattr(self.config, "fc_norm", False)' in init and 'getattr(self.config, "norm_output", False)' in init
    assert '"norm_before_fc", getattr(self.config, "norm_before_fc", False)' in init
    assert 'getattr(config, "norm_before_residual", False)' in init
    for layout in layouts:
        export = export_checkpoint(run, tmp_path / layout, fmt=layout, verifier="org/target")
        cfg = parsed_config(export)  # vLLM's own parser (SpeculatorsConfig for that layout)
        eagle = getattr(cfg, "eagle_config", None) or {}
        built = {"norm_before_fc": bool(eagle.get("norm_before_fc", getattr(cfg, "norm_before_fc", False))),
                 "fc_norm": bool(getattr(cfg, "fc_norm", False)),
                 "norm_before_residual": bool(getattr(cfg, "norm_before_residual", False)),
                 "norm_output": bool(getattr(cfg, "norm_output", False))}
        ours = load_draft(export, target_dir=sharp_target)
        assert built == ours.config.variant(), layout
        # vLLM's own combine_hidden_states (input_norm / fc_norm, then fc) on the toolkit's modules
        holder = type("Holder", (), {})()
        holder.model = type("M", (), {})()
        holder.model.use_aux_hidden_state = True
        holder.model.norm_before_fc = built["norm_before_fc"]
        holder.model.input_norm, holder.model.fc_norm, holder.model.fc = ours.input_norm, ours.fc_norm, ours.fc
        holder.model.num_aux_hidden_states = 3
        aux = torch.randn(5, 3 * ours.config.hidden_size) * 4
        with torch.no_grad():
            got = llama_eagle3.Eagle3LlamaForCausalLM.combine_hidden_states(holder, aux)
            assert torch.allclose(got, ours.fc(ours.normed_aux(aux)), atol=1e-5)
        names = set(load_file(str(export / "model.safetensors")))
        assert ("input_norm.weight" in names) == built["norm_before_fc"]
        assert ("fc_norm.0.weight" in names) == built["fc_norm"]


def test_vllm_drops_an_input_norm_its_config_does_not_turn_on(variant_run: tuple[str, Path], tmp_path: Path) -> None:
    """The silent failure the doctor names: vLLM's loader maps input_norm.* to nothing without norm_before_fc."""
    name, run = variant_run
    if not VARIANTS[name].get("norm_before_fc"):
        pytest.skip("a draft without input_norm")
    export = export_checkpoint(run, tmp_path / "spec", fmt="speculators", verifier="org/target")
    source = __import__("inspect").getsource(__import__(
        "vllm.model_executor.models.llama_eagle3", fromlist=["x"]).Eagle3LlamaForCausalLM.load_weights)
    assert 'if not self.model.norm_before_fc:\n            orig_to_new_substr["input_norm."] = None' in source
    from curator.doctor import diagnose

    config = json.loads((export / "config.json").read_text())
    config.pop("norm_before_fc")
    config.pop("curator")
    (export / "config.json").write_text(json.dumps(config))
    checks = {c.name: c for c in diagnose(export).checks}
    assert checks["norms (vLLM)"].status == "error" and "skipping input_norm.weight" in checks["norms (vLLM)"].detail
