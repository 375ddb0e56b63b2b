"""What every export layout is: the typed contract `export`, `load_draft` and `curator doctor` use.

A layout owns, for one serving format: its config.json (writer and reader), its weight names (the
map from the toolkit's names and back), which weights it carries, how its layer ids are numbered and
which engines read them. Adding a layout is one module here plus one line in the registry
(training/eagle3/layouts/__init__.py); docs/adding-a-layout-or-engine.md says what else it needs.
"""

from __future__ import annotations

from abc import ABC, abstractmethod
from collections.abc import Mapping
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any, ClassVar

from training.eagle3 import config_check
from training.errors import ModelMismatchError
from training.io.export_folder import provenance

if TYPE_CHECKING:  # torch loads only where weights are touched: `curator doctor`'s usage error stays fast
    import torch

    from training.eagle3.model import DraftConfig

# The one decoder layer of an EAGLE-3 draft, relative to its prefix (midlayer. in the toolkit's names).
DECODER_KEYS = (
    "self_attn.q_proj.weight", "self_attn.k_proj.weight", "self_attn.v_proj.weight", "self_attn.o_proj.weight",
    "mlp.gate_proj.weight", "mlp.up_proj.weight", "mlp.down_proj.weight",
    "input_layernorm.weight", "hidden_norm.weight", "post_attention_layernorm.weight",
)
INTERNAL_PREFIX = "midlayer."
# EAGLE-3.1's normalisation flags (training/eagle3/model.py VARIANT_KEYS; kept here so that reading a
# config.json loads no torch)
VARIANT_KEYS = ("norm_before_fc", "fc_norm", "norm_before_residual", "norm_output")
PLAIN = dict.fromkeys(VARIANT_KEYS, False)


def flag(value: Any) -> bool:
    """Return a config value as the engines read it: Python truthiness (`bool(x)`, `getattr(config, k)`)."""
    return bool(value)


def variant_weights(variant: dict[str, bool], n_aux: int) -> list[str]:
    """Return the norm weights a draft of this variant has (same names in every layout and engine)."""
    names = ["input_norm.weight"] if variant.get("norm_before_fc") else []
    return names + ([f"fc_norm.{i}.weight" for i in range(n_aux)] if variant.get("fc_norm") else [])


def variant_text(variant: dict[str, bool]) -> str:
    """Return a variant as its set flags ("plain EAGLE-3" when none is)."""
    on = [k for k in VARIANT_KEYS if variant.get(k)]
    return ", ".join(on) if on else "plain EAGLE-3"


@dataclass(frozen=True)
class ExportSource:
    """What a layout writes from: the trained draft, its layers, and what is known of its target."""

    draft: DraftConfig
    layer_inputs: list[int]  # the target layers the draft was trained on, as layer inputs
    target_architecture: str | None
    target_layers: int
    target_config: dict[str, Any]
    provenance: dict[str, Any]  # recorded under "curator" in the config
    verifier: str  # the target's Hub id (or folder) for layouts that name one
    speculative_tokens: int

    @property
    def variant(self) -> dict[str, bool]:
        """Return the draft's EAGLE-3.1 normalisation flags."""
        return {k: bool(getattr(self.draft, k, False)) for k in VARIANT_KEYS}


def llama_fields(cfg: DraftConfig) -> dict[str, Any]:
    """Return the Llama-config fields that describe the draft's decoder layer."""
    return {
        "model_type": "llama", "hidden_size": cfg.hidden_size, "intermediate_size": cfg.intermediate_size,
        "num_attention_heads": cfg.num_attention_heads, "num_key_value_heads": cfg.num_key_value_heads,
        "head_dim": cfg.head_dim, "num_hidden_layers": 1, "hidden_act": "silu", "rms_norm_eps": cfg.rms_norm_eps,
        "rope_theta": cfg.rope_theta, "rope_scaling": cfg.rope_scaling,
        "max_position_embeddings": cfg.max_position_embeddings, "vocab_size": cfg.vocab_size,
        "tie_word_embeddings": False, "attention_bias": False, "mlp_bias": False, "torch_dtype": "bfloat16",
    }


