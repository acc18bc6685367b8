"""Shared fixtures: a tiny built-in model, a local Ray on CPU, and the GPU marker's skip."""

from __future__ import annotations

import contextlib
import os
import socket
from pathlib import Path

import pytest

# No test reads outside the checkout: every cache the suite fills (rlsys's built-in models and
# warm starts, vLLM's compile cache, DeepSpeed's JIT-built ops, torch.compile's kernels) lives
# under .cache/ here, set before anything starts a process or Ray, which inherit it. A fresh
# clone pays each once, as CI does; a developer's ~/.cache neither helps nor hides anything.
CACHE = Path(__file__).resolve().parents[1] / ".cache"
os.environ["XDG_CACHE_HOME"] = str(CACHE)
os.environ["RLSYS_CACHE_DIR"] = str(CACHE / "rlsys")
os.environ["TORCH_EXTENSIONS_DIR"] = str(CACHE / "torch_extensions")
os.environ["TORCHINDUCTOR_CACHE_DIR"] = str(CACHE / "torchinductor")
os.environ.setdefault("TRANSFORMERS_VERBOSITY", "error")
os.environ.setdefault("HF_HUB_DISABLE_PROGRESS_BARS", "1")
os.environ.setdefault("TOKENIZERS_PARALLELISM", "false")


def digit_fraction(prompt: str, completion: str, metadata: dict) -> float:
    """A dense test reward a random model already earns sometimes: the share of digits, so
    groups have reward variance from the first step."""
    return sum(c.isdigit() for c in completion) / max(len(completion), 1)


def huge_digit_fraction(prompt: str, completion: str, metadata: dict) -> float:
    """``digit_fraction`` x 1e38: finite rewards whose unnormalised advantages overflow the
    gradient norm (a diverging run, for the non-finite guard)."""
    return 1e38 * digit_fraction(prompt, completion, metadata)


def digit_lead(prompt: str, completion: str, metadata: dict) -> dict:
    """``digit_fraction``, judged correct when the reply starts with a digit: a verdict a
    random model reaches in some samples of some groups (for the replay store)."""
    return {
        "reward": digit_fraction(prompt, completion, metadata),
        "correct": completion[:1].isdigit(),
    }


def _register_test_rewards() -> None:
    from rlsys.rewards import REWARDS

    for fn in (digit_fraction, huge_digit_fraction, digit_lead):
        if fn.__name__ not in REWARDS.names():
            REWARDS.register(fn.__name__)(fn)


_register_test_rewards()


# In CI (CI=true) .ci/run installs everything the suite needs, so a skip there means a test
# that should have run did not: it fails instead. Only tests that need a GPU may skip.
IN_CI = os.environ.get("CI") == "true"


def _skip_reason(report) -> str:
    """Why a skipped test report skipped, without pytest's "Skipped: " prefix."""
    reason = report.longrepr[2] if isinstance(report.longrepr, tuple) else report.longrepr
    return str(reason).removeprefix("Skipped: ")


@pytest.hookimpl(hookwrapper=True)
def pytest_runtest_makereport(item, call):
    outcome = yield
    report = outcome.get_result()
    if IN_CI and report.skipped and "gpu" not in item.keywords and not hasattr(report, "wasxfail"):
        reason = _skip_reason(report)
        report.outcome = "failed"
        report.longrepr = f"CI=true expects this test to run, but it skipped: {reason}"


_TIERS: dict[str, tuple[int, float]] = {}  # tier (tests/<tier>/...) -> (tests, seconds)


def pytest_runtest_logreport(report):
    parts = report.nodeid.split("/")
    tier = parts[1] if len(parts) > 2 and parts[0] == "tests" else "other"
    count, seconds = _TIERS.get(tier, (0, 0.0))
    _TIERS[tier] = (count + (report.when == "setup"), seconds + report.duration)


def pytest_terminal_summary(terminalreporter):
    """Seconds per tier (set-up, call and tear-down of its tests), then one line that lists
    every skipped test and why (none may hide in the log)."""
    if not _TIERS:  # nothing ran (--collect-only)
        return
    for tier, (count, seconds) in sorted(_TIERS.items()):
        terminalreporter.write_line(f"tier {tier}: {count} tests, {seconds:.0f} s")
    skipped = terminalreporter.stats.get("skipped", [])
    reasons = [f"{report.nodeid} ({_skip_reason(report)})" for report in skipped]
    terminalreporter.write_line(f"skipped tests: {len(reasons)}: " + "; ".join(reasons))
    path = os.environ.get("RLSYS_SKIP_REPORT")
    if path:  # scripts/test.sh repeats the list as the last line of its output
        with open(path, "a") as f:
            f.writelines(f"{r}\n" for r in reasons)


def pytest_collection_modifyitems(config, items):
    try:
        import torch

        has_gpu = torch.cuda.is_available()
    except ImportError:
        has_gpu = False
    if has_gpu:
        return
    skip = pytest.mark.skip(reason="needs a CUDA GPU; this machine has none")
    for item in items:
        if "gpu" in item.keywords:
            item.add_marker(skip)


@pytest.fixture(scope="session")
def tiny_model_dir() -> str:
    """The default built-in tiny model (built once into the rlsys cache)."""
    from rlsys.config.schema import ModelConfig
    from rlsys.models.loading import resolve_model_path

    return resolve_model_path(ModelConfig())


