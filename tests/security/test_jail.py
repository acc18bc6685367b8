"""The code sandbox as a jail: a program sees only its own directory (no dataset, repository
or home directory to copy answers from), its limits hold for the whole sandbox rather than per
process, and a reward call the scorer gave up on kills its sandbox at once."""

from __future__ import annotations

import os
import sys
import time
import uuid
from pathlib import Path

import pytest
from processes import processes_with

from rlsys.config.reward import RewardConfig, SandboxConfig
from rlsys.rewards import code as code_reward
from rlsys.rewards.registry import build_reward
from rlsys.rewards.sandbox import jail_paths, run_sandboxed
from rlsys.rewards.scorer import Component, RewardScorer

pytestmark = [
    pytest.mark.skipif(sys.platform != "linux", reason="the sandbox needs Linux"),
    pytest.mark.usefixtures("isolated"),
]

REPO = Path(__file__).resolve().parents[2]


def test_a_program_cannot_read_the_tasks_answers(tmp_path):
    """The reward hack a policy would learn: print the expected output read from the task's
    own data file. The file is not in the jail, so the program scores 0."""
    answer = f"answer-{uuid.uuid4().hex}"
    dataset = tmp_path / "tasks.jsonl"
    dataset.write_text(f'{{"prompt": "p", "tests": [{{"input": "", "output": "{answer}"}}]}}\n')
    cheat = (
        "import json\n"
        f"row = json.loads(open({str(dataset)!r}).readline())\n"
        "print(row['tests'][0]['output'])\n"
    )
    reward = build_reward("code_tests", RewardConfig(sandbox=SandboxConfig(wall_s=20.0)))
    tests = {"tests": [{"input": "", "output": answer}]}
    assert reward("p", f"```python\n{cheat}```", tests) == {"reward": 0.0, "correct": False}
    honest = f"print({answer!r})"  # the same check passes a program that knows the answer
    assert reward("p", f"```python\n{honest}\n```", tests) == {"reward": 1.0, "correct": True}

    site_packages = Path(code_reward.__file__).resolve().parents[2]  # where rlsys is installed
    hidden = [
        dataset,
        tmp_path,
        REPO,
        REPO / "tests" / "fixtures" / "code_tasks.jsonl",
        site_packages,
        Path("/etc/passwd"),
        Path("/work"),
        Path("/opt"),
        Path("/var"),
        Path(sys.prefix),  # the virtual environment (its packages)
    ]
    probe = f"import os\nfor p in {[str(p) for p in hidden]!r}:\n    print(os.path.exists(p), p)"
    result = run_sandboxed(probe, "", SandboxConfig(wall_s=20.0))
    assert result.ok, result
    seen = [line for line in result.stdout.splitlines() if line.startswith("True")]
    assert seen == [], seen
    assert len(result.stdout.splitlines()) == len(hidden), result
    # Everything the jail holds outside the read-only binds of the interpreter and system
    # libraries: the program, five /dev nodes, and the empty directories leading to binds
    # (symlinks such as /lib -> usr/lib are listed as directories, not followed).
    jail = jail_paths()
    walk = f"""
import os
skip = set({jail["binds"] + jail["masks"] + ["/proc"]!r})
for top, dirs, files in os.walk("/"):
    dirs[:] = [d for d in dirs if os.path.join(top, d) not in skip]
    for name in files:
        print(os.path.join(top, name))
"""
    result = run_sandboxed(walk, "", SandboxConfig(wall_s=20.0))
    assert result.ok, result
    devices = [f"/dev/{name}" for name in ("full", "null", "random", "urandom", "zero")]
    files = [path for path in jail["binds"] if not os.path.isdir(path)]  # the interpreter...
    assert sorted(result.stdout.split()) == sorted(["/tmp/work/prog.py", *devices, *files])
    # The interpreter's own standard library is there (read-only), its packages are not.
    stdlib = run_sandboxed("import json, os, sqlite3; print('ok')", "", SandboxConfig(wall_s=20))
    assert stdlib.stdout.strip() == "ok", stdlib


_CHILDREN = (
    "import os, time\n"
    "for _ in range(10):\n"
    "    if os.fork() == 0:\n"
    "        block = bytearray(400 * 2**20)\n"
    "        time.sleep(60)\n"
    "        os._exit(0)\n"
    "for _ in range(10):\n"
    "    os.wait()\n"
)
_SHARED_MAP = (  # shared anonymous memory, 2 x 300 MiB: "shared", not private, to statm
    "import mmap, os, time\n"
    "for _ in range(2):\n"
    "    if os.fork() == 0:\n"
    "        area = mmap.mmap(-1, 300 * 2**20)\n"
    "        for i in range(0, len(area), 4096):\n"
    "            area[i] = 1\n"
    "        time.sleep(60)\n"
    "        os._exit(0)\n"
    "for _ in range(2):\n"
    "    os.wait()\n"
)
_MEMFDS = (  # memfds never mapped: in no process's resident memory
    "import os, time\n"
    "fds = []\n"
    "for _ in range(50):\n"
    "    fd = os.memfd_create('x')\n"
    "    os.write(fd, b'x' * 8 * 2**20)\n"
    "    fds.append(fd)\n"
    "time.sleep(60)\n"
)


# non-root mode refuses shared anonymous memory and memfds (the watcher cannot size what only a
# mapping holds: tests/security/test_host_resources.py), with these errors
_NON_ROOT_REFUSES = {
    "shared-map": "PermissionError: [Errno 1] Operation not permitted",
    "memfds": "OSError: [Errno 38] Function not implemented",
}