class Layout(ABC):
    """One serving format of an EAGLE-3 draft."""

    name: ClassVar[str]  # --format NAME
    architecture: ClassVar[str]  # config.json `architectures[0]`, how a reader recognises it
    decoder_prefix: ClassVar[str]  # the decoder layer's weight-name prefix in the file
    carries_embeddings: ClassVar[bool]  # embed_tokens.weight in the file (else the engine shares the target's)

    # ---------------------------------------------------------------- writing

    @abstractmethod
    def config(self, source: ExportSource) -> dict[str, Any]:
        """Return the config.json for a draft, its ids in the numbering of this layout's readers.

        Raises ModelMismatchError when a reader of this layout cannot be told to serve it as trained.
        """

    def file_weights(self, weights: dict[str, torch.Tensor], embeddings: torch.Tensor | None) -> dict[str, torch.Tensor]:
        """Return the weights under this layout's names, floats in bf16 (d2t/t2d left out for a full vocabulary)."""
        import torch

        drop = {"embed_tokens.weight"} | ({"d2t", "t2d"} if same_vocab(weights) else set())
        out = {}
        if self.carries_embeddings and embeddings is not None:
            out["embed_tokens.weight"] = embeddings.to(torch.bfloat16).contiguous()
        for name, t in weights.items():
            if name in drop:
                continue
            if name.startswith(INTERNAL_PREFIX):
                name = self.decoder_prefix + name[len(INTERNAL_PREFIX):]
            out[name] = (t.to(torch.bfloat16) if t.is_floating_point() else t).contiguous()
        return out

    # ---------------------------------------------------------------- reading

    def recognises(self, config: dict[str, Any]) -> bool:
        """Return whether a config.json is of this layout."""
        return self.architecture in (config.get("architectures") or [])

    def decoder_config(self, config: dict[str, Any]) -> dict[str, Any]:
        """Return the config block that describes the draft's decoder layer."""
        return config

    @abstractmethod
    def written_layer_ids(self, config: dict[str, Any]) -> list[int] | None:
        """Return the aux layer ids written for this layout's main reader, in its numbering (None: none)."""

    @abstractmethod
    def served(self, config: dict[str, Any], target_config: dict[str, Any]) -> dict[str, list[int]]:
        """Return, per engine that reads this layout, the target layers (as inputs) it feeds the draft."""

    def config_problems(self, config: dict[str, Any]) -> list[str]:
        """Return what in a config.json of this layout its readers refuse or misserve: the decoder's layer
        count and the aux-state count, as every layout's readers build them, and the values every draft
        is built from (training/eagle3/config_check.py). The doctor and load_draft both ask this."""
        layer = self.decoder_config(config)
        return [*decoder_layer_problems(layer, self.layer_count_rules()),
                *aux_count_problems(layer, self.written_layer_ids(config)),
                *config_check.config_value_problems(layer, config)]

    def tensor_problems(self, config: dict[str, Any], tensors: Mapping[str, tuple[tuple[int, ...], str]]) -> list[str]:
        """Return what is wrong with the file's tensors ({file name: (shape, safetensors dtype)}) for this
        config: names no draft of this layout has, dtypes, and the decoder's and norms' shapes. The
        doctor (from the safetensors headers) and load_draft (from the loaded weights) both ask this."""
        n_aux = self.fc_aux_count(config)
        known = {"fc.weight", "norm.weight", "lm_head.weight", "d2t", "t2d", "embed_tokens.weight",
                 *(INTERNAL_PREFIX + k for k in DECODER_KEYS), *variant_weights(dict.fromkeys(VARIANT_KEYS, True), n_aux)}
        internal = {self.internal_name(k): v for k, v in tensors.items()}
        return config_check.tensor_problems(internal, known,
                                            config_check.expected_shapes(self.decoder_config(config), config, n_aux))

    def layer_count_rules(self) -> dict[str, str]:
        """Return, per engine that reads this layout, what it does with `num_hidden_layers` > 1."""
        return {f"vLLM {VLLM_VERSION}": VLLM_LAYER_RULE}

    def verifier(self, config: dict[str, Any]) -> str | None:
        """Return the target a reader of this layout serves by name (None: the layout names none)."""
        return None

    def fc_aux_count(self, config: dict[str, Any]) -> int:
        """Return how many aux states the readers build fc for: `num_aux_hidden_states` first (both
        engines' EAGLE-3 drafts), else the count of the ids written, else 3."""
        count = self.decoder_config(config).get("num_aux_hidden_states")
        if isinstance(count, int) and not isinstance(count, bool) and count > 0:
            return count
        ids = self.written_layer_ids(config)
        return len(ids) if ids else 3

    def internal_weights(self, weights: dict[str, torch.Tensor]) -> dict[str, torch.Tensor]:
        """Return file weights under the toolkit's names."""
        return {self.internal_name(k): v for k, v in weights.items()}

    def internal_name(self, name: str) -> str:
        """Return a file weight's name in the toolkit's names."""
        return INTERNAL_PREFIX + name[len(self.decoder_prefix):] if name.startswith(self.decoder_prefix) else name

    def required_weights(self, small_vocab: bool, variant: dict[str, bool] | None = None, n_aux: int = 3) -> list[str]:
        """Return the tensor names a reader of this layout needs in the file (a variant's norms included)."""
        maps = ["d2t", "t2d"] if small_vocab else []
        return ["fc.weight", "norm.weight", "lm_head.weight", *maps, *(self.decoder_prefix + k for k in DECODER_KEYS),
                *variant_weights(variant or PLAIN, n_aux)]

    # ---------------------------------------------------------------- EAGLE-3.1 normalisations

    def variant_config(self, source: ExportSource) -> dict[str, bool]:
        """Return the config keys that tell every reader of this layout the draft's norms (written explicitly,
        false included: vLLM reads a speculators file without `norm_before_residual` as true)."""
        return dict(source.variant)

    @abstractmethod
    def served_variants(self, config: dict[str, Any]) -> dict[str, dict[str, bool]]:
        """Return, per engine (with its version) that serves this layout, the norms it builds from the config."""

    def trained_variant(self, config: dict[str, Any]) -> dict[str, bool]:
        """Return the norms the draft was trained with: the toolkit's record, else what the layout's owner reads."""
        recorded = provenance(config).get("variant")
        if isinstance(recorded, dict):
            return {k: bool(recorded.get(k)) for k in VARIANT_KEYS}
        return self.owner_variant(config)

    @abstractmethod
    def owner_variant(self, config: dict[str, Any]) -> dict[str, bool]:
        """Return the norms as the layout's own format defines them (SpecForge/SGLang, speculators)."""

    def served_layer_inputs(self, config: dict[str, Any], target_config: dict[str, Any] | None) -> list[int]:
        """Return the target layers (as inputs) this layout's main reader feeds the draft.

        Needs the target's config when the numbering depends on it; without it, an export of this
        toolkit answers from its record.
        """
        if target_config is None or not target_config.get("num_hidden_layers"):
            recorded = provenance(config).get("aux_layer_inputs")
            if recorded:
                return sorted(int(i) for i in recorded)
            raise ModelMismatchError("the draft's layers depend on the target; pass the target's model folder")
        return next(iter(self.served(config, target_config).values()))

    def draft_config(self, config: dict[str, Any], target_config: dict[str, Any] | None) -> DraftConfig:
        """Return the draft's config as the toolkit builds it, read from an export's config.json."""
        from training.eagle3.model import DraftConfig

        layer = self.decoder_config(config)
        layer_ids = self.served_layer_inputs(config, target_config)
        return DraftConfig(
            hidden_size=int(layer["hidden_size"]),
            target_hidden_size=int(config.get("target_hidden_size") or layer["hidden_size"]),
            num_attention_heads=int(layer["num_attention_heads"]),
            # absent: as many as the query heads, as transformers' LlamaConfig (so the engines) reads it
            num_key_value_heads=int(layer.get("num_key_value_heads") or layer["num_attention_heads"]),
            head_dim=layer.get("head_dim"),
            intermediate_size=int(layer["intermediate_size"]),
            vocab_size=int(layer["vocab_size"]),
            draft_vocab_size=int(config["draft_vocab_size"]),
            num_aux_layers=len(layer_ids) or 3,
            rms_norm_eps=float(layer.get("rms_norm_eps", 1e-5)),
            rope_theta=float(layer.get("rope_theta", 10000.0)),
            rope_scaling=_rope_scaling(layer.get("rope_scaling")),
            max_position_embeddings=int(layer.get("max_position_embeddings", 8192)),
            aux_layer_ids=[int(i) for i in layer_ids],
            **self.trained_variant(config),
        )


