"""Acceptance length: measured by speculative decoding against the target, and simulated on stored states."""
