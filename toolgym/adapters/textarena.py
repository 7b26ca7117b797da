"""TextArena's games as episodes, played unchanged and scored by the games themselves.

[TextArena](https://pypi.org/project/textarena/) (`pip install textarena`, which TRL's Wordle
examples use) ships about a hundred text games behind one interface: `ta.make(id)`,
`reset(num_players, seed)`, `get_observation()`, `step(action)` and `close()`, whose rewards
are the game's own. Each game is registered as `textarena/<id>` (`textarena/GuessTheNumber-v0`)
the first time such an id is asked for or ids are listed:

    env = toolgym.make("textarena/GuessTheNumber-v0")
    rows = toolgym.spec("textarena/GuessTheNumber-v0").dataset(8, split="test")

    toolgym eval textarena/GuessTheNumber-v0 --model smollm2-135m -n 8

- **The episode**: `reset(game_seed=...)` starts the game (the row's `game_seed`, else one
  from the episode's rng) and returns what the game tells the model's player (its prompt: the rules
  and the board). Each answer is the move, as TextArena's own agents play: the game steps
  with the answer's whole text and the user's next message is what the game said since
  (`user_turn`); when the game ends the episode ends.
- **With a tool** (`as_tool=True`, or `TextArenaMoves`): the move is the tool call
  `move(action)`, whose result is what the game said; the episode ends with the game.
- **The reward** is TextArena's own for the model's player when the game ends (`close()`:
  1 for a win, the game's share of progress for an invalid move or a lost game, ...). A game
  left unfinished (the turn limit) scores 0. `episode_metrics` gives `invalid_move` and
  `game_turns`; `outcome` keeps the game's reason.
- **Other players**: a game for several players needs `opponent`, a callable that takes the
  other player's observation text and returns its move (TextArena's agents are such
  callables), and `num_players`.
- **No download at run time**: a game whose module fetches NLTK data it lacks (Wordle,
  Hangman, ...) is refused with `MissingGameData`, naming the data to install beforehand
  (`python -m nltk.downloader words`); TextArena would otherwise reach the network.

The environment runs in this process (TextArena's games are plain Python); they are not
placed in a sandbox by this module.
"""

from __future__ import annotations

import contextlib
import functools
import re
import threading
from collections.abc import Callable, Iterator
from typing import Any

from toolgym.envs.core import Environment

SPLIT_SEEDS = 2**31
"""The test split's game seeds start here; the training split's are below it."""
WRAPPER_SUFFIXES = ("-raw", "-train")
"""TextArena registers each game again under these suffixes with other observation wrappers;
toolgym formats observations itself, so only the plain ids are registered."""
GAME_ID = -1
"""TextArena's sender id of the game's own messages."""

Opponent = Callable[[str], str]
"""Another player: its observation text in, its move out."""


class MissingGameData(LookupError):
    """A TextArena game needs data (NLTK's corpora) that is not installed; toolgym does not let
    it download at run time."""


