"""TextArena's single-player games as lmrl environments (`pip install 'lmrl[textarena]'`).

    from lmrl.envs.textarena import factory

    make_env = factory("GuessTheNumber-v0")      # or factory("GuessTheNumber-v0", max_number=10)
    env = make_env()
    observation, info = env.reset(seed=3)        # the game's opening prompt as text, {"seed": 3}
    observation, reward, terminated, truncated, info = env.step("[10]")
    # "The target number is lower.", 0.0, False, False, {"invalid_move": False}

One `reset(seed)` makes a fresh game (`textarena.make(env_id, **kwargs)`; keyword arguments override the
registered variant's settings, e.g. `max_turns`, `min_number`/`max_number`) and resets it for one player with
that seed. `step(action)` plays the action; the observation is the text of the game's messages since the last
turn (the game's own echo of the action left out), because lmrl keeps the conversation itself: TextArena's
observation wrappers re-render the whole game every turn, which would repeat it in the chat. Its action
wrappers (e.g. adding the missing `[...]` around a move) still apply.

The reward is 0 on every turn but the last, where it is the player's reward from TextArena (1 for a win;
many games give a loss partial credit, e.g. GuessTheNumber's closeness of the last guess, or -1); the last
turn's `info["success"]` says whether the game was won (a reward of 1).
`terminated` when the game is over (won, lost, its turn limit reached, or an invalid move too many);
`truncated` is always False. An invalid move is handled by TextArena: the player gets one more try (with a
message saying why) or, after that, loses; `info["invalid_move"]` says which turns were refused, and the last
turn's info has the game's `reason`.

TextArena seeds Python's global `random` with the seed and draws from it during play (mines, new tiles,
shuffles); each environment here keeps a generator state of its own and swaps it in around each call, under
one lock for the process (threads play games side by side: `env.workers`), so an episode depends only on its
seed however episodes interleave, and the caller's `random` is left as it was.
"""

from __future__ import annotations

import functools
import math
import random
import threading
from contextlib import contextmanager
from typing import Callable

# Played offline here (textarena 0.7.4, Python 3.11, network unreachable): made, reset and deterministic by
# seed, invalid moves and scripted or random play to the end give finite rewards. Left out: games needing a
# download (Hangman, Wordle, WordLadder, WordSearch: NLTK corpora) or an LLM judge (TwentyQuestions,
# GuessWho: OpenRouter), Klondike (its module is a syntax error before Python 3.12), Bandit (a wrong final
# pick is rewarded with its regret, so a worse pick earns more). Sokoban-v0-medium and Sudoku-v0-hard build
# their puzzle by trial, so a reset can take seconds (0.4 to 16 s for seeds 0-7 here).
SINGLE_PLAYER_GAMES = (
    "2048-v0-ultra-easy", "2048-v0-mega-easy", "2048-v0-super-easy", "2048-v0-very-easy", "2048-v0-easy",
    "2048-v0", "2048-v0-hard", "2048-v0-very-hard", "2048-v0-extreme",
    "2048-v0-3x3", "2048-v0-5x5", "2048-v0-6x6", "2048-v0-8x8", "2048-v0-10x10",
    "Blackjack-v0", "Blackjack-v0-long",
    "Countdown-v0",
    "Crosswords-v0", "Crosswords-v0-hardcore",
    "Cryptarithm-v0",
    "FifteenPuzzle-v0",
    "FrozenLake-v0", "FrozenLake-v0-random", "FrozenLake-v0-hardcore",
    "GuessTheNumber-v0", "GuessTheNumber-v0-hardcore",
    "LightsOut-v0",
    "LogicPuzzle-v0", "LogicPuzzle-v0-hard",
    "Mastermind-v0", "Mastermind-v0-hard", "Mastermind-v0-extreme",
    "Minesweeper-v0", "Minesweeper-v0-small", "Minesweeper-v0-medium", "Minesweeper-v0-hard",
    "PegJump-v0",
    "RushHour-v0",
    "Secretary-v0", "Secretary-v0-long",
    "Set-v0",
    "Slitherlink-v0",
    "Sokoban-v0", "Sokoban-v0-medium",
    "Sudoku-v0-very-easy", "Sudoku-v0-easy", "Sudoku-v0", "Sudoku-v0-medium", "Sudoku-v0-hard",
    "ThreeCardMonte-v0",
    "TowerOfHanoi-v0", "TowerOfHanoi-v0-medium", "TowerOfHanoi-v0-hard", "TowerOfHanoi-v0-hardcore",
    "TowerOfHanoi-v0-extreme",
)

# TextArena registers each game again with other default wrappers under these suffixes; the game is the
# same, and this adapter reads the game's messages itself.
_VARIANT_SUFFIXES = ("-train", "-raw")


def _game_of(env_id: str) -> str | None:
    """The verified game `env_id` names (itself, or with a wrapper suffix), else None."""
    if env_id in SINGLE_PLAYER_GAMES:
        return env_id
    for suffix in _VARIANT_SUFFIXES:
        if env_id.endswith(suffix) and env_id[: -len(suffix)] in SINGLE_PLAYER_GAMES:
            return env_id[: -len(suffix)]
    return None


def _import_textarena():
    try:
        import textarena
    except ImportError:
        raise ImportError("TextArena environments need the textarena package: pip install 'lmrl[textarena]'") from None
    return textarena


