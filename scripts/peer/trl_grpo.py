"""TRL's GRPOTrainer on a workload spec, timed per step (run by scripts/bench_peer.py in the
peer's own venv: nothing from rlsys is imported here).

    python trl_grpo.py SPEC.json OUT.json

SPEC: model_dir, char_tokenizer (build the tokenizer from tokenizer.json as rlsys's built-in
char tokenizer), prompts (rendered text, chat template already applied), answers,
prompts_per_step, n_samples, max_new_tokens, steps (warm-up included), lr, temperature, seed,
threads, bf16 (TRL's ``bf16=True``: accelerate's autocast around the model's forward passes,
fp32 weights), torch_compile (the Trainer's ``torch_compile=True``: the model under
``torch.compile`` for its training forward passes). OUT: per-step seconds and mean completion tokens, as the trainer logged them.
"""

from __future__ import annotations

import json
import re
import sys
import tempfile
import time
from pathlib import Path


def main() -> int:
    spec = json.loads(Path(sys.argv[1]).read_text())
    import torch

    torch.set_num_threads(spec["threads"])
    from datasets import Dataset
    from transformers import AutoModelForCausalLM, PreTrainedTokenizerFast, TrainerCallback
    from trl import GRPOConfig, GRPOTrainer

    model_dir = spec["model_dir"]
    if spec["char_tokenizer"]:  # AutoTokenizer would load it as Qwen2's (spaces dropped)
        tokenizer = PreTrainedTokenizerFast(
            tokenizer_file=str(Path(model_dir) / "tokenizer.json"),
            pad_token="<pad>",
            eos_token="<eos>",
            unk_token="<unk>",
            padding_side="left",
        )
    else:
        from transformers import AutoTokenizer

        tokenizer = AutoTokenizer.from_pretrained(model_dir, padding_side="left")
        if tokenizer.pad_token is None:
            tokenizer.pad_token = tokenizer.eos_token
    model = AutoModelForCausalLM.from_pretrained(model_dir, dtype=torch.float32)
    dataset = Dataset.from_dict({"prompt": spec["prompts"], "answer": spec["answers"]})

    def last_number(completions, answer, **_):
        """1 if the reply's last number is the answer (a plain check: see bench_peer.py)."""
        out = []
        for text, want in zip(completions, answer, strict=True):
            numbers = re.findall(r"-?\d+", text)
            out.append(1.0 if numbers and numbers[-1].lstrip("0") == want.lstrip("0") else 0.0)
        return out

    steps: list[dict] = []

    class StepTimer(TrainerCallback):
        def on_step_begin(self, args, state, control, **kwargs):
            self.started = time.perf_counter()

        def on_step_end(self, args, state, control, **kwargs):
            steps.append({"step": state.global_step, "s": time.perf_counter() - self.started})

        def on_log(self, args, state, control, logs=None, **kwargs):
            if logs and "completions/mean_length" in logs and steps:
                steps[-1]["completion_tokens"] = logs["completions/mean_length"]

    with tempfile.TemporaryDirectory() as out_dir:
        config = GRPOConfig(
            output_dir=out_dir,
            per_device_train_batch_size=spec["prompts_per_step"] * spec["n_samples"],
            num_generations=spec["n_samples"],
            max_completion_length=spec["max_new_tokens"],
            num_iterations=1,
            beta=0.0,
            learning_rate=spec["lr"],
            temperature=spec["temperature"],
            max_steps=spec["steps"],
            logging_steps=1,
            report_to="none",
            save_strategy="no",
            use_cpu=True,
            bf16=spec.get("bf16", False),
            torch_compile=spec.get("torch_compile", False),
            seed=spec["seed"],
            dataloader_num_workers=0,
        )
        trainer = GRPOTrainer(
            model=model,
            reward_funcs=last_number,
            args=config,
            train_dataset=dataset,
            processing_class=tokenizer,
            callbacks=[StepTimer()],
        )
        trainer.train()
    Path(sys.argv[2]).write_text(json.dumps({"steps": steps, "trl": _version()}))
    return 0


def _version() -> str:
    import trl

    return trl.__version__


if __name__ == "__main__":
    sys.exit(main())
