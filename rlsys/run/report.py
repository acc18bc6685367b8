"""``rlsys report RUN_DIR``: one PNG per panel of a run's metrics.jsonl and an index.html
with the summary figures, in ``RUN_DIR/report/``. Reads files only (no Ray, no model)."""

from __future__ import annotations

import html
import json
import math
from dataclasses import dataclass
from pathlib import Path

# Learner-thread stages of a step (they add up to perf/step_s) are stacked; the pipeline's
# busy times run concurrently with them, so they are drawn as lines on top.
PIPELINE_STAGES = ("time/generation", "time/scoring", "time/reference")
WORKER_TIME = "time/rollout_worker_"
SUMMARY_SKIP = ("eval_history", "nodes", "scale_events")  # long lists: in the panels instead


class ReportError(Exception):
    """The run directory cannot be reported on; the message says why and what to do."""


@dataclass
class Panel:
    """One figure: ``keys`` on the left axis, ``right`` on a second axis."""

    name: str  # the PNG's file stem
    title: str
    ylabel: str
    keys: list[str]
    right: list[str] | None = None
    right_label: str = ""
    kind: str = "lines"  # lines | fractions (left axis 0..1) | stages | grid (a plot per key)


def load_metrics(path: Path) -> dict[int, dict[str, float]]:
    """``step -> {key: value}`` from a metrics.jsonl. A step logged twice merges (the final
    eval comes in its own record); a step lower than one already seen is a rewind (a resumed
    or recovered run), which drops the records from that step on. Nulls are left out."""
    steps: dict[int, dict[str, float]] = {}
    lines = path.read_text().splitlines()
    if not any(line.strip() for line in lines):
        raise ReportError(f"{path} is empty: the run logged no step yet; report on it later")
    for number, line in enumerate(lines, 1):
        if not line.strip():
            continue
        try:
            record = json.loads(line)
        except json.JSONDecodeError as exc:
            raise ReportError(
                f"{path} line {number} is not valid JSON ({exc.msg}: {line[:80]!r}); "
                "delete or repair that line (a run killed mid-write can leave it cut short)"
            ) from None
        step = record.get("step") if isinstance(record, dict) else None
        if not isinstance(step, int) or isinstance(step, bool):
            raise ReportError(
                f'{path} line {number} has no integer "step" ({line[:80]!r}); every line '
                "must be a JSON object with a step, as rlsys writes them: delete that line"
            )
        if steps and step < max(steps):  # rewound: the steps from here on are logged again
            for later in [s for s in steps if s >= step]:
                del steps[later]
        values = steps.setdefault(step, {})
        values.update({k: float(v) for k, v in record.items() if _numeric(k, v)})
    return dict(sorted(steps.items()))


def _numeric(key: str, value) -> bool:
    return (
        key not in ("step", "time")
        and isinstance(value, (int, float))
        and not isinstance(value, bool)
        and math.isfinite(value)
    )


def series(steps: dict[int, dict[str, float]]) -> dict[str, tuple[list[int], list[float]]]:
    """``key -> (steps, values)`` over the steps where the key has a value."""
    out: dict[str, tuple[list[int], list[float]]] = {}
    for step, values in steps.items():
        for key, value in values.items():
            xs, ys = out.setdefault(key, ([], []))
            xs.append(step)
            ys.append(value)
    return dict(sorted(out.items()))


def panels(keys: list[str]) -> list[Panel]:
    """The panels worth drawing for ``keys``: the fixed ones whose keys were logged, then a
    grid per family of keys none of them shows (``rm/*``, ``dpo/*``, ``buffer/*``...)."""
    has = set(keys)

    def present(*wanted: str, prefix: str = "") -> list[str]:
        found = [k for k in wanted if k in has]
        return found + [k for k in keys if prefix and k.startswith(prefix) and k not in found]

    stage_keys = [k for k in keys if k.startswith("time/") and not k.startswith(WORKER_TIME)]
    fixed = [
        Panel(
            "reward",
            "Reward",
            "mean reward",
            present(
                "rollout/reward_mean",
                "eval/reward_mean",
                "rollout/baseline_reward",
                "env/reward",
                prefix="reward/",
            ),
        ),
        Panel(
            "accuracy",
            "Accuracy (training samples and held-out eval)",
            "fraction correct",
            present(
                "rollout/accuracy",
                "eval/accuracy",
                "eval/validation_accuracy",
                "eval/pairwise_accuracy",
            ),
        ),
        Panel("loss", "Loss", "loss", present("train/loss", "sft/loss")),
        Panel("kl", "KL divergence (per token)", "KL", present("train/kl", "train/approx_kl")),
        Panel("entropy", "Policy entropy (per token)", "nats", present("train/entropy")),
        Panel(
            "response_length",
            "Response length",
            "tokens per response",
            present("rollout/response_tokens", "eval/response_tokens"),
        ),
        Panel("stage_times", "Time per stage", "seconds", stage_keys, kind="stages"),
        Panel(
            "rollout_workers",
            "Generation time per rollout worker",
            "busy seconds per step",
            present(prefix=WORKER_TIME),
        ),
        Panel(
            "throughput",
            "Throughput (evaluation excluded)",
            "tokens/s",
            present("perf/tokens_per_s"),
            present("perf/samples_per_s"),
            "samples/s",
        ),
        Panel(
            "idle_staleness",
            "Idle fractions and staleness",
            "idle fraction",
            [k for k in keys if k.startswith("pool/") and k.endswith("_idle_frac")],
            present("buffer/staleness_mean"),
            "staleness (policy versions)",
            kind="fractions",
        ),
    ]
    shown = {k for p in fixed for k in p.keys + (p.right or [])}
    if stage_keys:
        shown.add("perf/step_s")  # drawn in the stage panel
    chosen = [p for p in fixed if p.keys or p.right]
    families: dict[str, list[str]] = {}
    for key in keys:
        if key not in shown:
            families.setdefault(key.split("/")[0] if "/" in key else "other", []).append(key)
    for family, members in families.items():
        chosen.append(Panel(f"family_{_slug(family)}", f"{family}/*", "", members, kind="grid"))
    return chosen


