import pickle
import threading
import time
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path

import pytest

from lmrl.tasks import math_reward
from lmrl.tasks.math_reward import MathReward, RewardInfo, answer_candidates, parse_completion

HOSTILE = "10^{10^{10}}"  # parses at once, then sympy's comparison runs for minutes


def done(answer: str) -> str:
    return f"<think>Let me work it out.</think>\n<answer>{answer}</answer>"


@pytest.fixture(scope="module")
def reward():
    """One strict reward for the module: its worker process starts once (about 2 s)."""
    r = MathReward()
    yield r
    r.close()


# --- format ---------------------------------------------------------------------------------------

@pytest.mark.parametrize("text, expected", [
    ("<think>12+7</think><answer>19</answer>", (True, "19")),
    ("  <think>\n12 + 7 = 19\n</think>\n\n<answer>\n 19 \n</answer>\n  ", (True, "19")),
    ("<think></think><answer>19</answer>", (True, "19")),  # an empty think block is still the format
    ("<think>a</think><answer></answer>", (True, "")),
    ("<answer>19</answer>", (False, "19")),  # no think block
    ("<think>a</think> the answer is 19", (False, None)),  # no answer block
    ("<think>a</think><answer>19", (False, None)),  # never closed
    ("<think>a</think><answer>19</answer> because 12+7", (False, "19")),  # text after </answer>
    ("Sure! <think>a</think><answer>19</answer>", (False, "19")),  # text before <think>
    ("<answer>19</answer><think>a</think>", (False, "19")),  # wrong order
    ("<think>a</think><answer>3</answer><answer>4</answer>", (False, "4")),  # two blocks: the last one
    ("<think>a</think><answer><answer>4</answer></answer>", (False, "4")),  # nested
    ("<think>a <think>b</think></think><answer>4</answer>", (False, "4")),  # nested think
    ("<think>a</think><ANSWER>4</ANSWER>", (False, None)),  # tags are case-sensitive
])
def test_parse_completion(text, expected):
    assert parse_completion(text) == expected


@pytest.mark.parametrize("answer, expected", [
    ("19", ["19"]),
    ("3 or 4", ["3 or 4"]),
    ("The answer is $\\frac{1}{2}$.", ["\\frac{1}{2}"]),
    ("$\\boxed{\\frac{1}{2}}$", ["\\frac{1}{2}"]),
    ("\\boxed{3} or \\boxed{4}", ["3", "4"]),
    ("$3$, no wait, $4$", ["3", "4"]),
    ("3 or \\boxed{4}", ["4", "3 or"]),  # the text around a group counts when it holds a digit
    ("\\boxed{\\{1, 2\\}}", ["\\{1, 2\\}"]),
    ("\\(x = 2\\) and \\[y = 3\\]", ["x = 2", "y = 3"]),
])
def test_answer_candidates(answer, expected):
    assert answer_candidates(answer) == expected


# --- correctness (math-verify in the worker) ------------------------------------------------------

def test_strict_default_is_one_only_for_right_format_and_right_answer(reward):
    completions = [done("19"), done("18"), "<answer>19</answer>", "<think>12+7=19</think> 19", done("")]
    assert reward(["p"] * 5, completions, ["19"] * 5) == [1.0, 0.0, 0.0, 0.0, 0.0]
    info = reward.score_one(done("19"), "19")
    assert info == RewardInfo(reward=1.0, format_ok=True, correct=True, timed_out=False, error=None)


@pytest.mark.parametrize("answer", ["\\boxed{19}", "The answer is $\\boxed{19}$.", "$19$", "x = 19", "19.0",
                                    "The answer is 19"])
def test_equivalent_forms_of_the_answer_are_correct(reward, answer):
    assert reward.score_one(done(answer), "19").reward == 1.0


@pytest.mark.parametrize("answer, expected", [
    ("0.5", 1.0), ("1/2", 1.0), ("\\frac{1}{2}", 1.0), ("\\boxed{\\frac12}", 1.0), ("\\frac{2}{4}", 1.0),
    ("50\\%", 1.0), ("0.5000001", 1.0),  # math-verify rounds floats to 6 decimals
    ("0.51", 0.0), ("0.500001", 0.0), ("2", 0.0),
])
def test_fraction_and_decimal_are_the_same_number(reward, answer, expected):
    assert reward.score_one(done(answer), "1/2").reward == expected


