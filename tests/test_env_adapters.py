"""lmrl.envs.textarena and lmrl.envs.skyrl against the real textarena and skyrl-gym packages: the
observations the protocol allows, episodes fixed by their seed, scripted wins rewarded, bad moves and
answers played rather than raised, and one-line errors naming the environment."""

from __future__ import annotations

import json
import random
import re
import sys
import threading
from pathlib import Path

import pytest

from lmrl.common.data import DataError
from lmrl.envs import skyrl, textarena
from lmrl.envs.protocol import as_reset, as_step, check_env

# -- TextArena ---------------------------------------------------------------------------------------------


def play(env, actions):
    """Steps `actions` until the game ends: the list of (observation, reward, terminated, truncated, info)."""
    steps = []
    for action in actions:
        steps.append(as_step(env.step(action), env.name))
        if steps[-1][2]:
            break
    return steps


def binary_search(env, low=1, high=20):
    """Plays GuessTheNumber by halving the range on each hint: the steps played."""
    steps = []
    while not steps or not steps[-1][2]:
        guess = (low + high) // 2
        steps.append(as_step(env.step(f"[{guess}]"), env.name))
        if "higher" in steps[-1][0]:
            low = guess + 1
        elif "lower" in steps[-1][0]:
            high = guess - 1
    return steps


def test_reset_returns_the_opening_text_and_the_same_seed_the_same_game():
    env = textarena.factory("FrozenLake-v0")()
    assert env.name == "textarena:FrozenLake-v0"
    first, info = as_reset(env.reset(seed=0), env.name)
    assert isinstance(first, str) and "Frozen Lake" in first and info["seed"] == 0
    assert as_reset(env.reset(seed=0), env.name)[0] == first
    assert as_reset(env.reset(seed=1), env.name)[0] != first  # another lake


def test_binary_search_wins_guess_the_number_and_the_seed_fixes_the_secret():
    env = textarena.factory("GuessTheNumber-v0")()
    games = {}
    for seed in (0, 1, 0):
        opening, _ = as_reset(env.reset(seed=seed), env.name)
        assert "between 1 and 20" in opening
        steps = binary_search(env)
        *middle, (last, reward, terminated, truncated, info) = steps
        assert all(r == 0.0 and not t for _, r, t, _, _ in middle)
        assert reward == 1.0 and terminated and not truncated and "Congratulations" in info["reason"]
        assert info["success"]
        games.setdefault(seed, []).append([s[0] for s in steps])
    assert games[0][0] == games[0][1] and games[0][0] != games[1][0]


def test_tower_of_hanoi_solved_in_seven_moves_wins():
    env = textarena.factory("TowerOfHanoi-v0")()
    opening, _ = as_reset(env.reset(seed=0), env.name)
    assert "A: [3, 2, 1]" in opening
    steps = play(env, ["[A C]", "[A B]", "[C B]", "[A C]", "[B A]", "[B C]", "[A C]"])
    assert len(steps) == 7 and steps[-1][1] == 1.0 and steps[-1][2]
    assert "[A C]" not in steps[0][0] and "moved disk 1 from A to C" in steps[0][0]  # no echo of the move


def test_three_card_monte_tracked_from_the_shuffles_wins():
    env = textarena.factory("ThreeCardMonte-v0")()
    for seed in range(3):
        opening, _ = as_reset(env.reset(seed=seed), env.name)
        ball = re.search(r"Ball starts: (.*)", opening).group(1).split().index("[X]")
        for i, j in re.findall(r"swapped cups (\d+) and (\d+)", opening):
            i, j = int(i), int(j)
            ball = j if ball == i else i if ball == j else ball
        [(_, reward, terminated, _, info)] = play(env, [str(ball)])  # TextArena adds the brackets
        assert reward == 1.0 and terminated and not info["invalid_move"]


def test_an_invalid_move_gets_another_try_then_ends_the_game():
    env = textarena.factory("GuessTheNumber-v0")()
    env.reset(seed=3)
    observation, reward, terminated, truncated, info = as_step(env.step("I think it is eleven"), env.name)
    assert isinstance(observation, str) and "invalid move" in observation
    assert (reward, terminated, truncated, info["invalid_move"]) == (0.0, False, False, True)
    observation, reward, terminated, _, info = as_step(env.step("[11]"), env.name)  # a valid move clears it
    assert not info["invalid_move"] and not terminated
    as_step(env.step("[11]"), env.name)  # guessed before: refused once
    observation, reward, terminated, _, info = as_step(env.step("no idea"), env.name)
    assert terminated and info["invalid_move"] and info["reason"].startswith("Invalid Move")
    assert 0.0 <= reward < 1.0 and not info["success"]  # GuessTheNumber's partial credit for the last guess
    with pytest.raises(RuntimeError, match=r"textarena:GuessTheNumber-v0: step\(\) after the game ended"):
        env.step("[5]")


