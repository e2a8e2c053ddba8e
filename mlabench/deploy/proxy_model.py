"""Model folders a GPU can serve without weights (``vllm serve DIR --load-format dummy``).

A TPOT measured on a toy model says little: attention is a share of a decode step, and the share
depends on how many weight bytes the rest of the step reads.  :func:`kimi_k3_tp8_proxy` is a dense
``DeepseekV2ForCausalLM`` with Kimi K3's per-rank MLA attention at TP8 (12 heads, the MLA widths
of ``configs/models/kimi-k3.toml``) and the layer count of the public Kimi K2 config, whose MLP
layers are sized so that one decode step at batch 1 reads about as many weight bytes as one TP8
rank of the real model (:func:`rank_decode_params`); no MoE kernel is needed.  :func:`tiny_proxy`
is a 4-layer one for quick runs.

The arithmetic, per rank at tensor parallelism ``tp`` (vLLM's sharding: the MLA down-projections
``q_a``/``kv_a`` and the router are replicated, ``q_b``, ``kv_b``, ``o_proj``, each expert's
three matrices and ``lm_head`` are split ``tp`` ways):

- attention, every layer: ``d (q_lora + kv_lora + rope) + q_lora H (nope + rope) / tp
  + kv_lora H (nope + v) / tp + H v d / tp``;
- MoE layers: ``(top_k + shared) 3 d moe_inter / tp + d experts`` (router);
- dense layers: ``3 d inter / tp``; ``lm_head``: ``vocab d / tp``.

Kimi K2's config (``moonshotai/Kimi-K2-Instruct``: 61 layers, the first dense, d 7168, q_lora
1536, MoE intermediate 2048, 384 experts, 8 per token plus 1 shared, vocab 163840) with K3's 96
heads gives 5.24 G parameters a step per rank, 10.5 GB at bf16.  At batch 16 the real model reads
more (different tokens pick different experts), which a dense proxy cannot show.
"""

from __future__ import annotations

import itertools
import json
import string
from dataclasses import asdict, dataclass
from pathlib import Path

from mlabench.errors import ConfigError
from mlabench.files import make_dir, user_path, write_text

#: Public numbers of moonshotai/Kimi-K2-Instruct's config.json (DeepSeek-V3 architecture); Kimi
#: K3's head count (96) is from the ROCm 12-head pull request (shared reference).
KIMI_K2_PUBLIC = {
    "num_hidden_layers": 61, "first_k_dense_replace": 1, "hidden_size": 7168, "q_lora_rank": 1536,
    "kv_lora_rank": 512, "qk_rope_head_dim": 64, "qk_nope_head_dim": 128, "v_head_dim": 128,
    "intermediate_size": 18432, "moe_intermediate_size": 2048, "n_routed_experts": 384,
    "num_experts_per_tok": 8, "n_shared_experts": 1, "vocab_size": 163840,
}
KIMI_K3_HEADS = 96