def test_decimal_ground_truth_accepts_a_fraction_and_rounding_is_to_six_places(reward):
    assert reward.score_one(done("\\frac{1}{2}"), "0.5").reward == 1.0
    assert reward.score_one(done("0.333333"), "\\frac{1}{3}").reward == 1.0
    assert reward.score_one(done("0.333"), "\\frac{1}{3}").reward == 0.0


def test_an_unevaluated_expression_counts_as_its_value(reward):
    # math-verify compares values: "12+7" is 19. A task that wants the number itself must check that.
    assert reward.score_one(done("12+7"), "19").reward == 1.0


@pytest.mark.parametrize("hedge", ["3 or 4", "3, 4", "4 or 3", "\\boxed{3} \\boxed{4}", "\\boxed{3} or \\boxed{4}",
                                   "$3$, no wait, $4$", "3 or \\boxed{4}", "4 \\pm 1", "either 3 or 4"])
def test_hedged_answers_score_zero(reward, hedge):
    assert reward.score_one(done("4"), "4").reward == 1.0
    assert reward.score_one(done(hedge), "4").reward == 0.0


def test_repeating_the_same_answer_is_not_a_hedge(reward):
    assert reward.score_one(done("\\boxed{4} so $4$"), "4").reward == 1.0


def test_a_set_answer_matches_a_set_ground_truth(reward):
    assert reward.score_one(done("4 and 3"), "3, 4").reward == 1.0
    assert reward.score_one(done("3"), "3, 4").reward == 0.0


@pytest.mark.parametrize("relation", ["\\boxed{20 = 19}", "20 = 19", "a = b = 19", "19 \\le 20", "x \\geq 19",
                                      "19 < 20", "19 \\ne 20", "$20 = 19$"])
def test_a_relation_is_not_an_answer(reward, relation):
    # math-verify reads `20 = 19` as its right side, 19.
    assert reward.score_one(done(relation), "19").reward == 0.0


def test_a_relation_matches_a_relation_and_a_lone_variable_answers_its_value(reward):
    assert reward.score_one(done("x \\le 3"), "x \\le 3").reward == 1.0
    assert reward.score_one(done("x < 3"), "x \\le 3").reward == 0.0
    assert reward.score_one(done("\\boxed{x = 19}"), "19").reward == 1.0


def test_only_the_answer_block_counts(reward):
    assert reward.score_one("<think>maybe 18? no: 19</think><answer>18</answer>", "19").reward == 0.0
    assert reward.score_one("<think>maybe 18? no: 19</think><answer>19</answer>", "18").reward == 0.0


def test_trl_call_with_keywords_and_conversational_completions(reward):
    conversation = [{"role": "assistant", "content": done("19")}]
    assert reward(prompts=["p", "p"], completions=[conversation, done("7")], ground_truth=["19", "7"],
                  completion_ids=[[1], [2]]) == [1.0, 1.0]
    assert reward.__name__ == "math_reward"


def test_mismatched_lengths_are_an_error(reward):
    with pytest.raises(ValueError, match="2 completions but 1 ground truths"):
        reward(["p", "p"], [done("1"), done("2")], ["1"])


# --- weights ---------------------------------------------------------------------------------------

def test_format_bonus_with_required_format():
    r = MathReward(format_weight=0.2, correct_weight=0.8)  # these rows are never checked: no worker needed
    completions = ["<answer>19</answer>", done(""), "no tags at all"]
    assert r(["p"] * 3, completions, ["19"] * 3) == [0.0, 0.2, 0.0]


def test_weights_without_required_format_and_the_last_number_fallback():
    r = MathReward(format_weight=0.2, correct_weight=0.8, require_format=False)
    try:
        # without an <answer> block the last number written is the answer: "19" is right, "... 20" is not
        completions = [done("19"), done("18"), "<answer>19</answer>", "<answer>18</answer>", "19",
                       "12 + 7 = 19, so 20", "no number"]
        assert r(["p"] * 7, completions, ["19"] * 7) == pytest.approx([1.0, 0.2, 0.8, 0.0, 0.8, 0.0, 0.0])
        bad_format = r.score_one("<answer>19</answer>", "19")
        assert (bad_format.format_ok, bad_format.correct) == (False, True)
    finally:
        r.close()


