"""SGLang's layout: `LlamaForCausalLMEagle3` (SGLang 0.5.23 srt/models/llama_eagle3.py), also served by vLLM.

- the ids go under `eagle_config.eagle_aux_hidden_state_layer_ids` in the numbering SGLang's target
  class applies (training.target.layers), left out when they equal SGLang's default; an export SGLang cannot
  be told to serve as trained is refused;
- the same ids, as layer inputs, at the top level: the key vLLM's runners read first when they serve
  this layout (SGLang's draft reads only eagle_config's);
- `num_aux_hidden_states`, read first by both engines' draft classes for the width of fc (else the
  count of eagle_config's ids, else 3): a draft on other than 3 layers gets its fc built right;
- no embedding: SGLang shares the target's.
"""

from __future__ import annotations

from typing import Any

from training.target.layers import sglang_captured, sglang_config_ids, sglang_rule, vllm_captured
from training.eagle3.layouts.base import ExportSource, Layout, llama_fields
from training.target.sglang_rules import SGLANG_VERSION


class SGLangLayout(Layout):
    name = "sglang"
    architecture = "LlamaForCausalLMEagle3"
    decoder_prefix = "midlayer."
    carries_embeddings = False

    def config(self, source: ExportSource) -> dict[str, Any]:
        cfg = source.draft
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
            "curator": {**source.provenance, "sglang_layer_rule": sglang_rule(source.target_architecture),
                        "target_architecture": source.target_architecture},
        }

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
