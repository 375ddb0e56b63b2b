"""Draft kinds: the Protocol every kind implements, the registry the core asks, EAGLE-3 registered built in."""