class TextArenaGame(Environment):
    """One TextArena game; each answer of the model is its move (see the module docstring).

    Args:
        game: TextArena's id (`textarena.envs.registration.ENV_REGISTRY`), e.g.
            "GuessTheNumber-v0".
        num_players: Players of the game; the model plays `player`, `opponent` the others.
        player: The model's player id.
        opponent: Moves of the other players (their observation text -> the move); needed
            when `num_players > 1`.
        max_turns: Assistant turns before the episode is cut (an unfinished game scores 0).
        **game_kwargs: The game's own arguments, over its registered ones.
    """

    def __init__(
        self,
        game: str = "GuessTheNumber-v0",
        num_players: int = 1,
        player: int = 0,
        opponent: Opponent | None = None,
        max_turns: int = 32,
        **game_kwargs: Any,
    ) -> None:
        if num_players > 1 and opponent is None:
            raise ValueError(
                f"TextArena's {game} with {num_players} players: give `opponent`, a callable "
                "from the other player's observation text to its move"
            )
        self.game = game
        self.num_players = num_players
        self.player = player
        self.opponent = opponent
        self.max_turns = max_turns
        self.game_kwargs = game_kwargs
        self.arena: Any = None
        self.over = False
        self.rewards: dict[int, float] = {}
        self.outcome: dict[str, Any] = {}
        """The game's own account of the end for the model's player (`reason`, ...)."""

    def reset(self, game_seed: int | None = None, **row: Any) -> str:
        """Start the game with the row's `game_seed` (else one drawn from the episode's rng);
        returns what the game tells the model's player first."""
        self.arena = make_game(self.game, **self.game_kwargs)
        if game_seed is None:
            game_seed = self.rng.randrange(SPLIT_SEEDS)
        try:
            self.arena.reset(num_players=self.num_players, seed=int(game_seed))
        except AssertionError as error:  # TextArena checks the player count so
            raise ValueError(
                f"TextArena's {self.game}: {error} (a game for several players takes "
                "`num_players` and `opponent`)"
            ) from error
        self.over, self.rewards, self.outcome = False, {}, {}
        self.reward, self.done = 0.0, False
        self._others_move()
        return self._news()

    def user_turn(self, answer: str) -> str | None:
        """Play `answer` as the move; what the game said since, or None when it is over."""
        if self.over:
            return None
        self._play(answer)
        return None if self.over else self._news()

    def final_answer(self, text: str) -> None:
        """The last answer is a move too, where `user_turn` did not already play it."""
        if not self.over and self.arena is not None:
            self._play(text)

    def get_reward(self) -> float:
        """The game's reward for the model's player once it is over; 0 before."""
        return float(self.rewards.get(self.player, 0.0)) if self.over else 0.0

    def episode_metrics(self) -> dict[str, float]:
        """`invalid_move` (the game ended on an invalid move of the model's player) and
        `game_turns` (the game's turn count)."""
        return {
            "invalid_move": float(bool(self.outcome.get("invalid_move", False))),
            "game_turns": float(self.outcome.get("turn_count", 0)),
        }

    def _play(self, action: str) -> None:
        done, _ = self.arena.step(action)
        if not done:
            done = self._others_move()
        if done:
            self._close()

    def _others_move(self) -> bool:
        """Let the other players move until it is the model's turn; whether the game ended."""
        done = False
        while not done and self.arena.state.current_player_id != self.player:
            if self.opponent is None:
                raise ValueError(f"TextArena's {self.game} awaits another player: no opponent")
            player, observation = self.arena.get_observation()
            done, _ = self.arena.step(self.opponent(observation_text(observation, player)))
        if done:
            self._close()
        return done

    def _close(self) -> None:
        rewards, info = self.arena.close()
        self.rewards = {int(k): float(v) for k, v in (rewards or {}).items()}
        self.outcome = dict((info or {}).get(self.player, {}))
        self.over = self.done = True
        self.reward = self.get_reward()

    def _news(self) -> str:
        player, observation = self.arena.get_observation()
        return observation_text(observation, player)


class TextArenaMoves(TextArenaGame):
    """A TextArena game whose moves are the tool call `move(action)` (for tool-calling
    models); answering without a move ends the episode (an unfinished game scores 0)."""

    def move(self, action: str) -> str:
        """Make your move in the game.

        Args:
            action: The move as the game's rules ask for it (e.g. "[5]").
        """
        if self.over:
            return "The game is over."
        self._play(action)
        news = "" if self.over else self._news()
        end = f"The game is over: {self.outcome.get('reason', '')}".strip() if self.over else ""
        return "\n".join(part for part in (news, end) if part)

    def user_turn(self, answer: str) -> str | None:
        return None

    def final_answer(self, text: str) -> None:
        return None


def observation_text(observation: Any, player: int) -> str:
    """A TextArena observation as one text: a wrapped game's string as it is, a raw game's
    messages (sender, text, kind) one per line, the player's own moves left out (the
    conversation holds them)."""
    if isinstance(observation, str):
        return observation
    lines = []
    for sender, message, kind in observation:
        if sender == player and getattr(kind, "name", "") == "PLAYER_ACTION":
            continue
        lines.append(message if sender in (GAME_ID, player) else f"[Player {sender}] {message}")
    return "\n".join(lines)


