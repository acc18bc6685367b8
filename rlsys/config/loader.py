"""Compose a run's config with Hydra: dataclass schema + YAML presets + CLI overrides."""

from __future__ import annotations

import difflib
import functools
import math
import os
import re
from pathlib import Path

import yaml
from hydra import compose, initialize_config_dir
from hydra.core.config_store import ConfigStore
from hydra.errors import ConfigCompositionException, HydraException
from omegaconf import DictConfig, OmegaConf
from omegaconf.errors import ConfigAttributeError, ConfigKeyError, OmegaConfBaseException

from rlsys.config.errors import ConfigError
from rlsys.config.schema import TrainConfig
from rlsys.config.shipped import shipped

SCHEMA_NAME = "rlsys_schema"


def conf_dir() -> Path:
    """The presets folder: $RLSYS_CONF_DIR, else the installed wheel's copy of ``conf/``, else
    the checkout's ``conf/`` (``rlsys.config.shipped``)."""
    env = os.environ.get("RLSYS_CONF_DIR")
    return Path(env) if env else shipped("conf")


def _register_schema() -> None:
    """Put the typed schema in Hydra's config store, once a process: rebuilding its structured
    node at every load cost ~0.1 s of a ~0.35 s config load on a 2-core EPYC."""
    if f"{SCHEMA_NAME}.yaml" not in ConfigStore.instance().repo:
        ConfigStore.instance().store(name=SCHEMA_NAME, node=TrainConfig)


def _all_keys(node: DictConfig, prefix: str = "") -> list[str]:
    keys = []
    for key, value in node.items():
        path = f"{prefix}{key}"
        keys.append(path)
        if isinstance(value, DictConfig):
            keys.extend(_all_keys(value, f"{path}."))
    return keys


def _explain(exc: Exception, overrides: list[str]) -> str:
    """Turn Hydra/OmegaConf errors into one line naming the key (and the preset file it came
    from) and the fix."""
    cause, seen = exc, [exc]
    while not isinstance(cause, OmegaConfBaseException):
        nxt = cause.__cause__ or cause.__context__
        if nxt is None or nxt in seen:
            break
        cause = nxt
        seen.append(cause)
    if not isinstance(cause, OmegaConfBaseException):
        cause = exc
    message = str(cause).strip().splitlines()[0] if str(cause).strip() else repr(cause)
    preset = re.match(r"In '([^']+)'", str(exc))
    where = f" (in preset {conf_dir() / preset.group(1)}.yaml)" if preset else ""
    full_key = getattr(cause, "full_key", None)
    if full_key and isinstance(cause, (ConfigKeyError, ConfigAttributeError)):
        known = _all_keys(OmegaConf.structured(TrainConfig))
        close = difflib.get_close_matches(str(full_key), known, n=1)
        hint = f"; did you mean '{close[0]}'?" if close else "; see `rlsys train --cfg job`"
        moved = _moved_key(str(full_key))
        if moved:
            hint = f"; it moved to '{moved}' (same meaning for both backends)"
        return f"unknown config key '{full_key}'{where}{hint}"
    if full_key:
        return f"bad value for config key '{full_key}'{where}: {message}"
    return f"{message}{where} (overrides: {' '.join(overrides) or 'none'})"


# Keys that were renamed: old suffix -> new suffix, under learner. or critic.
MOVED_KEYS = {"deepspeed.offload_optimizer": "offload"}


def _moved_key(key: str) -> str | None:
    group, _, rest = key.partition(".")
    return f"{group}.{MOVED_KEYS[rest]}" if rest in MOVED_KEYS else None


def _check_overrides(overrides: list[str], root: Path) -> None:
    """Name what Hydra would fail on obscurely: a missing presets folder, an override without
    a key, a preset that does not exist."""
    if not root.is_dir():
        source = f"RLSYS_CONF_DIR={root}" if os.environ.get("RLSYS_CONF_DIR") else str(root)
        raise ConfigError(
            f"{source} is not a directory of presets; point RLSYS_CONF_DIR at a folder like "
            "the repository's conf/ (config.yaml, task/, algorithm/, ...) or unset it"
        )
    for override in overrides:
        if override.startswith("~"):  # ~key or ~key=value: a deletion
            continue
        key, eq, value = override.partition("=")
        key = key.lstrip("+~")
        if not eq or not key:
            raise ConfigError(
                f"override {override!r} is not key=value (overrides: {' '.join(overrides)}); "
                "write e.g. task=arithmetic or data.batch_size=16"
            )
        if override.startswith("+"):
            _check_added_key(key, root)
        group = root / key
        if group.is_dir() and not (group / f"{value}.yaml").is_file():
            presets = sorted(p.stem for p in group.glob("*.yaml"))
            raise ConfigError(
                f"{key}={value}: no preset {group / value}.yaml; use one of {presets}"
            )