def _slug(text: str) -> str:
    return "".join(c if c.isalnum() or c in "-_" else "_" for c in text)


def draw(panel: Panel, data: dict[str, tuple[list[int], list[float]]], path: Path) -> None:
    """Write ``panel`` as a PNG at ``path``."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    if panel.kind == "grid":
        fig = _grid(plt, panel, data)
    else:
        fig, ax = plt.subplots(figsize=(9, 5.4))
        if panel.kind == "stages":
            _stages(ax, panel.keys, data)
        else:
            for key in panel.keys:
                _line(ax, key, data[key])
        handles, labels = ax.get_legend_handles_labels()
        if panel.right:
            twin = ax.twinx()
            for key in panel.right:
                _line(twin, key, data[key], color=f"C{len(panel.keys) % 10}", style="--")
            twin.set_ylabel(panel.right_label)
            # Both axes of these panels (rates, fractions, staleness) start at 0, so their
            # curves compare; an all-zero staleness sits on the floor.
            twin.set_ylim(0, max(1.0, twin.get_ylim()[1]))
            ax.set_ylim(bottom=0)
            more = twin.get_legend_handles_labels()
            handles, labels = handles + more[0], labels + more[1]
        ax.set(title=panel.title, xlabel="step", ylabel=panel.ylabel)
        if panel.kind == "fractions":
            ax.set_ylim(-0.02, 1.02)
        ax.grid(alpha=0.3)
        ax.legend(  # below the plot, so it never hides a curve
            handles,
            labels,
            fontsize=8,
            loc="upper center",
            bbox_to_anchor=(0.5, -0.14),
            ncol=min(3, len(labels)),
            frameon=False,
        )
    fig.tight_layout()
    fig.savefig(path, dpi=100)
    plt.close(fig)


def _line(ax, key: str, xy: tuple[list[int], list[float]], color=None, style="-") -> None:
    xs, ys = xy
    sparse = len(xs) <= 30 or key.startswith("eval/")  # eval steps: mark each point
    ax.plot(xs, ys, style, color=color, label=key, marker="o" if sparse else None, ms=4)


def _stages(ax, keys: list[str], data: dict) -> None:
    """Learner-thread stages stacked (a stage absent at a step took 0 s); the pipeline's
    busy times and the whole step as lines."""
    stacked = [k for k in keys if k not in PIPELINE_STAGES]
    steps = sorted({x for k in stacked for x in data[k][0]})
    if stacked:
        columns = [dict(zip(*data[k], strict=True)) for k in stacked]
        ax.stackplot(
            steps,
            [[col.get(s, 0.0) for s in steps] for col in columns],
            labels=[k.removeprefix("time/") for k in stacked],
            alpha=0.8,
            step="mid",  # a stage of one step (an eval) stays on that step
        )
    for key in [k for k in keys if k in PIPELINE_STAGES]:
        xs, ys = data[key]
        ax.plot(xs, ys, "--", lw=1.5, label=f"{key.removeprefix('time/')} (pipeline, concurrent)")
    if "perf/step_s" in data:
        xs, ys = data["perf/step_s"]
        ax.plot(xs, ys, "k-", lw=1, label="step (perf/step_s)")


def _grid(plt, panel: Panel, data: dict):
    cols = min(3, len(panel.keys))
    rows = math.ceil(len(panel.keys) / cols)
    fig, axes = plt.subplots(rows, cols, figsize=(4 * cols, 2.6 * rows), squeeze=False)
    for ax, key in zip(axes.flat, panel.keys, strict=False):
        _line(ax, key, data[key])
        ax.set_title(key, fontsize=9)
        ax.tick_params(labelsize=7)
        ax.grid(alpha=0.3)
    for ax in list(axes.flat)[len(panel.keys) :]:
        ax.set_visible(False)
    fig.suptitle(panel.title)
    return fig


def _flat(summary: dict, prefix: str = "") -> list[tuple[str, object]]:
    rows: list[tuple[str, object]] = []
    for key, value in summary.items():
        if not prefix and key in SUMMARY_SKIP:
            continue
        if isinstance(value, dict):
            rows += _flat(value, f"{prefix}{key}.")
        else:
            rows.append((f"{prefix}{key}", value))
    return rows


def _cell(value) -> str:
    if isinstance(value, float):
        return f"{value:.4g}"
    if isinstance(value, (list, tuple)):
        value = json.dumps(value)
    return html.escape(str(value))


def latest_samples(run_dir: Path) -> list[dict]:
    """The rows of the last sample table in samples.jsonl (none without one; lines that do
    not parse are skipped: the table is an extra)."""
    path = run_dir / "samples.jsonl"
    rows = []
    for line in path.read_text().splitlines() if path.is_file() else []:
        try:
            rows.append(json.loads(line))
        except json.JSONDecodeError:
            continue
    rows = [r for r in rows if isinstance(r, dict) and "step" in r]
    return [r for r in rows if r["step"] == rows[-1]["step"]] if rows else []


def render_html(
    run_dir: Path, summary: dict | None, last: dict, pngs: list[Panel], samples: list[dict]
) -> str:
    """index.html: the summary table, the last value of every metric, the latest sample
    table, the panels."""
    parts = [
        "<!doctype html><html><head><meta charset='utf-8'>",
        f"<title>rlsys report: {html.escape(run_dir.name)}</title>",
        "<style>body{font-family:sans-serif;margin:2em}table{border-collapse:collapse}"
        "td,th{border:1px solid #ccc;padding:2px 8px;text-align:left}"
        "img{max-width:100%;display:block;margin:1em 0}</style></head><body>",
        f"<h1>{html.escape(run_dir.name)}</h1><p>{html.escape(str(run_dir))}</p>",
    ]
    if summary is None:
        parts.append("<p>No summary.json (the run is still going, or it stopped early).</p>")
    else:
        parts.append("<h2>Summary</h2><table>")
        parts += [f"<tr><th>{_cell(k)}</th><td>{_cell(v)}</td></tr>" for k, v in _flat(summary)]
        parts.append("</table>")
    parts.append("<h2>Last values</h2><table><tr><th>metric</th><th>step</th><th>value</th></tr>")
    parts += [
        f"<tr><td>{_cell(k)}</td><td>{s}</td><td>{_cell(v)}</td></tr>" for k, (s, v) in last.items()
    ]
    parts.append("</table>")
    if samples:
        columns = [c for c in samples[0] if c != "step"]
        parts.append(f"<h2>Samples at step {samples[0]['step']}</h2><table><tr>")
        parts += [f"<th>{_cell(c)}</th>" for c in columns] + ["</tr>"]
        for row in samples:
            cells = "".join(f"<td>{_cell(row.get(c, ''))}</td>" for c in columns)
            parts.append(f"<tr>{cells}</tr>")
        parts.append("</table>")
    parts.append("<h2>Panels</h2>")
    for panel in pngs:
        parts.append(f"<h3>{html.escape(panel.title)}</h3>")
        parts.append(f"<img src='{panel.name}.png' alt='{html.escape(panel.title)}'>")
    parts.append("</body></html>")
    return "\n".join(parts) + "\n"


def write_report(run_dir: str | Path) -> Path:
    """Write ``RUN_DIR/report/`` (a PNG per panel, index.html); returns index.html's path."""
    run = Path(run_dir).expanduser()
    if not run.is_dir():
        what = "is a file" if run.exists() else "does not exist"
        raise ReportError(
            f"{run} {what}; pass a run directory (<run.output_dir>/<run.name>, the one "
            "holding metrics.jsonl), e.g. outputs/train-20250101-120000"
        )
    metrics = run / "metrics.jsonl"
    if not metrics.is_file():
        runs = sorted(p.parent.name for p in run.glob("*/metrics.jsonl"))
        fix = (
            f"it holds the runs {', '.join(runs)}: pass one of those"
            if runs
            else "pass the directory of a run (<run.output_dir>/<run.name>), not a checkpoint"
        )
        raise ReportError(f"{run} has no metrics.jsonl; {fix}")
    data = series(load_metrics(metrics))
    if not data:
        raise ReportError(f"{metrics} holds steps but no numeric metric to plot")
    summary = None
    if (run / "summary.json").is_file():
        try:
            summary = json.loads((run / "summary.json").read_text())
        except json.JSONDecodeError as exc:
            raise ReportError(
                f"{run / 'summary.json'} is not valid JSON ({exc}); delete it to report "
                "on metrics.jsonl alone"
            ) from None
    out = run / "report"
    out.mkdir(exist_ok=True)
    for old in out.glob("*.png"):  # panels of an earlier report that may not apply now
        old.unlink()
    chosen = panels(list(data))
    for panel in chosen:
        draw(panel, data, out / f"{panel.name}.png")
    last = {k: (xs[-1], ys[-1]) for k, (xs, ys) in data.items()}
    index = out / "index.html"
    index.write_text(render_html(run.resolve(), summary, last, chosen, latest_samples(run)))
    return index