def test_a_reward_textarena_sends_as_text_counts_zero():
    # ThreeCardMonte passes its reason where the reward goes when a second invalid move ends the game.
    env = textarena.factory("ThreeCardMonte-v0")()
    env.reset(seed=0)
    *_, (_, reward, terminated, _, info) = play(env, ["left cup", "the middle one"])
    assert reward == 0.0 and terminated and isinstance(info["textarena_reward"], str)


def test_episodes_depend_on_their_seed_alone_and_leave_the_callers_random_alone():
    # Minesweeper lays its mines at the first reveal, from Python's global `random`.
    def board(env, seed):
        env.reset(seed=seed)
        return as_step(env.step("[2 2]"), env.name)[0]

    make = textarena.factory("Minesweeper-v0-small")
    alone = board(make(), 5)
    a, b = make(), make()
    a.reset(seed=5)
    b.reset(seed=9)
    random.seed(123)
    before = random.getstate()
    b.step("[0 0]")
    interleaved = as_step(a.step("[2 2]"), a.name)[0]
    assert interleaved == alone
    assert random.getstate() == before


def test_games_in_threads_draw_from_their_own_random_state_however_the_threads_switch():
    # Two games' calls overlap in time (env.workers runs them in threads), the second starting before the first
    # ends and drawing after it ended: each must still draw from its own state, not the other's or the caller's.
    games = [textarena.factory("Minesweeper-v0-small")() for _ in range(2)]
    first_in, second_in, first_out, draws = threading.Event(), threading.Event(), threading.Event(), {}

    def first():
        with games[0]._episode_random():
            one = random.random()
            first_in.set()
            second_in.wait(0.5)  # the second game's call starts meanwhile, if it may
            draws[0] = (one, random.random())
        first_out.set()

    for game, seed in zip(games, (1, 2)):
        game._random_state = random.Random(seed).getstate()
    thread = threading.Thread(target=first)
    thread.start()
    first_in.wait(5)
    with games[1]._episode_random():
        second_in.set()
        first_out.wait(0.5)  # the first game's call ends meanwhile
        draws[1] = (random.random(), random.random())
    thread.join()
    expect = [random.Random(seed) for seed in (1, 2)]
    assert draws == {k: (r.random(), r.random()) for k, r in enumerate(expect)}


def test_settings_override_the_registered_variant_and_wrapper_suffixes_name_the_same_game():
    env = textarena.factory("GuessTheNumber-v0", max_number=5, max_turns=3)()
    assert "between 1 and 5 within 3 turns" in env.reset(seed=0)[0]
    assert textarena.factory("GuessTheNumber-v0-train")().reset(seed=0)[0] == \
        textarena.factory("GuessTheNumber-v0")().reset(seed=0)[0]
    with pytest.raises(ValueError, match=r"^textarena:GuessTheNumber-v0: settings .*max_numbr"):
        textarena.factory("GuessTheNumber-v0", max_numbr=5)


@pytest.mark.parametrize("game", textarena.SINGLE_PLAYER_GAMES)
def test_every_verified_game_passes_check_env_with_garbage_moves(game):
    env = textarena.factory(game)()
    # Seed 7: Sokoban-v0-medium and Sudoku-v0-hard generate their puzzle at once for it (others take seconds).
    check_env(env, action="!! not a move !!", seed=7, max_steps=3)
    env.reset(seed=7)
    observation, reward, terminated, truncated, info = as_step(env.step("hello"), env.name)
    assert isinstance(info["invalid_move"], bool) and not truncated


def test_unknown_or_multiplayer_games_are_refused_in_one_line_listing_the_verified_ones():
    for game in ("Chess-v0", "Wordle-v0", "GuessTheNumber-v9"):
        with pytest.raises(ValueError) as error:
            textarena.factory(game)
        message = str(error.value)
        assert "\n" not in message and message.startswith(f"textarena:{game}: ")
        assert "GuessTheNumber-v0, GuessTheNumber-v0-hardcore" in message


def test_step_before_reset_is_an_error_naming_the_game():
    with pytest.raises(RuntimeError, match=r"^environment textarena:Sudoku-v0-easy: step\(\) before reset\(\)"):
        textarena.factory("Sudoku-v0-easy")().step("[1 1 1]")


# -- skyrl-gym ---------------------------------------------------------------------------------------------

