"""Scouting the Hub for prompt datasets: briefs, agent tools, the catalog writer, the rules
planner and the proposal that merges what the agents found into a recipe."""