# --- failures, timeouts and threads ---------------------------------------------------------------

def test_a_ground_truth_that_does_not_parse_scores_zero_and_is_counted(reward):
    before = reward.errors
    infos = reward.score([done("19"), done("19"), done("19")], ["19", "", "19"])
    assert [i.reward for i in infos] == [1.0, 0.0, 1.0]
    assert "ground truth '' does not parse" in infos[1].error
    assert reward.errors == before + 1


def test_math_verify_raising_is_caught_but_our_own_bugs_are_not(monkeypatch):
    import math_verify

    def broken_verify(*args, **kwargs):
        raise RecursionError("maximum recursion depth exceeded")

    monkeypatch.setattr(math_verify, "verify", broken_verify)
    correct, error = math_reward._check("19", "19")
    assert (correct, error) == (False, "math-verify raised RecursionError: maximum recursion depth exceeded")

    def our_bug(answer):
        raise AttributeError("a bug in lmrl")

    monkeypatch.setattr(math_reward, "answer_candidates", our_bug)
    with pytest.raises(AttributeError, match="a bug in lmrl"):
        math_reward._check("19", "19")


def test_a_hostile_answer_times_out_and_the_reward_keeps_working(reward, monkeypatch):
    monkeypatch.setattr(reward, "timeout_s", 1.0)
    before = reward.timeouts
    start = time.monotonic()
    infos = reward.score([done("19"), done(HOSTILE), done("19")], ["19"] * 3)
    assert [i.reward for i in infos] == [1.0, 0.0, 1.0]  # the row queued behind it is checked again
    assert infos[1].timed_out and not infos[0].timed_out and not infos[2].timed_out
    assert reward.timeouts == before + 1
    assert time.monotonic() - start < 20  # 1 s of waiting, then a fresh worker (~2 s), not minutes
    assert reward(["p", "p"], [done("7"), done("8")], ["7", "7"]) == [1.0, 0.0]


def test_a_batch_of_hostile_answers_costs_about_one_timeout_not_one_per_row():
    r = MathReward(timeout_s=1.0)
    try:
        r.score_one(done("1"), "1")  # the checker server is up
        start = time.monotonic()
        infos = r.score([done(HOSTILE)] * 16 + [done("19"), done("\\frac{1}{2}")], ["19"] * 16 + ["19", "0.5"])
        elapsed = time.monotonic() - start
        assert [i.timed_out for i in infos] == [True] * 16 + [False, False]
        assert [i.reward for i in infos[-2:]] == [1.0, 1.0]
        assert r.timeouts == 16
        assert elapsed < 6  # checked one after another, 16 rows took 16 timeouts and a restart each
    finally:
        r.close()


def test_closing_stops_the_checks_still_running():
    r = MathReward(timeout_s=30.0)
    r.score_one(done("1"), "1")
    process, conn = r._server
    conn.send(([(HOSTILE, "19")] * 2, 30.0))  # a batch left running, as a caller interrupted mid-batch leaves it
    time.sleep(0.5)
    assert len(group_states(process.pid)) == 3  # the server and its two checks
    r.close()
    time.sleep(0.5)
    assert set(group_states(process.pid)) <= {"Z"}  # gone, or dead and waiting for init to reap them


def group_states(pgid: int) -> list[str]:
    """The states (R, S, Z, ...) of the processes in process group `pgid`, from /proc."""
    states = []
    for stat in Path("/proc").glob("[0-9]*/stat"):
        try:
            fields = stat.read_text().rsplit(")", 1)[1].split()
        except OSError:
            continue
        if int(fields[2]) == pgid:
            states.append(fields[0])
    return states


