"""The search tool and task: the FTS5 index ranks an entity's own fact first, hostile queries
are answered (never raised), questions are answered by following their demonstration, and
the answer is judged by normalised exact match."""

from __future__ import annotations

import pytest

from rlsys.config.env import EnvConfig, SearchToolConfig
from rlsys.config.errors import ConfigError
from rlsys.config.schema import TaskConfig
from rlsys.data.kb_world import world
from rlsys.data.tasks import load_task
from rlsys.envs import ENVS
from rlsys.envs.answers import exact_match, normalize
from rlsys.envs.search import SearchIndex, fts_query
from rlsys.envs.tools import find_call


def search_task(train: int = 80, evals: int = 20) -> TaskConfig:
    return TaskConfig(
        name="search",
        reward="env",
        reverse_answer=False,
        train_size=train,
        eval_size=evals,
        env=EnvConfig(name="search"),
    )


@pytest.mark.parametrize("seed", range(30))
def test_an_entity_query_ranks_its_own_fact_first(seed):
    kb = world(seed)
    index = SearchIndex.from_seed(seed)
    for person, city in kb.born.items():
        assert index.run(f"{person} born").text == f"{person} was born in {city}."
        assert index.run(f"{person} works").text == f"{person} works at {kb.works[person]}."
    for name, founder in kb.founder.items():
        assert index.run(f"{name} founded").text == f"{name} was founded by {founder}."
        assert index.run(f"{name} based").text == f"{name} is based in {kb.based[name]}."


def test_top_k_passages_come_best_first_and_cut_to_bounds():
    kb = world(1)
    person = next(iter(kb.born))
    index = SearchIndex.from_seed(1, SearchToolConfig(top_k=3, max_chars=500))
    text = index.run(f"{person} born").text
    assert text.startswith(f"{person} was born in {kb.born[person]}.")
    assert text.count(".") == 3  # three passages
    short = SearchIndex.from_seed(1, SearchToolConfig(top_k=3, max_chars=20))
    assert len(short.run(person).text) == 20


@pytest.mark.parametrize(
    "query",
    [
        '"unbalanced',
        "AND OR NOT",
        "NEAR(a b",
        "born*",
        "col:born",
        "a ^ b - c + (d",
        "''; DROP TABLE passages; --",
        "\x00born",
        "x" * 10_000,
        "born " * 500,
        "",
        "?!.,",
    ],
)
def test_hostile_queries_are_answered_not_raised(query):
    index = SearchIndex.from_seed(2)
    reply = index.run(query)
    assert isinstance(reply.text, str) and 0 < len(reply.text) <= 160
    if not any(c.isalnum() for c in query) or len(query) > 200:
        assert reply.error and reply.text.startswith("error: ")
    assert len(index.run("born").text) > 0  # the index still answers


def test_queries_are_read_as_literal_words():
    assert fts_query('Lumeta "founded" AND (x') == '"Lumeta" OR "founded" OR "AND" OR "x"'
    assert fts_query("...") == ""


def test_questions_are_answered_by_following_the_demonstration():
    cfg = search_task()
    splits = load_task(cfg, 2)
    factory = ENVS.get("search")(cfg.env)
    assert {p.meta["hops"] for p in splits.train} == {1, 2}
    for prompt in splits.train + splits.eval:
        env = factory(prompt)
        demo = factory.demonstration(prompt)
        assert len(demo) == 2 * prompt.meta["hops"] + 1
        for (text, is_model), (observation, _) in zip(demo[:-1:2], demo[1::2], strict=True):
            assert is_model and find_call(text).name == "search"
            out = env.step(text)
            assert out.tool_call and out.observation == observation
        # the answer is the last word(s) of the last observation: read, not given
        assert prompt.answer in demo[-2][0]
        final = env.step(demo[-1][0])
        assert final.done and final.correct and final.reward == 1.0


def test_splits_are_deterministic_and_disjoint_and_eval_worlds_are_new():
    a, b = load_task(search_task(), 7), load_task(search_task(), 7)
    assert [(p.text, p.answer, p.meta) for p in a.train + a.eval] == [
        (p.text, p.answer, p.meta) for p in b.train + b.eval
    ]
    assert not {p.meta["kb"] for p in a.train} & {p.meta["kb"] for p in a.eval}
    other = load_task(search_task(), 8)
    assert [p.text for p in other.train] != [p.text for p in a.train]


def test_the_answer_is_judged_by_normalised_exact_match():
    cfg = search_task()
    prompt = load_task(cfg, 0).train[0]
    env = ENVS.get("search")(cfg.env)(prompt)
    assert env.step(f"  {prompt.answer.upper()}. ").correct
    assert not env.step(f"{prompt.answer} or Tarsim").correct
    assert env.step("<call>search</call>").tool_error  # no words
    assert env.step("<call>sql SELECT 1</call>").tool_error  # another tool
    assert normalize(" Zorvan  Pell!") == "zorvan pell" and not exact_match("", "")
    with pytest.raises(ConfigError, match="task.env.search.top_k"):
        SearchToolConfig(top_k=0)