# The first rows of GSM8K's train.jsonl (openai/grade-school-math, MIT License).
GSM8K_ROWS = [
    {"question": "Natalia sold clips to 48 of her friends in April, and then she sold half as many clips in May. "
                 "How many clips did Natalia sell altogether in April and May?",
     "answer": "Natalia sold 48/2 = <<48/2=24>>24 clips in May.\nNatalia sold 48+24 = <<48+24=72>>72 clips "
               "altogether in April and May.\n#### 72"},
    {"question": "Weng earns $12 an hour for babysitting. Yesterday, she just did 50 minutes of babysitting. "
                 "How much did she earn?",
     "answer": "Weng earns 12/60 = $<<12/60=0.2>>0.2 per minute.\nWorking 50 minutes, she earned 0.2 x 50 = "
               "$<<0.2*50=10>>10.\n#### 10"},
]
SOLUTION = "In May she sold 48 / 2 = 24, so 48 + 24 = 72 in all.\n#### 72"
REAL_GSM8K = Path(__file__).resolve().parents[2] / "shared" / "data" / "gsm8k" / "test.jsonl"


def write_rows(path: Path, rows) -> Path:
    path.write_text("".join(json.dumps(row) + "\n" for row in rows))
    return path


def test_gsm8k_reset_opens_with_the_question_and_the_seed_picks_the_row(tmp_path):
    env = skyrl.factory("gsm8k", data_file=write_rows(tmp_path / "train.jsonl", GSM8K_ROWS))()
    assert env.name == "skyrl:gsm8k"
    messages, info = as_reset(env.reset(seed=0), env.name)
    assert messages == [{"role": "user", "content": GSM8K_ROWS[0]["question"] + " " + skyrl.GSM8K_INSTRUCTION}]
    assert info["row"] == 0
    assert env.reset(seed=0)[0] == messages and env.reset(seed=2)[0] == messages  # seed % 2 rows
    assert env.reset(seed=1)[0] != messages and env.reset(seed=1)[1]["row"] == 1


def test_gsm8k_scores_the_right_number_after_hashes_one_and_anything_else_zero(tmp_path):
    make = skyrl.factory("gsm8k", rows=GSM8K_ROWS)
    env = make()
    env.reset(seed=0)
    assert as_step(env.step(SOLUTION), env.name) == ("", 1.0, True, False, {"success": True})
    for wrong in ("#### 73", "72", "The answer is seventy-two.", ""):
        env.reset(seed=0)
        observation, reward, terminated, truncated, info = as_step(env.step(wrong), env.name)
        assert (observation, reward, terminated, truncated, info["success"]) == ("", 0.0, True, False, False)
    with pytest.raises(RuntimeError, match=r"skyrl:gsm8k: step\(\) after the episode ended"):
        env.step(SOLUTION)
    check_env(make())


def test_gsm8k_multi_turn_answers_with_feedback_until_right(tmp_path):
    make = skyrl.factory("gsm8k_multi_turn", rows=GSM8K_ROWS, max_turns=3)
    env = make()
    env.reset(seed=1)
    observation, reward, terminated, _, _ = as_step(env.step("Let me think."), env.name)
    assert isinstance(observation, str) and "#### ANSWER" in observation and (reward, terminated) == (0.0, False)
    observation, reward, terminated, _, _ = as_step(env.step("#### 12"), env.name)
    assert 0.0 < reward < 1.0 and not terminated  # well formatted, wrong: a small format reward
    assert as_step(env.step("#### 10"), env.name)[1:3] == (1.0, True)
    check_env(make())


def test_skyrl_format_rows_from_jsonl_and_parquet_with_their_extras(tmp_path):
    rows = [{"data_source": "openai/gsm8k", "env_class": "gsm8k",
             "prompt": [{"role": "system", "content": "Be brief."}, {"role": "user", "content": "6 * 7?"}],
             "reward_spec": {"method": "rule", "ground_truth": "42"}, "extra_info": {"index": 0}}]
    import pyarrow
    import pyarrow.parquet

    pyarrow.parquet.write_table(pyarrow.Table.from_pylist(rows), tmp_path / "train.parquet")
    for path in (write_rows(tmp_path / "train.jsonl", rows), tmp_path / "train.parquet"):
        env = skyrl.factory("gsm8k", data_file=path)()
        messages, _ = env.reset(seed=7)
        assert [m["role"] for m in messages] == ["system", "user"]
        assert env.step("#### 42")[1] == 1.0


def test_aime_rows_score_one_or_minus_one():
    env = skyrl.factory("aime", rows=[{"prompt": "What is 2 + 2? End with 'Answer: X'.",
                                       "reward_model": {"ground_truth": "4"}}])()
    env.reset(seed=0)
    assert env.step("2 + 2 = 4.\nAnswer: 4")[1:3] == (1.0, True)
    env.reset(seed=0)
    assert env.step("Answer: 5")[1] == -1.0


