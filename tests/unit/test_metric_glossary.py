"""docs/metrics.md documents every metric key the code can log: the keys written as string
literals in rlsys/ and the stage timers (a real run's keys are checked in
tests/e2e/test_metric_glossary_run.py)."""

from __future__ import annotations

import re
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]
FAMILIES = (
    "rollout|reward|env|train|policy|offpolicy|critic|buffer|pool|time|perf|eval|sft|rm|dpo|data"
)
# "family/name" or f"family/...{expr}..." in the source
LITERAL = re.compile(rf"""(f?)["']((?:{FAMILIES})/[^"'\s]*)["']""")
# the controller's stage timers: timer("train"), timer.seconds["gate_wait"] -> time/<stage>
TIMER = re.compile(r"""timer(?:\(|\.seconds\[)["'](\w+)["']""")
CONSUMERS = {"report.py", "tracking.py"}  # they read keys (and prefixes), they log none


def logged_keys() -> dict[str, str]:
    """key (an f-string's fields as ``{}``) -> the file that writes it."""
    found = {}
    for path in sorted((ROOT / "rlsys").rglob("*.py")):
        if path.name in CONSUMERS:
            continue
        source, where = path.read_text(), str(path.relative_to(ROOT))
        for is_f, key in LITERAL.findall(source):
            if not key.endswith("/"):  # a prefix is no key
                found[re.sub(r"\{[^}]*\}", "{}", key) if is_f else key] = where
        found.update({f"time/{stage}": where for stage in TIMER.findall(source)})
    return found


def test_the_scan_finds_the_keys_it_should():
    keys = logged_keys()
    for key in ("rollout/reward_mean", "time/train", "buffer/staleness_{}", "reward/{}"):
        assert key in keys, key
    assert len(keys) > 60


def test_every_logged_key_is_in_the_glossary(glossary):
    missing = []
    for key, source in logged_keys().items():
        family, name = key.split("/", 1)
        if name == "{}":  # f"train/{k}": names chosen at run time; the family must be there
            ok = any(k.startswith(f"{family}/") for k in glossary.keys)
        else:
            ok = glossary.covers(key.replace("{}", "0"))
        if not ok:
            missing.append(f"{key} ({source})")
    assert not missing, f"add these keys to docs/metrics.md: {missing}"


def test_patterns_match_whole_names_only(glossary):
    assert glossary.covers("reward/format") and glossary.covers("time/rollout_worker_3")
    assert glossary.covers("buffer/staleness_2") and not glossary.covers("buffer/nope")
    assert not glossary.covers("reward/a/b")