@pytest.mark.parametrize(
    "hog", [_CHILDREN, _SHARED_MAP, _MEMFDS], ids=["10-children", "shared-map", "memfds"]
)
def test_memory_is_limited_for_the_sandbox_as_a_whole(hog, request):
    """Under a per-process 512 MiB cap: 10 children x 400 MiB each, 2 children x 300 MiB of
    shared anonymous memory, 50 memfds x 8 MiB that no process maps. Each passes the sandbox's
    512 MiB (or 256 MiB) in total, and every process of the sandbox is killed (non-root mode
    refuses the last two outright)."""
    memory_mb = 256 if hog is _MEMFDS else 512
    cfg = SandboxConfig(wall_s=60.0, cpu_s=60.0, memory_mb=memory_mb)
    result = run_sandboxed(hog + "print('all done')\n", "", cfg)
    refused = None if os.geteuid() == 0 else _NON_ROOT_REFUSES.get(request.node.callspec.id)
    if refused:
        assert refused in result.stderr, result  # (shared-map: its children fail, not it)
        return
    assert result.killed_reason == "memory", result
    assert not result.ok and "all done" not in result.stdout
    assert result.duration_s < 30, result  # killed on the limit, not at the wall clock


def test_memory_shared_after_a_fork_is_not_counted_twice():
    """A 300 MiB heap shared copy-on-write with 3 children is 300 MiB, not 1.2 GiB."""
    forks = (
        "import os, time\n"
        "heap = bytearray(300 * 2**20)\n"
        "for _ in range(3):\n"
        "    if os.fork() == 0:\n"
        "        time.sleep(1.5)\n"
        "        os._exit(0)\n"
        "for _ in range(3):\n"
        "    os.wait()\n"
        "print('all done')\n"
    )
    result = run_sandboxed(forks, "", SandboxConfig(wall_s=60.0, cpu_s=60.0, memory_mb=512))
    assert result.ok and "all done" in result.stdout, result


@pytest.mark.parametrize("reaped", ["waited", "never-waited"])
def test_cpu_time_is_limited_for_the_sandbox_as_a_whole(reaped):
    """4 children spinning 1.5 CPU seconds each stay under a per-process 2 s cap, but not
    under the sandbox's 2 s, whether their parent waits for them or ignores SIGCHLD (then
    no process's cutime ever holds their time)."""
    spin = (
        "import os, signal, time\n"
        + ("signal.signal(signal.SIGCHLD, signal.SIG_IGN)\n" if reaped == "never-waited" else "")
        + "for _ in range(4):\n"
        "    if os.fork() == 0:\n"
        "        end = time.process_time() + 1.5\n"
        "        while time.process_time() < end:\n"
        "            pass\n"
        "        os._exit(0)\n"
        "time.sleep(8)\n"
        "print('all children done')\n"
    )
    result = run_sandboxed(spin, "", SandboxConfig(wall_s=60.0, cpu_s=2.0))
    assert result.killed_reason == "cpu_time", result
    assert "all children done" not in result.stdout


def test_disk_is_limited_for_the_sandbox_as_a_whole():
    """100 files of 8 MiB each pass the per-file cap; the sandbox's 32 MiB disk stops them."""
    writer = (
        "written = 0\n"
        "try:\n"
        "    for i in range(100):\n"
        "        with open(f'f{i}', 'wb') as f:\n"
        "            f.write(b'x' * 8 * 2**20)\n"
        "        written += 1\n"
        "except OSError as exc:\n"
        "    print('stopped:', exc.strerror)\n"
        "print('written', written)\n"
    )
    cfg = SandboxConfig(wall_s=30.0, cpu_s=20.0, file_size_mb=8, disk_mb=32)
    result = run_sandboxed(writer, "", cfg)
    assert "stopped: No space left on device" in result.stdout, result
    written = int(result.stdout.split("written")[-1])
    assert written < 4, result


def test_an_abandoned_code_reward_leaves_no_sandbox_running():
    """``reward.timeout_s`` gives up on a call whose program runs 5 slow tests: the running
    one is killed and no further test starts."""
    marker = f"rlsys-abandoned-{uuid.uuid4().hex}"
    slow = (
        "import os, sys\n"
        "os.execv(sys.executable, [sys.executable, '-c', 'import time; time.sleep(60)', "
        f"{marker!r}])\n"
    )
    runs = []

    def counting_run(*args):
        runs.append(1)
        return run_sandboxed(*args)

    reward = build_reward("code_tests", RewardConfig(sandbox=SandboxConfig(wall_s=30.0)))
    scorer = RewardScorer([Component("code_tests", reward, 1.0, True)], timeout_s=1.0)
    tests = {"tests": [{"input": "", "output": "x"}] * 5}
    with pytest.MonkeyPatch.context() as patch:
        patch.setattr(code_reward, "run_sandboxed", counting_run)
        start = time.monotonic()
        (outcome,) = scorer.score([("p", f"```python\n{slow}```", tests)])
        returned = time.monotonic()
        assert returned - start < 5, returned - start
        assert outcome.reward == 0.0 and outcome.error and "timeout" in outcome.error
        time.sleep(max(0.0, returned + 1.0 - time.monotonic()))
        assert processes_with(marker) == []
        time.sleep(1.0)
    assert runs == [1]  # no test started after the call was abandoned