def test_scores_correctly_from_threads():
    # math-verify's own timeouts (signal.alarm) fail outside the main thread; ours must not.
    completions, truths = [done("19"), done("1/2"), done("20")], ["19", "0.5", "19"]
    results = []

    def run():
        r = MathReward()  # created and first used off the main thread
        try:
            results.append(r(["p"] * 3, completions, truths))
            with ThreadPoolExecutor(2) as threads:  # two threads sharing one reward
                results.extend(threads.map(lambda _: r(["p"] * 3, completions, truths), range(4)))
        finally:
            r.close()

    thread = threading.Thread(target=run)
    thread.start()
    thread.join(timeout=120)
    assert results == [[1.0, 1.0, 0.0]] * 5


def test_reward_pickles_without_its_workers(reward):
    reward.score_one(done("1"), "1")  # the worker exists
    copy = pickle.loads(pickle.dumps(reward))
    assert (copy.timeout_s, copy.require_format, copy.__name__) == (reward.timeout_s, True, "math_reward")
    assert copy.score_one("<answer>1</answer>", "1").reward == 0.0  # needs no worker


def test_completions_must_be_text_or_messages(reward):
    with pytest.raises(TypeError, match="a completion must be a string or a list of messages, got int"):
        reward(["p"], [19], ["19"])


# --- memory (issue 45) ----------------------------------------------------------------------------

def test_the_memory_budget_is_split_across_the_checks_that_run_at_once():
    r = MathReward(max_parallel=8, memory_budget_bytes=1 << 30)
    assert r.check_memory_bytes == 128 << 20
    assert MathReward().check_memory_bytes * MathReward().max_parallel <= MathReward().memory_budget_bytes
    with pytest.raises(ValueError, match=r"memory_budget_bytes=.* gives each of max_parallel=64 checks"):
        MathReward(max_parallel=64, memory_budget_bytes=1 << 30)


def test_a_check_past_its_share_of_the_memory_budget_dies_and_the_others_are_scored(monkeypatch):
    def hungry(answer, ground_truth):
        if answer == "hungry":
            bytearray(256 << 20)  # past its 64 MiB
        return True, None

    monkeypatch.setattr(math_reward, "_check", hungry)  # the checks fork from this process
    results = math_reward._check_forked([("19", "19"), ("hungry", "19"), ("19", "19")], timeout_s=20.0,
                                        max_parallel=3, check_memory_bytes=64 << 20)
    assert results == [("ok", (True, None)), ("died", None), ("ok", (True, None))]


def test_an_answer_longer_than_max_answer_chars_is_wrong_without_a_check():
    r = MathReward(require_format=False)
    long_answer = "1" * (math_reward.MAX_ANSWER_CHARS + 1)
    infos = r.score([done(long_answer), long_answer], [long_answer, long_answer])
    assert [(i.reward, i.correct, i.timed_out, i.error) for i in infos] == [(0.0, False, False, None)] * 2
    assert r._server is None  # nothing was parsed: no checker was started


# --- currency, units and hedges (issue 45) --------------------------------------------------------

@pytest.mark.parametrize("answer", ["\\$19", "19 dollars", "19 km/h", "\\$19.00", "$\\$19$", "19 \\text{ km/h}",
                                    "19 miles per hour", "\\boxed{19 \\text{ dollars}}", "USD 19", "19 cm^2"])
def test_currency_and_trailing_unit_words_are_not_part_of_the_value(reward, answer):
    assert reward.score_one(done(answer), "19").reward == 1.0


@pytest.mark.parametrize("answer", ["2 \\pi", "2 pi", "2x", "2 x", "2 \\sqrt{2}", "2 i"])
def test_a_symbol_after_a_number_is_still_part_of_the_value(reward, answer):
    assert reward.score_one(done(answer), "2").reward == 0.0


@pytest.mark.parametrize("hedge", ["18 (or 19)", "18 \\lor 19", "18 \\vee 19", "[19, 19]", "19 (or 18)"])
def test_an_answer_naming_two_values_is_wrong_against_one(reward, hedge):
    assert reward.score_one(done(hedge), "19").reward == 0.0


def test_a_disjunction_still_matches_a_ground_truth_of_both_values(reward):
    assert reward.score_one(done("18 \\lor 19"), "18, 19").reward == 1.0
    assert reward.score_one(done("x = 3 or x = 4"), "3, 4").reward == 1.0
