"""Classes written for TRL's `environment_factory` (and `Environment` subclasses) run as TRL
runs them: the shapes of TRL's own tests, docs, examples and experimental adapters (issue 25
item 3, and the seed defect)."""

from __future__ import annotations

import toolgym


# -- the seed: a `super().reset(...)` chain keeps it --------------------------------------------
class Board(toolgym.Environment):
    def reset(self, target: int = 0) -> str:
        self.target = target
        self.start = self.rng.randint(0, 10**9)
        return f"start {self.start}"

    def move(self) -> str:
        """Move once."""
        return str(self.rng.randint(0, 10**9))


class HardBoard(Board):
    def reset(self, level: int = 1) -> str:
        return super().reset(target=level * 10)


class HarderBoard(HardBoard):
    def reset(self, **row) -> str:
        observation = super().reset(level=3)
        self.extra = self.rng.random()
        return observation


def test_a_super_reset_chain_keeps_the_seed():
    for cls in (HardBoard, HarderBoard):
        first, second = cls(), cls()
        assert first.reset(seed=0) == second.reset(seed=0)
        assert first.target == second.target == (30 if cls is HarderBoard else 10)
        assert first.step(toolgym.ToolCall("move")).messages == second.step(
            toolgym.ToolCall("move")
        ).messages
        assert first.reset(seed=1) != first.reset(seed=2)  # the seed still reaches it
        assert cls().reset(seed=5) == cls().reset(seed=5)


def test_a_seed_passed_to_super_reset_reseeds():
    class Fixed(Board):
        def reset(self) -> str:
            return super().reset(seed=7)

    assert Fixed().reset(seed=0) == Fixed().reset(seed=1) == Board().reset(seed=7)
