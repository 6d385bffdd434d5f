"""Guess the number, gym-shaped: `reset(**row)` reads the row's secret, `step(action)` reads the
model's whole turn and answers higher or lower. Reward: 1 for the right number, minus 0.1 for each
wrong guess. Written without r1cloud: any gym-style text environment has this shape."""

import re


class GuessNumber:
    def reset(self, secret, low=1, high=100, **row):
        self.secret, self.guesses = int(secret), 0
        return f" The number is between {low} and {high}."

    def step(self, action: str):
        said = re.findall(r"-?\d+", action)
        if not said:
            return "Say one number.", -0.1, False
        guess = int(said[-1])
        if guess == self.secret:
            return "Right!", 1.0, True
        return ("Higher." if guess < self.secret else "Lower."), -0.1, False
