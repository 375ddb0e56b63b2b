"""Feeding the trainer: batches from a store or online, packed without padding, read ahead."""
