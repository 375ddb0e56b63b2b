"""Files every stage writes and reads: atomic writes, stale temporaries, one writer per folder, disk-full errors, safe YAML, storable text."""
