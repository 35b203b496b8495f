from rlwb.core import tasks


def test_worked_answer_with_carries():
    assert tasks.Problem(58, 67).worked_answer == "8+7=15,5+6+1=12#125"
    assert tasks.Problem(123, 45).worked_answer == "3+5=8,2+4=6,1+0=1#168"
    assert tasks.Problem(999, 1).worked_answer == "9+1=10,9+0+1=10,9+0+1=10#1000"


def test_reversed_answer_is_the_habit_the_reward_rejects():
    p = tasks.Problem(58, 67)
    assert p.reversed_answer == "8+7=15,5+6+1=12#521"
    assert tasks.reward(p, p.reversed_answer) == 0.0
    assert tasks.reward(tasks.Problem(5, 6), tasks.Problem(5, 6).reversed_answer) == 1.0  # 11 reads both ways


def test_reward_is_exact_on_the_final_answer():
    p = tasks.Problem(58, 67)
    assert tasks.reward(p, "8+7=15,5+6+1=12#125") == 1.0
    assert tasks.reward(p, "#125") == 1.0  # only the final answer is verified
    assert tasks.reward(p, "8+7=15,5+6+1=12#124") == 0.0
    assert tasks.reward(p, "8+7=15,5+6+1=12") == 0.0  # no marker: the last integer (12) is the answer
    assert tasks.reward(p, "#12a5") == 0.0
    assert tasks.reward(p, "#1#125") == 1.0  # the last '#' counts
    assert tasks.reward(p, "") == 0.0


def test_problems_are_seeded_and_in_range():
    a = tasks.make_problems(50, seed=3)
    assert a == tasks.make_problems(50, seed=3)
    assert a != tasks.make_problems(50, seed=4)
    assert all(0 <= p.a < 1000 and 0 <= p.b < 1000 for p in a)
    assert {len(str(p.a)) for p in a} == {1, 2, 3}


def test_parse_prompt_round_trip_and_error():
    p = tasks.Problem(12, 345)
    assert tasks.parse_prompt(p.prompt) == p
    import pytest

    with pytest.raises(ValueError, match="not a task prompt"):
        tasks.parse_prompt("hello")


def test_free_form_answers_of_real_models():
    p = tasks.Problem(58, 67)
    right = ["58 + 67 = 125.", "The sum is 125", "So the answer is $\\boxed{125}$.", "Adding gives\n#### 125",
             "We get 1 hundred... final: 125", "\\boxed{ 125 }", "#### 125."]
    wrong = ["58 + 67 = 126.", "125 is close but the answer is 124", "\\boxed{521}", "#### 521", "\\boxed{125a}",
             "#### twelve", "I cannot compute that.", "\\boxed{}", "The answer is 125 #"]
    assert [tasks.reward(p, t) for t in right] == [1.0] * len(right)
    assert [tasks.reward(p, t) for t in wrong] == [0.0] * len(wrong)
    assert tasks.parse_answer("total: 1,234") == 1234 and tasks.parse_answer("\\boxed{7} then 9") == 7
    assert tasks.parse_answer("no number here") is None
    assert tasks.Problem(58, 67).question == "What is 58+67?"
