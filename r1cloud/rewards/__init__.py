"""Rewards: the process pool that runs reward functions (pool), remote reward endpoints (remote),
the score shape both share (scores), and the answer grading the bundled reward functions use
(grading)."""
