"""``rlsys.models.saving.save_pretrained``: the Hugging Face directory it writes loads back to
the same weights (tied embeddings included), and a process that never imported DeepSpeed
still has not after a save (accelerate's unwrapping imports it otherwise: ~1.4 s a save)."""

from __future__ import annotations

import json
import subprocess
import sys
import textwrap


def test_a_save_round_trips_and_leaves_deepspeed_unimported(tmp_path):
    script = textwrap.dedent(
        """
        import json, sys
        import torch
        from transformers import AutoModelForCausalLM, Qwen2Config, Qwen2ForCausalLM
        from rlsys.models.saving import save_pretrained

        assert "deepspeed" not in sys.modules, "imported before the save: the check is moot"
        torch.manual_seed(0)
        config = Qwen2Config(vocab_size=40, hidden_size=32, intermediate_size=64,
                             num_hidden_layers=1, num_attention_heads=2, num_key_value_heads=2,
                             tie_word_embeddings=True)
        model = Qwen2ForCausalLM(config)
        save_pretrained(model, sys.argv[1])
        loaded = AutoModelForCausalLM.from_pretrained(sys.argv[1])
        same = all(torch.equal(a, b) for a, b in
                   zip(model.state_dict().values(), loaded.state_dict().values()))
        print(json.dumps({
            "deepspeed_imported": "deepspeed" in sys.modules,
            "same_weights": same,
            "tied": loaded.lm_head.weight.data_ptr() == loaded.model.embed_tokens.weight.data_ptr(),
            "architectures": loaded.config.architectures,
        }))
        """
    )
    out = subprocess.run(
        [sys.executable, "-c", script, str(tmp_path / "saved")],
        capture_output=True,
        text=True,
        timeout=120,
    )
    assert out.returncode == 0, out.stderr[-2000:]
    result = json.loads(out.stdout.strip().splitlines()[-1])
    assert result == {
        "deepspeed_imported": False,
        "same_weights": True,
        "tied": True,
        "architectures": ["Qwen2ForCausalLM"],
    }