def _rope_scaling(scaling: Any) -> dict[str, Any] | None:
    """Return a config's rope_scaling with its type under `rope_type`: transformers (so both engines) reads
    the legacy `type` key as the same, and the draft would otherwise compute plain rope for a linear one."""
    if not isinstance(scaling, dict):
        return scaling
    if "rope_type" not in scaling and "type" in scaling:
        return {**{k: v for k, v in scaling.items() if k != "type"}, "rope_type": scaling["type"]}
    return scaling


# vLLM 0.32/0.33 model_executor/models/llama_eagle3.py: LlamaModel builds `range(num_hidden_layers)`
# decoder layers and loads what the file has; an export carries one layer, so the rest run untrained
VLLM_VERSION = "0.33"
VLLM_LAYER_RULE = ("builds that many decoder layers (llama_eagle3.py LlamaModel) and the export carries weights "
                   "for one: the others would run uninitialised")


def decoder_layer_problems(layer: dict[str, Any], rules: dict[str, str]) -> list[str]:
    """Return what is wrong with the decoder's `num_hidden_layers` for the engines in `rules`.

    A missing key is as wrong as a bad one: the engines read the block as a transformers LlamaConfig,
    whose default is 32 layers. Not a positive integer: no engine builds a draft from it.
    """
    value = layer.get("num_hidden_layers")
    if "num_hidden_layers" not in layer:
        return ["num_hidden_layers is missing: the engines read the decoder as a LlamaConfig, whose default is 32 "
                "layers; an EAGLE-3 draft has 1 (re-export with curator export)"]
    if not isinstance(value, int) or isinstance(value, bool) or value < 1:
        return [f"num_hidden_layers={value!r} is not a layer count: every engine builds the draft's decoder layers "
                "from it, and an EAGLE-3 draft has 1 (re-export with curator export)"]
    if value == 1:
        return []
    return [f"num_hidden_layers={value}: {engine} {rule}" for engine, rule in rules.items()]


