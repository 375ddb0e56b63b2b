"""SGLang's EAGLE-3 layer rule for every model class in its registry: data, read by training.target.layers.

Derived from SGLang 0.5.23's own code: every class that `sglang.srt.models.registry.ModelRegistry`
lists (each module's `EntryClass`, 290 classes), with the `set_eagle3_layers_to_capture` it has
itself or inherits (GLM-5's `GlmMoeDsaForCausalLM` and `MistralLarge3ForCausalLM` inherit
DeepSeek-V2's), or the one of the language model it delegates to (Kimi-K2.5 -> DeepSeek-V3,
Gemma-3/Llama-4 multimodal -> their causal LMs). tests/engines/test_sglang_registry.py runs SGLang's
real method for every class against this table.

Rules, as `layers_to_capture` for the ids written in a draft's `eagle_config` (None: none written):
- "plus-one": None -> [2, N//2, N-3]; ids -> ids + 1 (the ids are layer outputs);
- "plus-one-if-first-is-one": None -> [2, N//2, N-3]; ids -> ids + 1 when ids[0] == 1, else ids;
- "keep-if-last-is-n": None -> [2, N//2, N-3]; ids kept when max(ids) == N, else ids + 1;
- "plus-one-always": None -> [3, N//2+1, N-2]; ids -> ids + 1 (the default gets the +1 too);
- "opaque": hands the ids to another backend (MindSpore) whose rule is not in SGLang's code;
- "no-eagle3": no `set_eagle3_layers_to_capture`: SGLang refuses EAGLE3 on this target at start-up.
"""

from __future__ import annotations

SGLANG_VERSION = "0.5.23"

