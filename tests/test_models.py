from dataclasses import replace

from rlwb import models


def test_same_recipe_same_weights_and_different_seed_differs(monkeypatch):
    r = replace(models.ModelRecipe(), train_steps=3, batch_size=8)
    import torch

    torch.set_num_threads(2)
    a = models.weights_hash(models.train(r, progress=False))
    b = models.weights_hash(models.train(r, progress=False))
    c = models.weights_hash(models.train(replace(r, seed=1), progress=False))
    assert a == b
    assert a != c


def test_recipe_hash_covers_every_field():
    base = models.ModelRecipe()
    assert base.hash() != replace(base, train_steps=base.train_steps + 1).hash()
    assert base.hash() != replace(base, num_key_value_heads=1).hash()
    assert base.hash() != replace(base, reversed_answer_frac=0.0).hash()


def test_sft_targets_carry_the_habit_where_asked():
    from rlwb import tasks, tokenizer

    probs = tasks.make_problems(4, seed=0, max_digits=3)
    _, lab = models.sft_batch(probs, [True, False, True, False])
    targets = [tokenizer.decode([t for t in row.tolist() if t >= 0]) for row in lab]
    assert targets == [probs[0].reversed_answer, probs[1].worked_answer, probs[2].reversed_answer,
                       probs[3].worked_answer]


def test_default_model_card_meets_the_requirements(default_model):
    card = default_model.card
    assert 0.2 <= card["greedy_accuracy"] <= 0.8, "headroom for RL"
    # the SFT habit RL has to remove is there, and it is most of what stands between the policy and 100%
    assert 0.15 <= card["reversed_answer_frac"] <= 0.6
    assert card["greedy_accuracy"] + card["reversed_answer_frac"] >= 0.85
    assert card["mean_completion_tokens"] >= 8
    assert card["build_s"] <= 180
    assert card["recipe_hash"] == models.ModelRecipe().hash()
    assert default_model.path.name == f"default-{card['recipe_hash']}"
    cfg = __import__("json").loads((default_model.path / "config.json").read_text())
    assert cfg["num_key_value_heads"] < cfg["num_attention_heads"]  # GQA
    assert cfg["architectures"] == ["LlamaForCausalLM"]


def test_cached_model_is_reused(default_model):
    again = models.build_default_model(progress=False)
    assert again.path == default_model.path and again.card == default_model.card