def factory(env_id: str, **kwargs) -> Callable[[], "TextArenaEnv"]:
    """A zero-argument callable making `TextArenaEnv(env_id, kwargs)`: `env_id` is one of
    `SINGLE_PLAYER_GAMES` (or one with TextArena's "-train"/"-raw" suffix), `kwargs` override the game's
    registered settings (e.g. `max_turns=5`)."""
    if not isinstance(env_id, str) or _game_of(env_id) is None:
        raise ValueError(f"textarena:{env_id}: not a single-player TextArena game lmrl has verified; known: "
                         f"{', '.join(SINGLE_PLAYER_GAMES)}")
    textarena = _import_textarena()
    # Build one game now so that a misspelt setting fails here, not in the middle of a rollout.
    try:
        textarena.make(env_id, **kwargs)
    except TypeError as error:
        raise ValueError(f"textarena:{env_id}: settings {kwargs} refused: {error}") from None
    # A partial of the class (not a closure) so the factory pickles into rollout workers.
    return functools.partial(TextArenaEnv, env_id, kwargs)


# Held while a game runs with its own state of the process-global `random` (`TextArenaEnv._episode_random`).
_RANDOM_LOCK = threading.Lock()


class TextArenaEnv:
    """One TextArena single-player game behind lmrl's environment protocol (see the module docstring)."""

    def __init__(self, env_id: str, game_kwargs: dict | None = None):
        if not isinstance(env_id, str) or _game_of(env_id) is None:
            raise ValueError(f"textarena:{env_id}: not a single-player TextArena game lmrl has verified; known: "
                             f"{', '.join(SINGLE_PLAYER_GAMES)}")
        self.env_id = env_id
        self.name = f"textarena:{env_id}"
        self._textarena = _import_textarena()
        self._kwargs = dict(game_kwargs or {})
        self._game = None          # the made game, with its registered wrappers
        self._core = None          # the game under its wrappers: its state and raw messages
        self._ended = True
        self._random_state = None  # this episode's state of Python's global `random`

    @contextmanager
    def _episode_random(self):
        """Runs the block with this episode's `random` state in place of the caller's, then swaps back;
        one game's block at a time in the process, so no other game draws from this state meanwhile."""
        with _RANDOM_LOCK:
            outer = random.getstate()
            if self._random_state is not None:
                random.setstate(self._random_state)
            try:
                yield
            finally:
                self._random_state = random.getstate()
                random.setstate(outer)

    def reset(self, seed: int | None = None):
        """A fresh game for one player, reset with `seed` (a random one when None): (opening text, info)."""
        self.close()
        if seed is None:
            # Drawn from the OS rather than `random`, which TextArena itself reseeds.
            seed = random.SystemRandom().randrange(2**32)
        elif isinstance(seed, bool) or not isinstance(seed, int):
            raise ValueError(f"environment {self.name}: seed {seed!r} is not an integer")
        game = self._textarena.make(self.env_id, **self._kwargs)
        core = game
        while isinstance(core, self._textarena.Wrapper):
            core = core.env
        self._random_state = None
        with self._episode_random():
            game.reset(num_players=1, seed=seed)
        self._game, self._core, self._ended = game, core, False
        return self._new_messages(), {"seed": seed}

    def _new_messages(self) -> str:
        """The text of the messages sent to the player since the last call, less the player's own moves."""
        _, messages = self._core.get_observation()
        parts = []
        for _, text, kind in messages:
            # The echo of the move (some games send it as from the player, some as from the game): the
            # model already has it as its own turn.
            if kind == self._textarena.ObservationType.PLAYER_ACTION:
                continue
            text = str(text).strip()
            if text:
                parts.append(text)
        return "\n\n".join(parts)

    def step(self, action: str):
        """Plays `action`: (observation, reward, terminated, truncated, info), the reward only at the end."""
        if self._game is None:
            raise RuntimeError(f"environment {self.name}: step() before reset()")
        if self._ended:
            raise RuntimeError(f"environment {self.name}: step() after the game ended; call reset() first")
        if not isinstance(action, str):
            raise TypeError(f"environment {self.name}: action {action!r} ({type(action).__name__}) is not text")
        with self._episode_random():
            done, step_info = self._game.step(action)
        observation = self._new_messages()
        info = dict(step_info) if isinstance(step_info, dict) else {}
        state = self._core.state
        if not done:
            # SinglePlayerState counts refused moves since the last valid one: nonzero means another try.
            info["invalid_move"] = bool(getattr(state, "error_count", 0))
            return observation, 0.0, False, False, info
        with self._episode_random():
            rewards, game_info = self._game.close()
        self._ended = True
        player = (game_info or {}).get(0, {})
        raw = (rewards or {}).get(0)
        info.update(invalid_move=bool(player.get("invalid_move", False)), reason=player.get("reason"),
                    turn_count=player.get("turn_count"))
        if isinstance(raw, (int, float)) and not isinstance(raw, bool) and math.isfinite(raw):
            reward = float(raw)
        else:
            # Countdown, Cryptarithm, Slitherlink and ThreeCardMonte pass their reason where the reward goes
            # when a second invalid move ends the game: a loss, counted 0 with the value kept for the log.
            reward = 0.0
            info["textarena_reward"] = raw
        info["success"] = reward >= 1.0  # a win; many games pay a loss partial credit below 1
        reason = player.get("reason")
        if isinstance(reason, str) and reason and reason not in observation:
            observation = f"{observation}\n\n{reason}" if observation else reason
        return observation, reward, True, False, info

    def close(self) -> None:
        """Ends the game in play, if any (TextArena's close only reports; it holds nothing open)."""
        if self._game is not None and not self._ended:
            with self._episode_random():
                self._game.close()
        self._ended = True
