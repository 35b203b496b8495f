from rlwb.core.data import tasks


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


def test_hash_marks_an_answer_only_where_it_is_one():
    """Shapes instruct models write (headings, bold, LaTeX, prose around the answer): a `#` of a markdown heading or
    of a reference in prose is no answer marker (issue #38: such completions scored 0 before); the answer is read
    and a wrong one scores 0."""
    p = tasks.Problem(58, 67)
    shapes = ["### Solution\n58 + 67 = {}.", "Issue #3: 58+67 = {}", "## Answer\n\nThe sum is **{}**.", "**{}**",
              "$\\boxed{{{}}}$", "${}$", "\\({}\\)", "The answer is {}.", "The answer is {}. (I added 2 columns)",
              "Final answer: **{}**", "58 + 67 = {}. Let me know if you need anything else!",
              "# Step 1\nadd the ones: 8 + 7 = 15\n# Step 2\nthe total is {}", "Adding gives\n#### {}",
              "8+7=15,5+6+1=12#{}", "The answer is #{}", "Total: {}\n"]
    assert [tasks.reward(p, s.format(125)) for s in shapes] == [1.0] * len(shapes)
    assert [tasks.reward(p, s.format(126)) for s in shapes] == [0.0] * len(shapes)
    assert [tasks.parse_answer(s.format(521)) for s in shapes] == [521] * len(shapes)
    # the toy format's commitments stay: a broken or empty tail after a lone trailing `#` is no answer
    for broken in ("8+7=15,5+6+1=12#12a", "8+7=15,5+6+1=12#", "#125;3+4=", "a#b"):
        assert tasks.parse_answer(broken) is None, broken


def _parse_before_issue_38(completion: str):
    """The rule the reward used before issue #38 (the text after the last `#`), kept here to hold the new one to it
    on the embedded models' own format."""
    boxed = tasks._BOXED.findall(completion)
    if boxed:
        return tasks._integer(boxed[-1])
    if "#" in completion:
        return tasks._integer(completion.rsplit("#", 1)[1])
    found = tasks._INTEGER.findall(completion)
    return tasks._integer(found[-1]) if found else None


def test_the_default_policys_own_completions_score_exactly_as_before(default_model):
    """GRPO's rewards (notebooks 03, 07, 08) must not move: on 128 completions the default policy samples at T = 1
    (its most varied outputs; 4,096 at T = 0.7 and 1 gave no difference either, measured), the new parser reads
    every completion as the old one did."""
    import torch
    from transformers import AutoModelForCausalLM

    from rlwb.core.data import tokenizer

    model = AutoModelForCausalLM.from_pretrained(default_model.path).eval()
    probs = tasks.make_problems(128, seed=38)
    ids = [tokenizer.encode_prompt(p.prompt) for p in probs]
    width = max(map(len, ids))
    x = torch.tensor([[tokenizer.PAD_ID] * (width - len(i)) + i for i in ids])
    torch.manual_seed(0)
    with torch.no_grad():
        out = model.generate(input_ids=x, attention_mask=(x != tokenizer.PAD_ID).long(), do_sample=True,
                             temperature=1.0, top_k=0, max_new_tokens=32, pad_token_id=tokenizer.PAD_ID,
                             eos_token_id=tokenizer.EOS_ID)
    texts = [tokenizer.decode(seq) for seq in out[:, width:].tolist()]
    assert sum("#" in t for t in texts) > 100  # the toy format, really sampled
    differ = [t for t in texts if tasks.parse_answer(t) != _parse_before_issue_38(t)]
    assert not differ, differ[:5]
