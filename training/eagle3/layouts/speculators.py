"""vLLM's speculators layout: `Eagle3Speculator` (speculators 0.9.0 config; vLLM 0.33.0
transformers_utils/configs/speculators/ turns it into its own Eagle3 config).

- the decoder layer under `layers.0.`, with `embed_tokens.weight` (speculators' checkpoints carry it,
  and its loader leaves a missing one uninitialised);
- the ids as layer inputs at the top level (vLLM and speculators both read them so);
- `transformer_layer_config` becomes vLLM's draft config: `num_aux_hidden_states` goes there, the
  key vLLM's Eagle3 draft reads first for the width of fc (else 3, as vLLM's parser does not copy the
  ids into eagle_config); speculators counts the ids;
- `speculators_config.verifier.name_or_path` is the target's Hub id, which vLLM resolves;
- EAGLE-3.1's norms as speculators' own config fields (`norm_before_fc`, `fc_norm`, `norm_output`,
  `norm_before_residual`), each written explicitly: vLLM's speculators parser reads a missing
  `norm_before_residual` as true where speculators reads it as false.
"""

from __future__ import annotations

from typing import Any

from training.target.layers import vllm_captured
from training.eagle3.layouts.base import VARIANT_KEYS, ExportSource, Layout, flag, llama_fields
from training.io.export_folder import PROVENANCE_KEY, provenance


class SpeculatorsLayout(Layout):
    name = "speculators"
    architecture = "Eagle3Speculator"
    decoder_prefix = "layers.0."
    carries_embeddings = True

    def config(self, source: ExportSource) -> dict[str, Any]:
        cfg = source.draft
        return {
            "architectures": [self.architecture],
            "speculators_model_type": "eagle3",
            "transformer_layer_config": {"architectures": ["LlamaForCausalLM"], **llama_fields(cfg),
                                         "num_aux_hidden_states": len(source.layer_inputs)},
            "draft_vocab_size": cfg.draft_vocab_size,
            "target_hidden_size": cfg.target_hidden_size,
            **self.variant_config(source),
            "eagle_aux_hidden_state_layer_ids": list(source.layer_inputs),
            "speculators_config": {
                "algorithm": "eagle3",
                "proposal_methods": [{"proposal_type": "greedy", "speculative_tokens": source.speculative_tokens}],
                "default_proposal_method": "greedy",
                "verifier": {"name_or_path": source.verifier,
                             "architectures": source.target_config.get("architectures") or []},
            },
            "torch_dtype": "bfloat16",
            PROVENANCE_KEY: source.provenance,
        }

    def recognises(self, config: dict[str, Any]) -> bool:
        return super().recognises(config) or bool(config.get("speculators_model_type"))

    def config_problems(self, config: dict[str, Any]) -> list[str]:
        kind = config.get("speculators_model_type")
        wrong_kind = [] if kind == "eagle3" else [f"speculators_model_type={kind!r}, expected 'eagle3'"]
        return wrong_kind + super().config_problems(config)

    def verifier(self, config: dict[str, Any]) -> str | None:
        return str(((config.get("speculators_config") or {}).get("verifier") or {}).get("name_or_path") or "")

    def fc_aux_count(self, config: dict[str, Any]) -> int:
        # vLLM's parser builds the draft config from transformer_layer_config and does not copy the ids
        # into eagle_config: without num_aux_hidden_states there, vLLM builds fc for 3
        count = self.decoder_config(config).get("num_aux_hidden_states")
        return count if isinstance(count, int) and not isinstance(count, bool) and count > 0 else 3

    def decoder_config(self, config: dict[str, Any]) -> dict[str, Any]:
        return dict(config.get("transformer_layer_config") or {})

    def written_layer_ids(self, config: dict[str, Any]) -> list[int] | None:
        ids = config.get("eagle_aux_hidden_state_layer_ids")
        return [int(i) for i in ids] if isinstance(ids, list) and ids else None

    def served(self, config: dict[str, Any], target_config: dict[str, Any]) -> dict[str, list[int]]:
        return {"vLLM 0.33 / speculators": vllm_captured(self.written_layer_ids(config), int(target_config["num_hidden_layers"]))}

    def served_layer_inputs(self, config: dict[str, Any], target_config: dict[str, Any] | None) -> list[int]:
        ids = self.written_layer_ids(config)
        if (target_config is None or not target_config.get("num_hidden_layers")) and ids and \
                not provenance(config).get("aux_layer_inputs"):
            return vllm_captured(ids, max(ids) + 1)  # inputs as written: the target's depth is not needed
        return super().served_layer_inputs(config, target_config)

    # EAGLE-3.1's norms as each reader builds them from this layout's config.json (docs/eagle3-variants.md)

    def owner_variant(self, config: dict[str, Any]) -> dict[str, bool]:
        # speculators 0.9.0 Eagle3SpeculatorConfig: every flag a top-level field, false when absent
        return {k: flag(config.get(k, False)) for k in VARIANT_KEYS}

    def served_variants(self, config: dict[str, Any]) -> dict[str, dict[str, bool]]:
        # vLLM 0.32/0.33 transformers_utils/configs/speculators/algos.py update_eagle3 copies the four keys
        # into the draft's config, a missing norm_before_residual as True
        vllm = {k: flag(config.get(k, k == "norm_before_residual")) for k in VARIANT_KEYS}
        return {"vLLM 0.33": vllm, "speculators 0.9.0": self.owner_variant(config)}