def aux_count_problems(layer: dict[str, Any], written_ids: list[int] | None) -> list[str]:
    """Return what is wrong with `num_aux_hidden_states`, the width both engines build fc for.

    Absent is fine (the engines count the ids, else 3); present, it must be the number of states the
    engine captures: the ids written, else its default 3 layers. Any other count gives an fc the
    captured states do not fit (the engine refuses the weights, or the run fails at the first step).
    """
    if "num_aux_hidden_states" not in layer:
        return []
    value = layer["num_aux_hidden_states"]
    if not isinstance(value, int) or isinstance(value, bool) or value < 1:
        return [f"num_aux_hidden_states={value!r} is not a count of aux hidden states (a positive integer)"]
    captured = len(written_ids) if written_ids else 3
    if value != captured:
        where = f"the {captured} layer ids written" if written_ids else "the engines' default 3 layers"
        return [f"num_aux_hidden_states={value}, but the engines capture {where}: "
                f"fc would be built for {value} states and get {captured}"]
    return []


def same_vocab(weights: dict[str, torch.Tensor]) -> bool:
    """Return whether the draft vocabulary is the whole target vocabulary, in order."""
    d2t, t2d = weights["d2t"], weights["t2d"]
    return d2t.numel() == t2d.numel() and not bool(d2t.any()) and bool(t2d.all())
