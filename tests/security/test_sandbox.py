"""Security tests of the code sandbox and the ``code_tests`` reward: hostile programs are
contained, finish within their limits and score 0, and the sandbox keeps working after."""

from __future__ import annotations

import json
import os
import socket
import sys
import time
import uuid
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path

import pytest
from processes import processes_with

from rlsys.config.errors import ConfigError
from rlsys.config.reward import RewardConfig, SandboxConfig
from rlsys.rewards import code as code_reward
from rlsys.rewards import sandbox
from rlsys.rewards.code import CodeTests, extract_program
from rlsys.rewards.registry import build_reward
from rlsys.rewards.sandbox import OUTPUT_LIMIT, run_sandboxed, sandbox_support

pytestmark = pytest.mark.skipif(sys.platform != "linux", reason="the sandbox needs Linux")

REPO = Path(__file__).resolve().parents[2]
FIXTURE = REPO / "tests" / "fixtures" / "code_tasks.jsonl"
CFG = SandboxConfig(wall_s=3.0, cpu_s=2.0, memory_mb=256, max_processes=16, file_size_mb=1)
SLACK_S = 12.0  # a contained run ends within wall_s + this, even on a loaded 2-core box
# A hostile program prints PWNED only if its attack worked, so a score of 0 means contained.
PWNED = [{"input": "", "output": "PWNED"}]


@pytest.fixture(scope="module")
def reward(isolated):
    return build_reward("code_tests", RewardConfig(sandbox=CFG))


@pytest.fixture(scope="module")
def good_reward(isolated):
    """For programs that should pass: a generous wall clock, so load cannot fail them."""
    return build_reward("code_tests", RewardConfig(sandbox=SandboxConfig(wall_s=20.0)))


def _contained(reward, code: str, monkeypatch) -> sandbox.SandboxResult:
    """Score ``code`` with ``reward``: 0, and its sandbox run ended within the time bound."""
    runs = []

    def recording_run(*args):
        runs.append(run_sandboxed(*args))
        return runs[-1]

    monkeypatch.setattr(code_reward, "run_sandboxed", recording_run)
    start = time.monotonic()
    score = reward("p", f"```python\n{code}\n```", {"tests": PWNED})
    assert time.monotonic() - start < CFG.wall_s + SLACK_S, runs
    assert score == {"reward": 0.0, "correct": False}, runs
    (result,) = runs
    assert "PWNED" not in result.stdout, result
    return result


def test_root_on_linux_gets_full_isolation():
    support = sandbox_support()
    assert support.runs, support.reason
    if os.geteuid() == 0:
        assert support.isolated and support.uid_mode in ("pool", "nobody"), support


def test_infinite_loop_is_killed(reward, monkeypatch):
    result = _contained(reward, "while True:\n    pass", monkeypatch)
    assert result.killed_reason in ("cpu_time", "wall_time"), result


def test_sleeping_program_is_killed_at_wall_time(reward, monkeypatch):
    result = _contained(reward, "import time\ntime.sleep(600)\nprint('PWNED')", monkeypatch)
    assert result.timed_out and result.killed_reason == "wall_time"


def test_fork_bomb_is_bounded_and_leaves_no_process(reward, monkeypatch):
    marker = f"{time.time_ns() % 10**6}.{os.getpid()}"  # a unique `sleep` argument
    code = f"""
import os, sys
while True:
    try:
        if os.fork() == 0:
            os.setsid()  # leave the process group: only the PID namespace can catch it
            if os.fork() == 0:
                os.execv(sys.executable, [sys.executable, "-c", "import time; time.sleep(600)",
                                          "{marker}"])
    except OSError:
        pass
"""
    _contained(reward, code, monkeypatch)
    spawner = (
        "import subprocess, sys\n"
        "procs = []\n"
        "while True:\n"
        "    try:\n"
        "        procs.append(subprocess.Popen([sys.executable, '-c', 'while True: pass']))\n"
        "    except OSError:\n"
        "        pass\n"
    )
    _contained(reward, spawner, monkeypatch)
    deadline = time.monotonic() + 5
    while processes_with(marker) and time.monotonic() < deadline:
        time.sleep(0.1)
    assert not processes_with(marker)


def test_memory_hog_fails(reward, monkeypatch):
    result = _contained(reward, "x = bytearray(2 * 1024**3)\nprint('PWNED')", monkeypatch)
    assert "MemoryError" in result.stderr
    _contained(reward, "a = []\nwhile True:\n    a.append(bytearray(10**7))", monkeypatch)


