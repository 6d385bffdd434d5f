"""Multi-turn episodes: tools, their call formats, and the episode loop on a rollout engine."""