SGLANG_RULES: dict[str, tuple[str, ...]] = {
    "plus-one": (
        "ApertusForCausalLM", "BailingMoEForCausalLM", "BailingMoeForCausalLM", "BailingMoeV2ForCausalLM",
        "Cosmos3ForConditionalGeneration", "EmbeddingGemmaModel", "ExaoneMoEForCausalLM",
        "ExaoneMoEForCausalLMMTP", "ExaoneMoeForCausalLM", "Gemma3ForCausalLM",
        "Gemma3ForConditionalGeneration", "Gemma4AssistantForCausalLM", "Gemma4ForCausalLM",
        "Gemma4ForConditionalGeneration", "Gemma4UnifiedAssistantForCausalLM",
        "Gemma4UnifiedForConditionalGeneration", "Glm4MoeForCausalLM", "Glm4MoeForCausalLMNextN",
        "Glm5NextForConditionalGeneration", "IQuestCoderForCausalLM", "InternLM3ForCausalLM",
        "InternS1ProForConditionalGeneration", "InternS2MobiusForConditionalGeneration",
        "InternS2PreviewForConditionalGeneration", "Llama4ForCausalLM", "Llama4ForConditionalGeneration",
        "LlamaForCausalLM", "LlamaForCausalLMEagle", "LlamaForCausalLMEagle3", "LongcatFlashForCausalLM",
        "LongcatFlashForCausalLMNextN", "MellumForCausalLM", "MiniMaxM2ForCausalLM",
        "MiniMaxM3SparseForCausalLM", "Ministral3ForCausalLM", "MistralForCausalLM", "MistralForCausalLMEagle",
        "Phi3ForCausalLM", "Qwen2ForCausalLM", "Qwen2ForCausalLMEagle", "Qwen2MoeForCausalLM",
        "Qwen2_5_VLForConditionalGeneration", "Qwen3ForCausalLM", "Qwen3MoeForCausalLM",
        "Qwen3MoeForCausalLMMTP", "Qwen3NextForCausalLM", "Qwen3NextForCausalLMMTP",
        "Qwen3VLForConditionalGeneration", "Qwen3VLMoeForConditionalGeneration", "Qwen3_5ForCausalLM",
        "Qwen3_5ForConditionalGeneration", "Qwen3_5MoeForCausalLM", "Qwen3_5MoeForConditionalGeneration",
        "Qwen4ExpForConditionalGeneration", "SarvamMoEForCausalLM", "TeleFLMForCausalLM",
    ),
    "plus-one-if-first-is-one": (
        "DeepseekV2ForCausalLM", "DeepseekV32ForCausalLM", "DeepseekV3ForCausalLM",
        "DeepseekV3ForCausalLMNextN", "Glm4MoeLiteForCausalLM", "Glm4MoeLiteForCausalLMNextN",
        "Glm5NextForConditionalGenerationNextN", "GlmMoeDsaForCausalLM", "GlmMoeDsaForCausalLMNextN",
        "KimiK25ForConditionalGeneration", "MistralLarge3ForCausalLM", "MistralLarge3ForCausalLMEagle",
    ),
    "keep-if-last-is-n": (
        "GptOssForCausalLM",
    ),
    "plus-one-always": (
        "MiniMaxM3SparseForConditionalGeneration",
    ),
    "opaque": (
        "MindSporeForCausalLM",
    ),
    "no-eagle3": (
        "AfmoeForCausalLM", "ArceeForCausalLM", "BaichuanForCausalLM",
        "BailingMM2NativeForConditionalGeneration", "BailingMMNativeForConditionalGeneration",
        "BailingMoeForCausalLMNextN", "BailingMoeV2_5ForCausalLM", "BailingMoeV3ForCausalLM",
        "BailingMoeV3VLForConditionalGeneration", "BeamForCausalLM", "BertForSequenceClassification",
        "BertModel", "CLIPModel", "ChatGLMModel", "Cohere2ForCausalLM", "Cohere2MoeForCausalLM",
        "Cohere2VisionForConditionalGeneration", "CohereForCausalLM", "Contriever",
        "Cosmos3EdgeForConditionalGeneration", "DFlash2BeamDraftModel", "DFlash2DraftModel", "DFlashDraftModel",
        "DFlashLagunaForCausalLM", "DSparkDraftModel", "DSparkMiniMaxDraftModel", "DbrxForCausalLM",
        "DeciLMForCausalLM", "DeepseekForCausalLM", "DeepseekOCRForCausalLM", "DeepseekV4ForCausalLM",
        "DeepseekV4ForCausalLMDSpark", "DeepseekV4ForCausalLMNextN", "DeepseekVL2ForCausalLM",
        "DiffusionGemmaForBlockDiffusion", "Dots3NoteForCausalLM", "Dots3NoteForCausalLMNextN",
        "DotsOCRForCausalLM", "DotsVLMForCausalLM", "Eagle3DeepseekV2ForCausalLM", "EmbeddingGemma2Model",
        "Ernie4_5_ForCausalLM", "Ernie4_5_MoeForCausalLM", "Ernie4_5_MoeForCausalLMMTP",
        "Ernie4_5_VLMoeForConditionalGeneration", "Exaone4ForCausalLM", "ExaoneForCausalLM",
        "FalconH1ForCausalLM", "FalconMambaForCausalLM", "GPT2LMHeadModel", "GPTBigCodeForCausalLM",
        "GPTJForCausalLM", "Gemma2ForCausalLM", "Gemma2ForSequenceClassification", "Gemma3nForCausalLM",
        "Gemma3nForConditionalGeneration", "GemmaForCausalLM", "GigaChat35ForCausalLM",
        "GigaChat35ForCausalLMNextN", "Glm4ForCausalLM", "Glm4vForConditionalGeneration",
        "Glm4vMoeForConditionalGeneration", "GlmAsrForConditionalGeneration",
        "GlmImageForConditionalGeneration", "GlmOcrForConditionalGeneration",
        "GlmOcrForConditionalGenerationNextN", "GraniteForCausalLM", "GraniteMoeForCausalLM",
        "GraniteMoeHybridForCausalLM", "GraniteMoeSWAForCausalLM", "GraniteMoeSharedForCausalLM",
        "GraniteSWAForCausalLM", "Grok1ForCausalLM", "Grok1ModelForCausalLM", "HYV3ForCausalLM",
        "HYV3ForCausalLMNextN", "HYV4ForCausalLM", "HYV4ForCausalLMNextN", "HrmTextForCausalLM",
        "HunYuanDenseV1ForCausalLM", "HunYuanMoEV1ForCausalLM", "IQuestLoopCoderForCausalLM",
        "IQuestQ1ForCausalLM", "IQuestQ1MTP", "InklingForConditionalGeneration",
        "InklingForConditionalGenerationMTP", "InternLM2ForCausalLM", "InternLM2ForRewardModel",
        "InternS1ForConditionalGeneration", "InternVLChatModel", "JetNemotronForCausalLM",
        "JetVLMForConditionalGeneration", "K2HorizonForCausalLM", "KimiK3ForConditionalGeneration",
        "KimiK3LinearForCausalLM", "KimiLinearForCausalLM", "KimiVLForConditionalGeneration",
        "LLaDA2MoeModelLM", "LagunaForCausalLM", "Lfm2BidirectionalModel", "Lfm2DSparkDraftModel",
        "Lfm2ForCausalLM", "Lfm2MoeForCausalLM", "Lfm2VlForConditionalGeneration", "LiLiCorrDraftModel",
        "LightOnOCRForConditionalGeneration", "LingDSparkModel", "LlamaEmbeddingModel",
        "LlamaForClassification", "LlamaForSequenceClassification",
        "LlamaForSequenceClassificationWithNormal_Weights", "LlavaForConditionalGeneration",
        "LlavaLlamaForCausalLM", "LlavaMistralForCausalLM", "LlavaQwenForCausalLM", "LlavaVidForCausalLM",
        "LocateAnythingForConditionalGeneration", "Mamba2ForCausalLM", "MambaForCausalLM", "MiDashengLMModel",
        "MiMoForCausalLM", "MiMoMTP", "MiMoV2ASRForCausalLM", "MiMoV2FlashForCausalLM", "MiMoV2ForCausalLM",
        "MiMoV2MTP", "MiniCPM3ForCausalLM", "MiniCPMForCausalLM", "MiniCPMO", "MiniCPMSALAForCausalLM",
        "MiniCPMV", "MiniCPMV4_6ForConditionalGeneration", "MiniCPMV4_7ForConditionalGeneration",
        "MiniMaxDFlash2DraftModel", "Mistral3ForConditionalGeneration", "MistralModel", "MixtralForCausalLM",
        "MllamaForConditionalGeneration", "MossVLForConditionalGeneration", "MultiModalityCausalLM",
        "MuseGlimmerAssistantModel", "MuseGlimmerForCausalLM", "MuseGlimmerForConditionalGeneration",
        "MuseSparkForConditionalGeneration", "NVILAForConditionalGeneration",
        "NVILALiteForConditionalGeneration", "NanbeigeForCausalLM", "NanbeigeForSequenceClassification",
        "NemotronHForCausalLM", "NemotronHForCausalLMMTP", "NemotronHPuzzleForCausalLM",
        "NemotronH_Nano_Omni_Reasoning_V3", "NemotronH_Nano_VL_V2", "NemotronH_Omni_Reasoning_V3",
        "OPTForCausalLM", "Olmo2ForCausalLM", "OlmoForCausalLM", "OlmoeForCausalLM", "OrionForCausalLM",
        "POINTSV15ChatModel", "PaddleOCRVLForConditionalGeneration", "PersimmonForCausalLM",
        "Phi3SmallForCausalLM", "Phi4MMForCausalLM", "PhiForCausalLM", "PhiMoEForCausalLM",
        "PixtralForConditionalGeneration", "PixtralVisionModel", "QWenLMHeadModel", "QuantMixtralForCausalLM",
        "Qwen2AudioForConditionalGeneration", "Qwen2ForRewardModel", "Qwen2ForSequenceClassification",
        "Qwen2VLForConditionalGeneration", "Qwen3ASRForConditionalGeneration", "Qwen3DSparkModel",
        "Qwen3ForRewardModel", "Qwen3ForSequenceClassification", "Qwen3Model",
        "Qwen3OmniMoeForConditionalGeneration", "Qwen3_5ForCausalLMMTP", "Qwen4ExpForCausalLMMTP",
        "SDARForCausalLM", "SDARMoeForCausalLM", "Sarashina2VisionForCausalLM", "SarvamMLAForCausalLM",
        "SolarForCausalLM", "Spark2_5ForCausalLM", "StableLmForCausalLM", "Starcoder2ForCausalLM",
        "Step3VLForConditionalGeneration", "Step3p5ForCausalLM", "Step3p5MTP",
        "Step3p7ForConditionalGeneration", "StepVLForConditionalGeneration", "TorchNativeLlamaForCausalLM",
        "TorchNativePhi3ForCausalLM", "TransformersEmbeddingModel", "TransformersForCausalLM",
        "TransformersForSequenceClassification", "TransformersMoEEmbeddingModel", "TransformersMoEForCausalLM",
        "TransformersMoEForSequenceClassification", "TransformersMultiModalEmbeddingModel",
        "TransformersMultiModalForCausalLM", "TransformersMultiModalForSequenceClassification",
        "TransformersMultiModalMoEEmbeddingModel", "TransformersMultiModalMoEForCausalLM",
        "TransformersMultiModalMoEForSequenceClassification", "UnlimitedOCRForCausalLM",
        "VoxtralForConditionalGeneration", "WhisperForConditionalGeneration",
        "XLMRobertaForSequenceClassification", "XLMRobertaModel", "XllmForCausalLM", "XverseForCausalLM",
        "XverseMoeForCausalLM", "YiVLForCausalLM", "ZayaForCausalLM",
    ),
}

# Classes whose model loop also captures the last layer's output (id N, before the final norm), read
# in gpt_oss.py (`self.end_layer in self.layers_to_capture`) and gemma3_causal.py / gemma4_causal.py
# (`num_layers in self.layers_to_capture`); every other loop captures only the inputs of layers 0..N-1.
SGLANG_CAPTURES_LAST_OUTPUT = frozenset({
    "GptOssForCausalLM", "Gemma3ForCausalLM", "Gemma3ForConditionalGeneration", "Gemma4ForCausalLM",
    "Gemma4ForConditionalGeneration",
})

RULE_OF_CLASS: dict[str, str] = {cls: rule for rule, classes in SGLANG_RULES.items() for cls in classes}
