"""Capturing the target's hidden states: with transformers into a store, online beside the draft, and the disk bill before it."""
