"""Regeneration through the target: every answer of a mix produced again by the model the
draft will serve with, over OpenAI-compatible servers or in-process, resumable by sample id."""

from curator.generate.run import GenerateConfig, GenerationStats, Snapshot, generate, generate_async

__all__ = ["GenerateConfig", "GenerationStats", "Snapshot", "generate", "generate_async"]