def test_writes_outside_the_working_directory_fail(reward, tmp_path, monkeypatch):
    tag = uuid.uuid4().hex
    targets = [
        f"/tmp/pwned_{tag}",
        f"/var/tmp/pwned_{tag}",
        f"/dev/shm/pwned_{tag}",
        str(REPO / f"pwned_{tag}"),
        str(tmp_path / f"pwned_{tag}"),
        f"/etc/pwned_{tag}",
        os.path.expanduser(f"~/pwned_{tag}"),
    ]
    code = f"""
import os
done = []
for path in {targets!r} + ["../pwned_{tag}", "/pwned_{tag}"]:
    try:
        with open(path, "w") as f:
            f.write("x")
        done.append(path)
    except OSError:
        pass
try:
    os.symlink("/etc/passwd", "link")
    open("link", "a").write("x")
    done.append("passwd")
except OSError:
    pass
print("PWNED" if done else "contained", done)
"""
    result = _contained(reward, code, monkeypatch)
    assert "contained []" in result.stdout, result
    for path in [*targets, f"/pwned_{tag}"]:
        assert not os.path.exists(path), path


def test_network_is_unreachable(reward, monkeypatch):
    with socket.socket() as server, socket.socket(socket.AF_UNIX) as abstract:
        server.bind(("127.0.0.1", 0))
        server.listen(8)
        server.settimeout(0.5)
        name = f"\0rlsys-sandbox-test-{uuid.uuid4().hex}"
        abstract.bind(name)
        abstract.listen(8)
        abstract.settimeout(0.5)
        code = f"""
import socket
reached = []
for address in [("127.0.0.1", {server.getsockname()[1]}), ("1.1.1.1", 53), ("8.8.8.8", 443)]:
    try:
        socket.create_connection(address, timeout=1).close()
        reached.append(address)
    except OSError:
        pass
try:
    s = socket.socket(socket.AF_UNIX)
    s.connect({name!r})
    reached.append("abstract")
except OSError:
    pass
try:
    socket.socket(socket.AF_INET, socket.SOCK_DGRAM).sendto(b"x", ("8.8.8.8", 53))
    reached.append("udp")
except OSError:
    pass
print("PWNED" if reached else "offline", reached)
"""
        result = _contained(reward, code, monkeypatch)
        assert "offline []" in result.stdout, result
        for listener in (server, abstract):
            with pytest.raises(socket.timeout):
                listener.accept()


def test_environment_secrets_are_not_inherited(reward, monkeypatch):
    for key in ("WANDB_API_KEY", "HF_TOKEN", "AWS_SECRET_ACCESS_KEY", "RAY_ADDRESS"):
        monkeypatch.setenv(key, "secret-xyz")
    code = """
import os
seen = [dict(os.environ)]
for pid in os.listdir("/proc"):
    try:
        seen.append(open(f"/proc/{pid}/environ", "rb").read())
    except OSError:
        pass
print("PWNED" if "secret-xyz" in repr(seen) else "clean", seen[0])
"""
    result = _contained(reward, code, monkeypatch)
    assert "clean" in result.stdout and "secret-xyz" not in result.stdout + result.stderr
    for key in ("WANDB_API_KEY", "HF_TOKEN", "AWS_SECRET_ACCESS_KEY", "RAY_ADDRESS"):
        assert key not in result.stdout


def test_huge_files_and_output_are_bounded(reward, monkeypatch):
    result = _contained(
        reward, "open('big', 'wb').write(b'x' * 50 * 2**20)\nprint('PWNED')", monkeypatch
    )
    assert "File too large" in result.stderr, result  # Python ignores SIGXFSZ: EFBIG
    result = _contained(reward, "while True:\n    print('x' * 1000)", monkeypatch)
    # stdout is kept up to the expected output plus OUTPUT_LIMIT
    assert result.stdout_truncated and len(result.stdout) <= len("PWNED") + OUTPUT_LIMIT


def test_privileges_are_dropped(reward, monkeypatch):
    code = (
        "import os\nprint('PWNED' if 0 in (os.getuid(), os.geteuid()) else 'user', os.getuid())\n"
    )
    result = _contained(reward, code, monkeypatch)
    if os.geteuid() == 0:
        assert result.stdout.startswith("user"), result


# ---- scoring ---------------------------------------------------------------------------

ADD = [{"input": "1 2\n", "output": "3\n"}, {"input": "5 5\n", "output": "10"}]
ADD_PROGRAM = "a, b = map(int, input().split())\nprint(a + b)"