@pytest.fixture
def one_rank(tmp_path):
    """A one-process gloo group, for a learner backend built in the test's own process."""
    import torch.distributed as dist

    dist.init_process_group(
        "gloo", init_method=f"file://{tmp_path / 'store'}", rank=0, world_size=1
    )
    yield
    dist.destroy_process_group()


@pytest.fixture(scope="session")
def tiny_vl_dir() -> str:
    """The built-in tiny vision-language model (a Qwen2-VL; built once into the rlsys cache)."""
    from rlsys.config.schema import ModelConfig
    from rlsys.models.loading import resolve_model_path

    return resolve_model_path(ModelConfig(path="builtin:tiny-vl"))


@contextlib.contextmanager
def _lean_session_ray():
    """Start the Ray of a ``ray.init`` inside with its dashboard agent on a free port and no
    log monitor; ``ray.init`` has an argument for neither (both are RayParams fields only).

    Every local Ray's agent listens on 52365 by default. While the session's Ray held that
    port, each ``rlsys train`` the suite starts in a subprocess waited for its own agent to
    give up binding it (five retries, about 3.3 s) before the raylet came up: 3-4 s of each of
    the suite's subprocess runs (measured 2026-11-29: ``ray.init`` 7.1-8.5 s beside a Ray
    holding the port, 3.0-5.1 s with it free).

    The log monitor forwards workers' output to a driver that asks for it, and this one does
    not (``log_to_driver=False``); yet it rescans every log file the session's workers left,
    so its cost grows with each actor the suite starts: 94 s of CPU over the first 37 minutes
    of a CI run (2026-12-02, a 2-core Zen 3 EPYC), and 4% of a core at idle after 40 actors."""
    from ray._private import parameter  # private: these are RayParams fields only

    init = parameter.RayParams.__init__
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        port = sock.getsockname()[1]

    def init_lean(self, *args, **kwargs):
        init(self, *args, **kwargs)
        self.dashboard_agent_listen_port = port
        self.include_log_monitor = False

    parameter.RayParams.__init__ = init_lean
    try:
        yield
    finally:
        parameter.RayParams.__init__ = init


@pytest.fixture(scope="session")
def ray_cpu():
    """A local Ray with 2 CPUs for the whole session (its dashboard agent off Ray's default
    port, which the suite's subprocess runs then find free, and no log monitor)."""
    import ray

    if not ray.is_initialized():
        with _lean_session_ray():
            ray.init(
                num_cpus=2,
                include_dashboard=False,
                log_to_driver=False,
                runtime_env={"env_vars": {"TRANSFORMERS_VERBOSITY": "error"}},
            )
    yield ray
    ray.shutdown()


@pytest.fixture
def run_controller(ray_cpu, tiny_model_dir, tmp_path):
    """``run(overrides) -> (summary, step records)``: the controller on real pools (the roles
    the config's algorithm needs) from the tiny model, metrics in ``tmp_path``."""
    import json

    from rlsys.config.schema import ModelConfig
    from rlsys.data.tasks import load_task
    from rlsys.models.loading import load_tokenizer, resolve_model_path
    from rlsys.placement.resources import Roles
    from rlsys.resolve import load_config
    from rlsys.run.tracking import Tracker
    from rlsys.trainers.rl.controller import Controller
    from rlsys.workers.pools import start_pools

    def run(overrides: list[str], before=None) -> tuple[dict, list[dict]]:
        """``before(cfg, pools, tokenizer, task)``, if given, runs on the pools first (e.g. a
        warm-up SFT)."""
        cfg = load_config(overrides)
        model_dir = tiny_model_dir  # the session's, unless the overrides name another model
        if cfg.model.path != ModelConfig().path:
            model_dir = resolve_model_path(cfg.model)
        tokenizer, task = load_tokenizer(model_dir), load_task(cfg.task, 0)
        pools = start_pools(cfg, model_dir, Roles.for_rl(cfg))
        tracker = Tracker(tmp_path, cfg.tracking, "t", {}, cfg.trainer.total_steps)
        try:
            if before is not None:
                before(cfg, pools, tokenizer, task)
            summary = Controller(cfg, pools, tokenizer, task, tracker).run()
        finally:
            tracker.close()
            pools.shutdown()
        lines = (tmp_path / "metrics.jsonl").read_text().splitlines()
        return summary, [r for r in map(json.loads, lines) if r["step"] > 0]

    return run


@pytest.fixture(scope="session")
def glossary():
    """docs/metrics.md's keys (``.keys``) and ``covers(key)``: whether it documents ``key``,
    exactly or by a pattern such as ``reward/<name>``."""
    import re
    from pathlib import Path
    from types import SimpleNamespace

    text = (Path(__file__).resolve().parents[1] / "docs" / "metrics.md").read_text()
    keys = re.findall(r"^\| `([^`]+)` \|", text, flags=re.MULTILINE)
    patterns = [
        re.compile("".join("[^/]+" if p.startswith("<") else re.escape(p) for p in parts))
        for parts in (re.split(r"(<[^>]+>)", key) for key in keys)
    ]
    return SimpleNamespace(keys=keys, covers=lambda key: any(p.fullmatch(key) for p in patterns))
