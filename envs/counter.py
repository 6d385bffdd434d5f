"""A counter to reach, written for TRL's `GRPOTrainer(environment_factory=Counter)` (the shape of
TRL's own example): `reset(**row)` gives the task, the public method is the tool, `get_reward()`
scores the episode. It runs in r1cloud unchanged."""


class Counter:
    def reset(self, target, **row) -> str | None:
        self.counter, self.target = 0, int(target)
        return f" Use the tool to bring the counter from 0 to {self.target}."

    def get_reward(self) -> float:
        return float(self.counter == self.target)

    def increment(self, step: int) -> int:
        """Add to the counter.

        Args:
            step: How much to add.
        """
        self.counter += step
        return self.counter
