"""SGLang's layout: `LlamaForCausalLMEagle3` (SGLang 0.5.23 srt/models/llama_eagle3.py), also served by vLLM.

- the ids go under `eagle_config.eagle_aux_hidden_state_layer_ids` in the numbering SGLang's target
  class applies (training.target.layers), left out when they equal SGLang's default; an export SGLang cannot
  be told to serve as trained is refused;
- the same ids, as layer inputs, at the top level: the key vLLM's runners read first when they serve
  this layout (SGLang's draft reads only eagle_config's);
- `num_aux_hidden_states`, read first by both engines' draft classes for the width of fc (else the
  count of eagle_config's ids, else 3): a draft on other than 3 layers gets its fc built right;
- no embedding: SGLang shares the target's;
- EAGLE-3.1's norms as top-level keys (`norm_before_fc`, `fc_norm`, `norm_output`, `norm_before_residual`),
  their weights `input_norm.weight` and `fc_norm.{i}.weight`. SGLang 0.5.23's draft has no
  `norm_before_residual` (its residual is always the raw hidden): a draft trained with it is refused
  here, since SGLang would serve it silently without (vLLM serves it from the speculators layout).
"""

from __future__ import annotations

from typing import Any

from training.errors import ModelMismatchError
from training.target.layers import sglang_captured, sglang_config_ids, sglang_rule, vllm_captured
from training.eagle3.layouts.base import ExportSource, Layout, flag, llama_fields
from training.io.export_folder import PROVENANCE_KEY
from training.target.sglang_rules import SGLANG_VERSION


class SGLangLayout(Layout):
    name = "sglang"
    architecture = "LlamaForCausalLMEagle3"
    decoder_prefix = "midlayer."
    carries_embeddings = False

    def config(self, source: ExportSource) -> dict[str, Any]:
        cfg = source.draft
        if source.variant["norm_before_residual"]:
            raise ModelMismatchError(
                f"the draft was trained with norm_before_residual, which SGLang {SGLANG_VERSION}'s "
                "LlamaForCausalLMEagle3 does not build (its residual is the raw hidden): SGLang would serve it "
                "silently without; export it with --format speculators for vLLM (0.32+ reads it), or train without")
        config_ids = sglang_config_ids(source.layer_inputs, source.target_architecture, source.target_layers)
        eagle_config: dict[str, Any] = {"use_aux_hidden_state": True}
        if config_ids is not None:
            eagle_config["eagle_aux_hidden_state_layer_ids"] = config_ids
        return {
            "architectures": [self.architecture],
            **llama_fields(cfg),
            "draft_vocab_size": cfg.draft_vocab_size,
            "target_hidden_size": cfg.target_hidden_size,
            "num_aux_hidden_states": len(source.layer_inputs),
            "eagle_config": eagle_config,
            "eagle_aux_hidden_state_layer_ids": list(source.layer_inputs),
            **self.variant_config(source),
            PROVENANCE_KEY: {**source.provenance, "sglang_layer_rule": sglang_rule(source.target_architecture),
                        "target_architecture": source.target_architecture},
        }

    def layer_count_rules(self) -> dict[str, str]:
        # SGLang 0.5.23 srt/models/llama_eagle3.py LlamaForCausalLMEagle3.__init__:
        # `if config.num_hidden_layers != 1: raise ValueError("EAGLE3 currently only supports 1 layer")`
        return {f"SGLang {SGLANG_VERSION}": "LlamaForCausalLMEagle3 refuses to load unless it is 1 "
                                            "(\"EAGLE3 currently only supports 1 layer\")",
                **super().layer_count_rules()}

    def written_layer_ids(self, config: dict[str, Any]) -> list[int] | None:
        ids = (config.get("eagle_config") or {}).get("eagle_aux_hidden_state_layer_ids")
        return [int(i) for i in ids] if isinstance(ids, list) and ids else None

    def served(self, config: dict[str, Any], target_config: dict[str, Any]) -> dict[str, list[int]]:
        """SGLang applies its per-class rule to eagle_config's ids; vLLM reads the top-level key first
        (both runners), else the V1 runner eagle_config's ids and the V2 runner `eagle_config.layer_ids`."""
        n = int(target_config["num_hidden_layers"])
        arch = (target_config.get("architectures") or [None])[0]
        eagle = config.get("eagle_config") or {}
        top = config.get("eagle_aux_hidden_state_layer_ids")
        return {
            f"SGLang {SGLANG_VERSION} ({arch}: {sglang_rule(arch)})": sglang_captured(self.written_layer_ids(config), arch, n),
            "vLLM 0.33 V1 runner": vllm_captured(top or eagle.get("eagle_aux_hidden_state_layer_ids"), n),
            "vLLM 0.33 V2 runner": vllm_captured(top or eagle.get("layer_ids"), n),
        }

    # EAGLE-3.1's norms as each reader builds them from this layout's config.json (docs/eagle3-variants.md)

    def owner_variant(self, config: dict[str, Any]) -> dict[str, bool]:
        """What the file declares: every key either engine reads (a key SGLang has no norm for still says
        how the draft was trained, e.g. norm_before_residual, which vLLM builds)."""
        eagle = self._eagle(config)
        return {
            "norm_before_fc": flag(eagle.get("norm_before_fc", config.get("norm_before_fc", False))),
            "fc_norm": flag(config.get("fc_norm") or config.get("use_aux_norm", False)),
            "norm_before_residual": flag(config.get("norm_before_residual", False)),
            "norm_output": flag(config.get("norm_output", False)),
        }

    def served_variants(self, config: dict[str, Any]) -> dict[str, dict[str, bool]]:
        # SGLang 0.5.23 srt/models/llama_eagle3.py: norm_before_fc from eagle_config, else the top level;
        # fc_norm (or its legacy `use_aux_norm`) and norm_output from the top level; no norm_before_residual
        sglang = {**self.owner_variant(config), "norm_before_residual": False}
        # vLLM 0.32/0.33 model_executor/models/llama_eagle3.py: the same, without the legacy key, and with
        # norm_before_residual from the top level
        vllm = {**self.owner_variant(config), "fc_norm": flag(config.get("fc_norm", False))}
        return {f"SGLang {SGLANG_VERSION}": sglang, "vLLM 0.33": vllm}

    def internal_name(self, name: str) -> str:
        # SGLang's loader renames the legacy per-state norms (aux_norm_low/mid/high) to fc_norm.0/1/2
        stem = name.removesuffix(".weight")
        return LEGACY_NAMES[stem] + ".weight" if stem in LEGACY_NAMES else super().internal_name(name)

    @staticmethod
    def _eagle(config: dict[str, Any]) -> dict[str, Any]:
        eagle = config.get("eagle_config")
        return eagle if isinstance(eagle, dict) else {}


LEGACY_NAMES = {"aux_norm_low": "fc_norm.0", "aux_norm_mid": "fc_norm.1", "aux_norm_high": "fc_norm.2"}
