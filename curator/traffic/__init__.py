"""The target's traffic: reading request logs, profiling them, and the features curation matches on."""