def test_correct_and_partly_correct_programs(good_reward):
    completion = f"I read both numbers.\n```python\n{ADD_PROGRAM}\n```\nDone."
    assert good_reward("p", completion, {"tests": ADD}) == {"reward": 1.0, "correct": True}
    assert good_reward("p", "```python\nprint(3)\n```", {"tests": ADD}) == {
        "reward": 0.5,
        "correct": False,
    }


def test_tests_as_a_json_string_and_trailing_white_space(good_reward):
    tests = json.dumps([{"input": "4 5\n", "output": "9   \n\n"}])
    assert good_reward("p", ADD_PROGRAM, {"tests": tests})["reward"] == 1.0  # unfenced program
    with pytest.raises(ValueError, match=r"metadata\['tests'\]"):
        good_reward("p", ADD_PROGRAM, {"tests": []})
    with pytest.raises(ValueError, match=r"metadata\['tests'\]"):
        good_reward("p", ADD_PROGRAM, {})


def test_program_extraction():
    assert extract_program("text\n```python\nA\n```\nmid\n```python\nB\n```\n") == "B\n"
    assert extract_program("```py\nA\n```\n```text\nout\n```") == "A\n"
    assert extract_program("```\nA\n```") == "A\n"
    assert extract_program("```python\nunclosed") == "unclosed"
    assert extract_program("print(1)") == "print(1)"


def test_a_machine_without_network_isolation_refuses_at_build(monkeypatch):
    no_netns = sandbox.SandboxSupport(True, False, "self", "unshare: EPERM")
    monkeypatch.setattr(sandbox, "_support", no_netns)
    with pytest.raises(ConfigError, match="reward.sandbox.unsafe_no_isolation"):
        build_reward("code_tests", RewardConfig())
    allowed = RewardConfig(sandbox=SandboxConfig(unsafe_no_isolation=True))
    assert isinstance(build_reward("code_tests", allowed), CodeTests)


def test_fixture_reference_solutions_score_one_and_wrong_ones_zero(isolated):
    reward = build_reward("code_tests", RewardConfig())
    rows = [json.loads(line) for line in FIXTURE.read_text().splitlines()]
    assert len(rows) >= 6

    def scores(row: dict) -> tuple[dict, float]:
        solution = reward(row["prompt"], f"Here it is:\n```python\n{row['solution']}```", row)
        wrong = reward(row["prompt"], "```python\nprint('wrong')\n```", row)
        return solution, wrong["reward"]

    with ThreadPoolExecutor(4) as pool:
        assert list(pool.map(scores, rows)) == [({"reward": 1.0, "correct": True}, 0.0)] * len(rows)


def test_sandbox_still_works_concurrently_after_the_attacks(good_reward):
    """Training goes on: good programs score 1 from many threads at once."""
    completion = f"```python\n{ADD_PROGRAM}\n```"
    with ThreadPoolExecutor(8) as pool:
        scores = list(pool.map(lambda _: good_reward("p", completion, {"tests": ADD}), range(8)))
    assert scores == [{"reward": 1.0, "correct": True}] * 8


# ---- output over the cap (issue 47) --------------------------------------------------

COUNT_TO = 30_000  # its output, one number a line, is about 160 KiB: past the 64 KiB cap
COUNT_PROGRAM = f"print('\\n'.join(str(i) for i in range({COUNT_TO})))"


def test_output_over_the_cap_is_a_counted_error_not_a_silent_zero(good_reward):
    """The cap grows with the expected output, so a correct program that prints more than
    64 KiB passes; output past the cap cannot be judged: the sample scores 0 and counts a
    reward error (``rollout/reward_errors``)."""
    from rlsys.rewards.scorer import Component, RewardScorer

    expected = "\n".join(str(i) for i in range(COUNT_TO)) + "\n"
    scorer = RewardScorer([Component("code_tests", good_reward, 1.0, True)], timeout_s=120.0)
    right, spam = scorer.score(
        [
            ("p", COUNT_PROGRAM, {"tests": [{"input": "", "output": expected}]}),
            ("p", COUNT_PROGRAM, {"tests": [{"input": "", "output": "0\n"}]}),
        ]
    )
    assert (right.reward, right.correct, right.errors) == (1.0, True, 0), right
    assert (spam.reward, spam.errors) == (0.0, 1) and "output cap" in spam.error, spam


def test_a_correct_program_with_much_on_stderr_still_passes(good_reward):
    program = "import sys\nsys.stderr.write('debug ' * 40_000)\nprint(3)"
    assert good_reward("p", program, {"tests": [{"input": "", "output": "3"}]}) == {
        "reward": 1.0,
        "correct": True,
    }
