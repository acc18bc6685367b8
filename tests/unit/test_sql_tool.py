"""The sql tool and task: read-only, time- and size-bounded queries that never raise; the
generated questions, their reference answers and splits; the environment and its answer
matching."""

from __future__ import annotations

import sqlite3
import time

import pytest

from rlsys.config.env import EnvConfig, SQLToolConfig
from rlsys.config.errors import ConfigError
from rlsys.config.schema import TaskConfig
from rlsys.data.sql_tool import SQLDatabase, format_rows
from rlsys.data.sql_world import company, write_company
from rlsys.data.tasks import load_task
from rlsys.envs import ENVS
from rlsys.envs.answers import same_values, value_set

ENDLESS = "WITH RECURSIVE c(x) AS (SELECT 1 UNION ALL SELECT x+1 FROM c) SELECT COUNT(*) FROM c"


def sql_task(train: int = 60, evals: int = 20) -> TaskConfig:
    return TaskConfig(
        name="sql",
        reward="env",
        reverse_answer=False,
        train_size=train,
        eval_size=evals,
        env=EnvConfig(name="sql"),
    )


@pytest.fixture
def db() -> SQLDatabase:
    return SQLDatabase.from_seed(5, SQLToolConfig(time_limit_ms=100, max_rows=4, max_chars=60))


def test_select_returns_compact_rows(db):
    rows = company(5).emp
    reply = db.run("SELECT name, pay FROM emp ORDER BY pay DESC LIMIT 2")
    top = sorted(rows, key=lambda r: -r[2])[:2]
    assert not reply.error and reply.text == "; ".join(f"{n}, {p}" for n, _, p in top)
    assert db.run("SELECT name FROM emp WHERE dept='Nowhere'").text == "no rows"
    assert db.run("SELECT 7/2.0").text == "3.5" and db.run("SELECT NULL").text == "NULL"


@pytest.mark.parametrize(
    "query",
    [
        "DELETE FROM emp",
        "UPDATE emp SET pay=0",
        "INSERT INTO proj VALUES ('X', 'Y')",
        "DROP TABLE emp",
        "CREATE TABLE t(x)",
        "CREATE TEMP TABLE t(x)",
        "PRAGMA query_only=OFF",
        "PRAGMA writable_schema=ON",
        "ATTACH DATABASE '/tmp/rlsys-sql-attack.db' AS x",
        "VACUUM INTO '/tmp/rlsys-sql-attack.db'",
        "BEGIN",
        "SELECT 1; DROP TABLE emp",
        "SELECT load_extension('/tmp/evil')",
        "SELECT zeroblob(1000000000)",
        "SELECT printf('%.*c', 2000000000, 'x')",
        "SELECT no_such_column FROM emp",
        "SELEC nonsense (",
        "SELECT '\x00'",
        "SELECT 1 " + "x" * 1000,
    ],
)
def test_hostile_queries_are_error_results_and_change_nothing(db, query):
    before = db.run("SELECT COUNT(*), SUM(pay) FROM emp").text
    start = time.monotonic()
    reply = db.run(query)
    assert reply.error and reply.text.startswith("error: ")
    assert time.monotonic() - start < 1.0
    assert db.run("SELECT COUNT(*), SUM(pay) FROM emp").text == before
    assert db.run("PRAGMA query_only").error  # even reading a pragma is denied


def test_attach_is_refused_even_without_the_authorizer(db):
    db.conn.set_authorizer(None)  # the limits hold on their own
    with pytest.raises(sqlite3.OperationalError, match="too many attached"):
        db.conn.execute("ATTACH DATABASE ':memory:' AS x")
    with pytest.raises(sqlite3.OperationalError, match="readonly"):
        db.conn.execute("DELETE FROM emp")  # PRAGMA query_only


def test_an_endless_query_is_cut_by_the_time_limit(db):
    start = time.monotonic()
    reply = db.run(ENDLESS)
    elapsed = time.monotonic() - start
    assert reply.error and "100 ms" in reply.text and 0.09 < elapsed < 1.0
    assert db.run("SELECT COUNT(*) FROM proj").text == "5"  # the connection still works


