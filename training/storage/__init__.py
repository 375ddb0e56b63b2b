"""The hidden-state store: shards, index, meta, streamed safetensors files."""