def _check_added_key(key: str, root: Path) -> None:
    """``+key=value`` / ``++key=value`` add a key the config lacks, which Hydra allows anywhere:
    ``+learner.world_sizee=2`` was taken silently and trained with the default. An added key
    must be a preset group (``+experiment=x``), Hydra's own (``hydra.*``), or lie under one of
    the schema's free-form dict fields (``+launcher.kuberay.env.A=1``)."""
    if key.startswith("hydra.") or (root / key).is_dir():
        return
    schema = OmegaConf.structured(TrainConfig)
    if any(key.startswith(f"{field}.") for field in _dict_fields(schema)):
        return
    known = _all_keys(schema)
    if key in known:
        return  # an existing key: Hydra itself says `+` cannot add it again
    close = difflib.get_close_matches(key, known, n=1)
    hint = f"did you mean '{close[0]}'?" if close else "see `rlsys train --cfg job` for the keys"
    raise ConfigError(
        f"unknown config key '{key}' (from +{key}); {hint} (`+` adds keys only under the "
        "free-form sections, e.g. reward.extra, algorithm.policy_loss_args, launcher.kuberay.env)"
    )


def _yaml_error(exc: yaml.YAMLError) -> str:
    mark = getattr(exc, "problem_mark", None)
    problem = getattr(exc, "problem", None) or str(exc).splitlines()[0]
    if mark is None:
        return f"invalid YAML in a preset: {problem}"
    return f"invalid YAML in {mark.name}, line {mark.line + 1}, column {mark.column + 1}: {problem}"


def _dict_fields(node: DictConfig, prefix: str = "") -> list[str]:
    """Keys of the schema's free-form dict fields (``placement.rollout_resources``...)."""
    keys = []
    for key in node:
        value = node._get_node(key)
        if isinstance(value, DictConfig):
            if OmegaConf.get_type(value) is dict:
                keys.append(f"{prefix}{key}")
            else:
                keys.extend(_dict_fields(value, f"{prefix}{key}."))
    return keys


@functools.cache
def _schema_dict_fields() -> tuple[str, ...]:
    """The schema's dict fields, found once per process (building the schema's node tree took
    a third of a ``load_config``: 0.33 of 0.96 s)."""
    return tuple(_dict_fields(OmegaConf.structured(TrainConfig)))


def _open_dicts(overrides: list[str]) -> list[str]:
    """``key={a:1}`` and ``key.a=1`` -> ``++key={a:1}`` / ``++key.a=1`` for the schema's dict
    fields: Hydra merges a dict override into the field, and struct mode refuses keys the
    default lacks; ``++`` lets the user's keys in (their values are still type-checked)."""
    fields = _schema_dict_fields()

    def in_dict(key: str) -> bool:
        return any(key == f or key.startswith(f"{f}.") for f in fields)

    return [f"++{o}" if in_dict(o.split("=", 1)[0]) else o for o in overrides]


# What a YAML file may expand to, in nodes, once its aliases are followed: far above any
# preset (the largest is a few hundred) and far below a "billion laughs" alias bomb, which
# expands to 10**9 nodes from a few lines and hung `rlsys train` for minutes
MAX_YAML_NODES = 100_000
_expansions: dict[tuple[str, float], int] = {}  # (path, mtime) -> nodes, once per process


def yaml_nodes(text) -> int:
    """How many nodes ``text`` (a string or an open file) holds with every alias expanded,
    counted from the parser's events (nothing is built, so a bomb costs what its text costs;
    counting stops past ``MAX_YAML_NODES``)."""
    sizes: dict[str, int] = {}  # anchor -> its node's expanded size
    stack: list[list] = [[None, 0]]  # per open collection: [anchor, size so far]
    for event in yaml.parse(text):
        if isinstance(event, yaml.AliasEvent):
            stack[-1][1] += sizes.get(event.anchor, 1)
        elif isinstance(event, yaml.ScalarEvent):
            stack[-1][1] += 1
            if event.anchor:
                sizes[event.anchor] = 1
        elif isinstance(event, yaml.CollectionStartEvent):
            stack.append([event.anchor, 1])
        elif isinstance(event, yaml.CollectionEndEvent):
            anchor, size = stack.pop()
            if anchor:
                sizes[anchor] = size
            stack[-1][1] += size
        if stack[0][1] > MAX_YAML_NODES:
            break
    return stack[0][1]