def test_the_real_gsm8k_test_split_reads_whole():
    if not REAL_GSM8K.exists():
        pytest.skip(f"{REAL_GSM8K} is absent (the real data sets live in ../shared/data beside the repo)")
    env = skyrl.factory("gsm8k", data_file=REAL_GSM8K)()
    messages, info = env.reset(seed=1188)  # 1,319 rows, the last 131 held out: back to the first
    assert info["row"] == 0 and messages[0]["content"].startswith("Janet")
    assert env.step("#### 18")[1] == 1.0


def test_skyrl_errors_are_one_line_naming_the_environment(tmp_path):
    with pytest.raises(ValueError, match=r"^skyrl:gsm9k: no skyrl-gym environment .*known: aime, gsm8k, .*registers "
                                         r"with skyrl_gym.register exists once it is imported: name a factory of it "
                                         r"as env.id=package.module:make"):
        skyrl.factory("gsm9k", rows=GSM8K_ROWS)
    with pytest.raises(ValueError, match=r"^skyrl:gsm8k: give the problems as data_file="):
        skyrl.factory("gsm8k")
    with pytest.raises(DataError, match=r"^skyrl:gsm8k: rows\[1\]: the answer has no final '#### <number>'"):
        skyrl.factory("gsm8k", rows=[GSM8K_ROWS[0], {"question": "?", "answer": "no idea"}])
    with pytest.raises(DataError, match=r"rows\[0\] is for env_class 'aime', not 'gsm8k'"):
        skyrl.factory("gsm8k", rows=[{"prompt": "?", "env_class": "aime", "reward_spec": {"ground_truth": "1"}}])
    with pytest.raises(ValueError, match=r"^environment skyrl:gsm8k: building it for problem 0 failed: "
                                         r"AssertionError: reward_spec field is required$"):
        skyrl.factory("gsm8k", rows=[{"prompt": "?"}])
    with pytest.raises(ValueError, match=r"^skyrl:gsm8k: unknown setting 'data_fle'; the settings are data_file"):
        skyrl.factory("gsm8k", data_fle="train.jsonl")
    with pytest.raises(ValueError, match=r"^skyrl:gsm8k: data_file '.*missing\.jsonl' is not a file$"):
        skyrl.factory("gsm8k", data_file=tmp_path / "missing.jsonl")
    bad_row = write_rows(tmp_path / "rows.jsonl", [GSM8K_ROWS[0], {"question": "?"}])
    with pytest.raises(DataError, match=r"^skyrl:gsm8k: .*rows\.jsonl:2 has keys 'question'; a row is SkyRL's"):
        skyrl.factory("gsm8k", data_file=bad_row)
    (tmp_path / "bad.jsonl").write_text("{oops\n")
    with pytest.raises(DataError, match=r"bad\.jsonl:1: invalid JSON"):
        skyrl.factory("gsm8k", data_file=tmp_path / "bad.jsonl")


def test_a_missing_package_is_an_import_error_saying_what_to_install(monkeypatch):
    monkeypatch.setitem(sys.modules, "textarena", None)  # `import textarena` now raises ImportError
    monkeypatch.setitem(sys.modules, "skyrl_gym", None)
    with pytest.raises(ImportError, match=re.escape("pip install 'lmrl[textarena]'")):
        textarena.factory("GuessTheNumber-v0")
    with pytest.raises(ImportError, match=re.escape("pip install 'lmrl[skyrl]'")):
        skyrl.factory("gsm8k", rows=GSM8K_ROWS)


def test_held_out_seeds_play_held_out_problems_only():
    from lmrl.envs.protocol import HELDOUT_SEED

    rows = [{"question": f"What is {i} + 1?", "answer": f"#### {i + 1}"} for i in range(20)]
    make = skyrl.factory("gsm8k", rows=rows)  # no test rows: the last tenth (2 rows) is held out
    env = make()
    trained = {str(as_reset(env.reset(seed=s), env.name)[0]) for s in range(100)}
    held = {str(as_reset(env.reset(seed=HELDOUT_SEED + j), env.name)[0]) for j in range(10)}
    assert len(trained) == 18 and len(held) == 2 and not trained & held
    make = skyrl.factory("gsm8k", rows=rows, test_rows=[{"question": "What is 7 * 6?", "answer": "#### 42"}])
    messages, info = make().reset(seed=HELDOUT_SEED + 3)
    assert "7 * 6" in str(messages) and info["heldout"]
    with pytest.raises(ValueError, match="test_file= or test_rows=, not both"):
        skyrl.factory("gsm8k", rows=rows, test_rows=rows, test_file="x.jsonl")