def attention_params(d: int, heads: int, q_lora: int, kv_lora: int, rope: int, nope: int, v: int,
                     tp: int = 1) -> int:
    """Weights one rank reads for one MLA layer's attention in a decode step (module docstring)."""
    return (d * (q_lora + kv_lora + rope) + q_lora * heads * (nope + rope) // tp
            + kv_lora * heads * (nope + v) // tp + heads * v * d // tp)


def rank_decode_params(config: dict[str, int], heads: int, tp: int) -> int:
    """Weights one of ``tp`` ranks reads in a batch-1 decode step of a DeepSeek-V3-style MoE model
    with ``heads`` attention heads (``config``: :data:`KIMI_K2_PUBLIC`'s keys)."""
    c = config
    d, layers, dense = c["hidden_size"], c["num_hidden_layers"], c["first_k_dense_replace"]
    attn = attention_params(d, heads, c["q_lora_rank"], c["kv_lora_rank"], c["qk_rope_head_dim"],
                            c["qk_nope_head_dim"], c["v_head_dim"], tp)
    moe = ((c["num_experts_per_tok"] + c["n_shared_experts"]) * 3 * d * c["moe_intermediate_size"] // tp
           + d * c["n_routed_experts"])
    mlp_dense = 3 * d * c["intermediate_size"] // tp
    return layers * attn + (layers - dense) * moe + dense * mlp_dense + c["vocab_size"] * d // tp


@dataclass(frozen=True)
class ProxyModel:
    """A dense ``DeepseekV2ForCausalLM`` with MLA attention, served with dummy weights."""

    name: str
    num_hidden_layers: int
    hidden_size: int
    num_attention_heads: int
    intermediate_size: int
    vocab_size: int
    q_lora_rank: int | None = 1536
    kv_lora_rank: int = 512
    qk_rope_head_dim: int = 64
    qk_nope_head_dim: int = 128
    v_head_dim: int = 128
    max_position_embeddings: int = 131072

    def decode_params(self) -> int:
        """Weights read in a batch-1 decode step: every layer's attention and MLP, and lm_head."""
        q_lora = self.q_lora_rank or 0
        d = self.hidden_size
        attn = attention_params(d, self.num_attention_heads, q_lora, self.kv_lora_rank,
                                self.qk_rope_head_dim, self.qk_nope_head_dim, self.v_head_dim)
        if not self.q_lora_rank:  # q_proj d -> heads x 192 instead of q_a then q_b
            attn += d * self.num_attention_heads * (self.qk_nope_head_dim + self.qk_rope_head_dim)
        mlp = 3 * d * self.intermediate_size
        return self.num_hidden_layers * (attn + mlp) + self.vocab_size * d

    def kv_bytes_per_token(self, dtype_bytes: int = 2) -> int:
        """Latent cache bytes one token takes over all layers (``kv_lora + rope`` values each)."""
        return self.num_hidden_layers * (self.kv_lora_rank + self.qk_rope_head_dim) * dtype_bytes

    def config_json(self) -> dict:
        """The model's ``config.json``: every layer dense (``first_k_dense_replace`` = layers)."""
        return {
            "architectures": ["DeepseekV2ForCausalLM"], "model_type": "deepseek_v2",
            "hidden_size": self.hidden_size, "intermediate_size": self.intermediate_size,
            "num_hidden_layers": self.num_hidden_layers,
            "num_attention_heads": self.num_attention_heads,
            "num_key_value_heads": self.num_attention_heads,
            "q_lora_rank": self.q_lora_rank, "kv_lora_rank": self.kv_lora_rank,
            "qk_rope_head_dim": self.qk_rope_head_dim, "qk_nope_head_dim": self.qk_nope_head_dim,
            "v_head_dim": self.v_head_dim,
            # MoE fields the config class requires; no layer is MoE (first_k_dense_replace)
            "moe_intermediate_size": 256, "n_routed_experts": 4, "n_shared_experts": 1,
            "num_experts_per_tok": 2, "first_k_dense_replace": self.num_hidden_layers,
            "moe_layer_freq": 1, "topk_method": "greedy", "n_group": 1, "topk_group": 1,
            "scoring_func": "softmax", "norm_topk_prob": False, "routed_scaling_factor": 1.0,
            "vocab_size": self.vocab_size, "max_position_embeddings": self.max_position_embeddings,
            "rope_theta": 10000.0, "rope_scaling": None, "rms_norm_eps": 1e-6, "hidden_act": "silu",
            "attention_bias": False, "tie_word_embeddings": False, "bos_token_id": 0,
            "eos_token_id": 1, "torch_dtype": "bfloat16",
            "mlabench_proxy": {**asdict(self), "decode_weight_params": self.decode_params()},
        }


def kimi_k3_tp8_proxy(tp: int = 8, intermediate_multiple: int = 128) -> ProxyModel:
    """The Kimi K3 TP8 proxy: 12 heads, 61 layers, hidden 7176 (7168 rounded up to a multiple of
    the 12 heads, which transformers requires), vocab 163840 / tp (one rank's ``lm_head`` slice),
    and the MLP intermediate size, a multiple of ``intermediate_multiple``, whose decode step reads
    the weights closest to :func:`rank_decode_params` of Kimi K2's config with 96 heads."""
    heads = KIMI_K3_HEADS // tp
    target = rank_decode_params(KIMI_K2_PUBLIC, KIMI_K3_HEADS, tp)
    base = ProxyModel("kimi-k3-tp8-proxy", KIMI_K2_PUBLIC["num_hidden_layers"],
                      -(-KIMI_K2_PUBLIC["hidden_size"] // heads) * heads, heads, 0,
                      KIMI_K2_PUBLIC["vocab_size"] // tp)
    per_unit = 3 * base.hidden_size * base.num_hidden_layers  # params per unit of intermediate
    inter = round((target - base.decode_params()) / per_unit / intermediate_multiple) * intermediate_multiple
    return ProxyModel(**{**asdict(base), "intermediate_size": max(intermediate_multiple, inter)})


def tiny_proxy() -> ProxyModel:
    """A 4-layer, 12-head proxy (hidden 1536, vocab 32000) for quick runs: starts in seconds."""
    return ProxyModel("tiny-mla-12h", 4, 1536, 12, 4096, 32000, q_lora_rank=None)


PROXIES = {"kimi-k3-tp8": kimi_k3_tp8_proxy, "tiny": tiny_proxy}


def proxy_by_name(name: str) -> ProxyModel:
    """A proxy of :data:`PROXIES`; :class:`ConfigError` naming the known ones otherwise."""
    if name not in PROXIES:
        raise ConfigError(f"unknown proxy model {name!r}; known: {', '.join(PROXIES)}")
    return PROXIES[name]()


def vocabulary(size: int) -> list[str]:
    """``size`` tokens: three specials, then distinct lowercase words ``a``..``z``, ``aa``.., each
    with the Metaspace prefix, so every id decodes to a word that encodes back to that one id
    (``vllm bench serve --dataset-name random`` decodes random ids and encodes them again)."""
    specials = ["<s>", "</s>", "<unk>"]
    words = ("".join(t) for n in itertools.count(1) for t in itertools.product(string.ascii_lowercase, repeat=n))
    return specials + ["\u2581" + w for w in itertools.islice(words, size - len(specials))]


def write_model_folder(proxy: ProxyModel, out_dir: str | Path) -> Path:
    """Write ``config.json``, ``generation_config.json`` and a word-level tokenizer of exactly
    ``vocab_size`` tokens (``tokenizer.json``, ``tokenizer_config.json``) into ``out_dir``.

    Needs the ``tokenizers`` package (vLLM brings it); raises :class:`DependencyError` without it
    and :class:`ConfigError` when ``out_dir`` exists and is not empty, :class:`FileAccessError`
    when it cannot be made or written (a file in the way of its parent)."""
    from mlabench.extras import require

    out = Path(out_dir)
    if out.exists() and not out.is_dir():
        raise ConfigError(f"{out} is a file: give a new folder")
    if out.exists() and any(out.iterdir()):
        raise ConfigError(f"{out} exists and is not empty: give a new folder")
    above = next((p for p in out.parents if p.exists()), None)  # the nearest part of its path that exists
    if above is not None and not above.is_dir():
        raise ConfigError(f"{out}: {above} is a file, not a folder: give a new folder")
    tk = require("tokenizers")
    make_dir(out, "model folder")
    vocab = {token: i for i, token in enumerate(vocabulary(proxy.vocab_size))}
    tok = tk.Tokenizer(tk.models.WordLevel(vocab=vocab, unk_token="<unk>"))
    tok.pre_tokenizer = tk.pre_tokenizers.Metaspace(replacement="\u2581", prepend_scheme="always")
    tok.decoder = tk.decoders.Metaspace(replacement="\u2581", prepend_scheme="always")
    tok.add_special_tokens(["<s>", "</s>", "<unk>"])
    with user_path(out / "tokenizer.json", "tokenizer file"):
        tok.save(str(out / "tokenizer.json"))
    files = {
        "config.json": proxy.config_json(),
        "generation_config.json": {"bos_token_id": 0, "eos_token_id": 1},
        "tokenizer_config.json": {"tokenizer_class": "PreTrainedTokenizerFast", "bos_token": "<s>",
                                  "eos_token": "</s>", "unk_token": "<unk>",
                                  "model_max_length": proxy.max_position_embeddings},
    }
    for name, body in files.items():
        write_text(out / name, json.dumps(body, indent=2) + "\n", "model file")
    return out