def test_huge_results_are_bounded_in_rows_and_characters(db):
    endless_rows = ENDLESS.replace("COUNT(*)", "x")
    assert db.run(endless_rows).text == "1; 2; 3; 4; ..."  # 4 rows, then streaming stops
    wide = db.run("SELECT a.name, b.name, c.name FROM emp a, emp b, emp c")
    assert len(wide.text) == 60 and wide.text.endswith("...")
    doubling = "WITH RECURSIVE c(s) AS (SELECT 'abcdefgh' UNION ALL SELECT s||s FROM c) SELECT "
    assert len(db.run(doubling + "s FROM c").text) == 60  # 4 rows fetched, text cut
    reply = db.run(doubling + "length(s) FROM c WHERE length(s) > 5000")
    assert reply.error and "too big" in reply.text  # no value past SQLITE_LIMIT_LENGTH


def test_questions_answer_with_their_reference_query_and_splits_are_disjoint():
    splits = load_task(sql_task(), 3)
    again = load_task(sql_task(), 3)
    assert [(p.text, p.answer, p.meta) for p in splits.train + splits.eval] == [
        (p.text, p.answer, p.meta) for p in again.train + again.eval
    ]
    other = load_task(sql_task(), 4)
    assert [p.meta["db"] for p in other.train] != [p.meta["db"] for p in splits.train]
    train_dbs = {p.meta["db"] for p in splits.train}
    assert len(train_dbs) == 60 and not train_dbs & {p.meta["db"] for p in splits.eval}
    assert {p.meta["level"] for p in splits.train} == {1, 2, 3}
    for p in splits.train + splits.eval:
        conn = sqlite3.connect(":memory:")  # an independent, unguarded copy of the database
        write_company(company(p.meta["db"]), conn)
        assert same_values(format_rows(conn.execute(p.meta["query"]).fetchall()), p.answer)
        assert p.answer != "no rows"


def test_episode_runs_queries_and_judges_the_answer_as_a_set_of_values():
    cfg = sql_task()
    factory = ENVS.get("sql")(cfg.env)
    prompt = next(p for p in load_task(cfg, 0).train if p.meta["template"] == "staff")
    env = factory(prompt)
    out = env.step(f"<call>sql {prompt.meta['query']}</call>")
    assert out.tool_call and out.observation == f"<result>{prompt.answer}</result>"
    assert env.step("<call>sql DROP TABLE emp</call>").tool_error
    assert env.step("<call>calc 1+1</call>").tool_error
    assert env.step("<call>sql SELECT</call>").tool_error
    names = prompt.answer.split("; ")
    assert env.step(", ".join(reversed(names))).correct  # order and separator do not matter
    assert not env.step(", ".join(names[:-1])).correct  # a value missing
    assert not env.step(f"{prompt.answer}; Zed2").correct  # one too many
    demo = factory.demonstration(prompt)
    assert [m for _, m in demo] == [True, False, True] and demo[-1][0] == prompt.answer


def test_value_sets_compare_numbers_by_value_and_ignore_case_and_order():
    assert value_set("Ann; bob, 7.0 and Cy.") == {"ann", "bob", "7", "cy"}
    assert same_values("7", "7.0") and same_values(" ann ,BOB ", "Bob; Ann")
    assert not same_values("", "Ann") and not same_values("", "")
    with pytest.raises(ConfigError, match="task.env.sql.time_limit_ms"):
        SQLToolConfig(time_limit_ms=0)


HAMMER = """
import threading
from rlsys.envs.search import SearchIndex
from rlsys.data.sql_tool import SQLDatabase
tools = [
    (SQLDatabase.from_seed(1), "SELECT name FROM emp WHERE dept='Ops' ORDER BY pay DESC LIMIT 1"),
    (SearchIndex.from_seed(1), "founded born"),
]
def work(tool, query):
    for _ in range(300):
        tool.run(query)
threads = [threading.Thread(target=work, args=tools[i % 2], daemon=True) for i in range(8)]
for t in threads:
    t.start()
for t in threads:
    t.join()
"""


def test_threads_sharing_a_database_or_an_index_do_not_deadlock():
    # The trajectories of a prompt share its database and step on threads of their own
    # (asynchronous turns); unguarded, two threads in one sqlite3 connection deadlocked (a
    # progress handler waiting for the GIL against a thread waiting for SQLite's mutex), so
    # the hammer runs in a subprocess that a deadlock would leave hanging past the timeout.
    import subprocess
    import sys

    subprocess.run([sys.executable, "-c", HAMMER], check=True, timeout=60)