def check_yaml_size(path: Path) -> None:
    """Refuse a YAML file whose aliases expand past ``MAX_YAML_NODES`` nodes (checked once
    per file and modification time)."""
    key = (str(path), path.stat().st_mtime)
    if key not in _expansions:
        try:
            with path.open(encoding="utf-8") as fh:
                _expansions[key] = yaml_nodes(fh)
        except (yaml.YAMLError, UnicodeDecodeError):
            _expansions[key] = 0  # not YAML: Hydra says so where it reads the file
    if _expansions[key] > MAX_YAML_NODES:
        raise ConfigError(
            f"{path} expands to more than {MAX_YAML_NODES:,} nodes once its YAML aliases "
            "(*name) are followed: an alias bomb, not a config; remove the aliases or the file"
        )


def compose_config(overrides: list[str], config_name: str = "config") -> DictConfig:
    """Compose ``conf/<config_name>.yaml`` with overrides; raises ConfigError on bad input."""
    _register_schema()
    root = conf_dir()
    _check_overrides(list(overrides), root)
    for path in sorted(root.rglob("*.yaml")):  # presets Hydra may read: no alias bombs
        check_yaml_size(path)
    try:
        with initialize_config_dir(config_dir=str(root.resolve()), version_base="1.3"):
            return compose(config_name=config_name, overrides=_open_dicts(list(overrides)))
    except (ConfigCompositionException, HydraException, OmegaConfBaseException) as exc:
        raise ConfigError(_explain(exc, overrides)) from exc
    except yaml.YAMLError as exc:
        raise ConfigError(_yaml_error(exc)) from exc


def refuse_non_finite(value, key: str = "") -> None:
    """NaN and infinities are refused for every number of the config, nested ones too (a
    ``value <= 0`` check lets NaN through: ``learner.optim.lr=nan`` failed in the learner half
    a minute after Ray started)."""
    if isinstance(value, dict):
        for name, item in value.items():
            refuse_non_finite(item, f"{key}.{name}" if key else str(name))
    elif isinstance(value, list):
        for index, item in enumerate(value):
            refuse_non_finite(item, f"{key}[{index}]")
    elif isinstance(value, float) and not math.isfinite(value):
        raise ConfigError(f"{key}={value} is not a finite number; give {key} a finite value")


def to_typed(cfg: DictConfig) -> TrainConfig:
    """Instantiate the dataclasses (running every ``__post_init__`` check), after refusing
    non-finite numbers."""
    try:
        refuse_non_finite(OmegaConf.to_container(cfg, resolve=True))
        typed = OmegaConf.to_object(cfg)
    except OmegaConfBaseException as exc:
        raise ConfigError(_explain(exc, [])) from exc
    assert isinstance(typed, TrainConfig)
    return typed


def read_config(overrides: list[str] | None = None, config_name: str = "config") -> TrainConfig:
    """Compose a run config and check its values (its names and how its sections fit
    together are ``rlsys.resolve.load_config``'s, which programs call)."""
    return to_typed(compose_config(overrides or [], config_name))


def read_run_config(path: str | Path) -> TrainConfig:
    """The config a run wrote (``<run_dir>/config.yaml``), its values checked again
    (``rlsys.resolve.load_run_config`` checks the rest)."""
    try:
        check_yaml_size(Path(path))
        saved = OmegaConf.load(path)
    except (OSError, yaml.YAMLError) as exc:
        raise ConfigError(f"{path} does not read as a run config ({exc})") from exc
    try:
        merged = OmegaConf.merge(OmegaConf.structured(TrainConfig), saved)
    except OmegaConfBaseException as exc:
        raise ConfigError(f"{path}: {_explain(exc, [])}") from exc
    return to_typed(merged)


def to_yaml(cfg: TrainConfig) -> str:
    """The resolved config as YAML (what goes to ``<run_dir>/config.yaml``)."""
    return OmegaConf.to_yaml(OmegaConf.structured(cfg))