_NLTK_GUARD = threading.Lock()


@contextlib.contextmanager
def _no_downloads(game: str) -> Iterator[None]:
    """NLTK's downloader refuses while a game is made (TextArena's word games download their
    corpora when their module is first imported)."""
    try:
        import nltk
    except ImportError:
        yield
        return

    def refuse(info_or_id: Any = None, *args: Any, **kwargs: Any) -> bool:
        raise MissingGameData(
            f"TextArena's {game} needs NLTK's {info_or_id!r} data, which is not installed; "
            f"toolgym does not download at run time: install it beforehand "
            f"(python -m nltk.downloader {info_or_id})"
        )

    with _NLTK_GUARD:
        original, nltk.download = nltk.download, refuse
        try:
            yield
        finally:
            nltk.download = original


def make_game(game: str, **kwargs: Any) -> Any:
    """TextArena's game `game` without its observation wrappers (its `-raw` variant where
    registered); `MissingGameData` where it lacks data it would download."""
    registry = textarena_registry()
    if game not in registry:
        raise ValueError(f"TextArena has no game {game!r} (textarena {_version()})")
    import textarena

    raw = f"{game}-raw" if f"{game}-raw" in registry else game
    try:
        with _no_downloads(game):
            return textarena.make(raw, **kwargs)
    except LookupError as error:  # NLTK's "Resource ... not found", or MissingGameData
        if isinstance(error, MissingGameData):
            raise
        raise MissingGameData(f"TextArena's {game} lacks data: {error}") from error


def textarena_registry() -> dict[str, Any]:
    """TextArena's registered games by id (a clear error naming the install without it)."""
    try:
        from textarena.envs.registration import ENV_REGISTRY
    except ImportError as error:
        raise ImportError(
            "TextArena's games need the textarena package: pip install textarena"
        ) from error
    return dict(ENV_REGISTRY)


def _version() -> str:
    import importlib.metadata

    return importlib.metadata.version("textarena")


def textarena_dataset(
    n: int, seed: int = 0, game: str = "GuessTheNumber-v0", split: str = "train", **_: Any
) -> list[dict[str, Any]]:
    """`n` rows of a game: an empty `prompt` (the game's first message opens the episode) and
    the game's seed, `game_seed`; `split="test"` draws them from a range the training split
    never uses."""
    if split not in ("train", "test"):
        raise ValueError(f"split must be 'train' or 'test', not {split!r}")
    if seed < 0 or seed + n > SPLIT_SEEDS:
        raise ValueError(f"need 0 <= seed and seed + n <= 2**31, got seed={seed}, n={n}")
    start = seed + (SPLIT_SEEDS if split == "test" else 0)
    return [{"prompt": [], "game_seed": start + i} for i in range(n)]


def textarena_environment(game: str, as_tool: bool = False, **kwargs: Any) -> TextArenaGame:
    """The environment of TextArena's `game` (the entry point of the registered ids): each
    answer is the move (`TextArenaGame`), or with `as_tool` the tool call `move(action)`
    (`TextArenaMoves`); `kwargs` as `TextArenaGame` takes them."""
    return (TextArenaMoves if as_tool else TextArenaGame)(game, **kwargs)


def game_ids() -> list[str]:
    """TextArena's game ids that are registered: each game once (not its wrapper variants),
    where the id is one toolgym's registry takes (letters, digits, '_', '-', '.'; a few
    TextArena ids hold a '/': `TextArenaGame(game=...)` plays them)."""
    return sorted(
        k
        for k in textarena_registry()
        if not k.endswith(WRAPPER_SUFFIXES) and re.fullmatch(r"[\w.-]+", k)
    )


def register_games(register: Callable[..., Any]) -> None:
    """Register `textarena/<id>` for every game with `register` (the registry calls this
    while no such id is registered); ImportError, naming the install, without textarena."""
    for game in game_ids():
        register(
            f"textarena/{game}",
            textarena_environment,
            dataset=functools.partial(textarena_dataset, game=game),
            description=f"TextArena's {game}: each answer is the move, the game's reward",
            game=game,
        )
