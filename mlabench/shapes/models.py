"""Models: the presets under ``configs/models/``, a Hugging Face ``config.json``, the local heads at a
tensor-parallel size, and the decode softmax scale a model's config sets.

The softmax scale is ``(qk_nope_head_dim + qk_rope_head_dim) ** -0.5``, times ``mscale ** 2`` under
YaRN rope scaling, where ``mscale = 0.1 * mscale_all_dim * ln(factor) + 1`` (1 when ``factor <= 1``
or ``mscale_all_dim`` is 0), unless ``apply_yarn_scaling`` is false.  Sources: DeepSeek-V3's
``modeling_deepseek.py`` (``yarn_get_mscale``, ``DeepseekV3Attention.__init__``) and vLLM's
``deepseek_v2.py``, which reads ``apply_yarn_scaling`` from the rope settings (default true) and
skips the mscale when it is false (vLLM PR 41569, SGLang PR 26203).  ``mscale`` (without
``_all_dim``), ``beta_fast``, ``beta_slow``, ``original_max_position_embeddings``, ``rope_theta``
and ``truncate`` change the rotary frequencies or the cos/sin magnitude, which the inputs carry, and
not the scale.  Any other rope field, and a top-level field that looks like an attention scale
(:data:`SCALE_LIKE`), is refused: its effect on the scale would be a guess.
"""

from __future__ import annotations

import math
import re
from pathlib import Path
from typing import Any

from pydantic import BaseModel, ConfigDict, Field, ValidationError, model_validator

from mlabench.errors import ConfigError, ShapeError, UnknownModelError
from mlabench.files import configs_dir, read_json, read_toml, validation_line

#: Rope types whose effect on the decode softmax scale is known: ``default`` (none) and YaRN, whose
#: mscale multiplies it (DeepSeek-V3's ``modeling_deepseek.py``; vLLM calls it ``deepseek_yarn``).
ROPE_TYPES = ("default", "yarn", "deepseek_yarn")
#: Rope settings understood: the type, the three that set the scale, and those that only change
#: the rotary embedding (module docstring).
ROPE_FIELDS = ("type", "rope_type", "factor", "mscale_all_dim", "apply_yarn_scaling", "mscale", "beta_fast",
               "beta_slow", "original_max_position_embeddings", "rope_theta", "truncate")
#: Top-level config fields that look like a change to the attention scores (e.g. Gemma's
#: ``query_pre_attn_scalar``, Granite's ``attention_multiplier``, a plain ``softmax_scale``).
SCALE_LIKE = re.compile(r"scal|multiplier|softcap|temperature", re.IGNORECASE)
#: Top-level fields matching :data:`SCALE_LIKE` that do not touch attention: DeepSeek-V3's MoE
#: router weight and the rope settings themselves.
NOT_ATTENTION = ("routed_scaling_factor", "rope_scaling", "apply_yarn_scaling")
#: Fields of a sparse-attention MLA model's token selector (DeepSeek-V3.2's lightning indexer, its
#: ``config.json``; vLLM turns on its sparse MLA path when ``index_topk`` is set): past ``index_topk``
#: tokens, each query reads only the tokens the indexer selects, not the whole latent cache.
SPARSE_FIELDS = ("index_topk", "index_n_heads", "index_head_dim")


class ModelSpec(BaseModel):
    """The MLA attention fields of a model, named as in its Hugging Face ``config.json``."""

    model_config = ConfigDict(frozen=True, extra="ignore")

    name: str = Field(description="Preset name or the config's model_type.")
    num_attention_heads: int = Field(description="Query heads of the whole model (before TP).")
    kv_lora_rank: int = 512
    qk_rope_head_dim: int = 64
    qk_nope_head_dim: int = 128
    rope_scaling: dict[str, Any] | None = Field(None, description="HF rope_scaling (YaRN for V3).")
    rope_parameters: dict[str, Any] | None = Field(
        None, description="The same settings as newer transformers versions save them (with rope_theta).")
    apply_yarn_scaling: bool | None = Field(
        None, description="False: YaRN's mscale is not applied to the softmax scale (also read inside the rope "
        "settings, where vLLM reads it).")
    source: str = Field("", description="Where the numbers come from.")

    @model_validator(mode="before")
    @classmethod
    def _no_unknown_scale(cls, data: Any) -> Any:
        if isinstance(data, dict):
            odd = [k for k in data if SCALE_LIKE.search(k) and k not in NOT_ATTENTION and k not in cls.model_fields]
            if odd:
                raise ValueError(f"field {odd[0]!r} is not understood: it may change the attention scores, "
                                 "so the softmax scale would be a guess")
        return data

    @model_validator(mode="before")
    @classmethod
    def _dense(cls, data: Any) -> Any:
        sparse = [k for k in SPARSE_FIELDS if isinstance(data, dict) and data.get(k) is not None]
        if sparse:
            past = f"{data['index_topk']} tokens" if data.get("index_topk") is not None else "index_topk tokens"
            raise ValueError(
                f"field {sparse[0]!r} ({data[sparse[0]]}) marks a sparse-attention model: past {past} each query "
                "reads only the tokens its indexer selects; mlabench times dense MLA decode over the whole cache, "
                "so its numbers would not be this model's")
        return data

    @model_validator(mode="after")
    def _rope_understood(self) -> ModelSpec:
        try:
            self.scale_and_source()
        except ConfigError as exc:
            raise ValueError(str(exc).removeprefix(f"{self.name}: ")) from None
        return self

    @property
    def qk_head_dim(self) -> int:
        return self.qk_nope_head_dim + self.qk_rope_head_dim

    def local_heads(self, tp: int) -> int:
        """Query heads per GPU at tensor-parallel size ``tp``; :class:`ShapeError` if not divisible."""
        if tp <= 0:
            raise ShapeError(f"--tp must be > 0, got {tp}")
        if self.num_attention_heads % tp:
            raise ShapeError(
                f"{self.source if self.source.endswith('.json') else self.name}: {self.num_attention_heads} "
                f"heads are not divisible by tp={tp}"
            )
        return self.num_attention_heads // tp

    def rope(self) -> tuple[str, dict[str, Any]]:
        """The rope type and its settings, from ``rope_scaling`` or, when that is absent, from
        ``rope_parameters`` (where transformers 5 writes them).

        The type is ``type`` or ``rope_type``; settings with neither and no ``factor`` are the
        ``default`` rope.  Raises :class:`ConfigError` naming a type outside :data:`ROPE_TYPES` or
        a field outside :data:`ROPE_FIELDS` (its effect on the softmax scale would be a guess).
        """
        where = "rope_scaling" if self.rope_scaling else "rope_parameters"
        settings = self.rope_scaling or self.rope_parameters or {}
        kind = settings.get("type") or settings.get("rope_type")
        if kind is None and "factor" in settings:
            raise ConfigError(f"{self.name}: rope settings with a factor but no rope_type: {settings}")
        kind = str(kind or "default")
        if kind not in ROPE_TYPES:
            raise ConfigError(f"{self.name}: rope type {kind!r} is not understood (known: "
                              f"{', '.join(ROPE_TYPES)}); its effect on the softmax scale is unknown")
        odd = sorted(set(settings) - set(ROPE_FIELDS))
        if odd:
            raise ConfigError(f"{self.name}: {where} field {odd[0]!r} is not understood (known: "
                              f"{', '.join(ROPE_FIELDS)}); its effect on the softmax scale is unknown")
        return kind, settings

    def _yarn_applied(self, settings: dict[str, Any]) -> bool:
        """``apply_yarn_scaling`` from the rope settings or the top level (default true);
        :class:`ConfigError` for a value that is not true/false or two that disagree."""
        given = {v for v in (settings.get("apply_yarn_scaling"), self.apply_yarn_scaling) if v is not None}
        if any(not isinstance(v, bool) for v in given) or len(given) > 1:
            raise ConfigError(f"{self.name}: apply_yarn_scaling must be one true or false, got "
                              f"{settings.get('apply_yarn_scaling')!r} in the rope settings and "
                              f"{self.apply_yarn_scaling!r} beside them")
        return given != {False}

    def scale_and_source(self) -> tuple[float, str]:
        """The decode softmax scale (module docstring) and how it was reached, e.g.
        ``(128 + 64) ** -0.5 x 1.4852 ** 2 (YaRN mscale of factor 128, mscale_all_dim 1)``.
        Raises :class:`ConfigError` for rope settings it does not understand (:meth:`rope`)."""
        scale = self.qk_head_dim**-0.5
        how = f"({self.qk_nope_head_dim} + {self.qk_rope_head_dim}) ** -0.5"
        kind, rs = self.rope()
        applied = self._yarn_applied(rs)
        if kind == "default":
            return scale, f"{how} (no rope scaling)"
        factor = float(rs.get("factor", 1.0))
        mscale_all_dim = float(rs.get("mscale_all_dim", 0.0) or 0.0)
        if not applied:
            return scale, f"{how} (YaRN, apply_yarn_scaling false: no mscale)"
        if not mscale_all_dim or factor <= 1.0:
            return scale, f"{how} (YaRN without mscale: factor {factor:g}, mscale_all_dim {mscale_all_dim:g})"
        mscale = 0.1 * mscale_all_dim * math.log(factor) + 1.0
        return (scale * mscale * mscale,
                f"{how} x {mscale:.4f} ** 2 (YaRN mscale of factor {factor:g}, mscale_all_dim {mscale_all_dim:g})")

    def softmax_scale(self) -> float:
        """Decode softmax scale as the model computes it (:meth:`scale_and_source`)."""
        return self.scale_and_source()[0]

    def scale_source(self) -> str:
        """How :meth:`softmax_scale` was reached, and from which file or preset."""
        how = self.scale_and_source()[1]
        return f"{how} from {self.source}" if self.source else how


def scale_note(spec: ModelSpec | None, head_dim_qk: int = 576) -> str:
    """One line for tables and manifests: the softmax scale in use and where it came from, e.g.
    ``softmax scale 0.072169 = (128 + 64) ** -0.5 (no rope scaling) from <config.json>``; without a
    model, ``head_dim_qk ** -0.5`` (the kernels' default)."""
    if spec is None:
        return (f"softmax scale {head_dim_qk**-0.5:.6f} = {head_dim_qk} ** -0.5 "
                "(no model given: 1 / sqrt of the query width)")
    return f"softmax scale {spec.softmax_scale():.6f} = {spec.scale_source()}"


def list_models() -> list[str]:
    """Names of the presets under ``configs/models/`` (file stems), sorted."""
    return sorted(p.stem for p in (configs_dir() / "models").glob("*.toml"))


def load_model(name: str) -> ModelSpec:
    """Load preset ``configs/models/<name>.toml``; :class:`UnknownModelError` lists the known ones."""
    path = configs_dir() / "models" / f"{name}.toml"
    if not path.is_file():
        raise UnknownModelError(f"unknown model {name!r}; known: {', '.join(list_models())}")
    data = read_toml(path, "model preset")
    try:
        return ModelSpec(name=name, **{k: v for k, v in data.items() if k != "name"})
    except ValidationError as exc:
        raise ConfigError(f"{path}: {validation_line(exc)}") from None


def read_hf_config(path: str | Path) -> ModelSpec:
    """Read a model's Hugging Face ``config.json`` (a file or a folder holding one).

    Needs ``num_attention_heads`` and ``kv_lora_rank``; raises :class:`ConfigError` otherwise, for
    a field that changes the softmax scale in a way it does not understand (module docstring), and
    for a sparse-attention model (a field of :data:`SPARSE_FIELDS`, e.g. DeepSeek-V3.2's
    ``index_topk``), which dense decode does not measure.
    """
    p = Path(path)
    if p.is_dir():
        p = p / "config.json"
    data = read_json(p, "model config")
    if not isinstance(data, dict):
        raise ConfigError(f"{p}: expected a JSON object")
    # Multimodal wrappers (Kimi K2.5-style) keep the language model under text_config.
    if "kv_lora_rank" not in data and isinstance(data.get("text_config"), dict):
        data = data["text_config"]
    missing = [k for k in ("num_attention_heads", "kv_lora_rank") if data.get(k) is None]
    if missing:
        raise ConfigError(f"{p}: not an MLA model config (missing {', '.join(missing)})")
    try:
        return ModelSpec(**{"name": str(data.get("model_type", p.parent.name)), **data, "source": str(p)})
    except ValidationError as exc:
        raise ConfigError(f"{p}: {validation_line(exc)}") from None


def resolve_heads(
    *, model: str | None = None, model_config: str | Path | None = None, tp: int = 1,
    heads: int | None = None,
) -> tuple[int, float | None, ModelSpec | None]:
    """Local heads and softmax scale from ``--model``/``--model-config``/``--tp`` or ``--heads``.

    Returns ``(num_heads, softmax_scale or None, spec or None)``.  Without a model the scale is
    None (576 ** -0.5 is used).  Raises :class:`ConfigError` when both or none are given, and
    for ``tp`` other than 1 without a model (``--heads`` is the local head count, which no TP divides).
    """
    if model and model_config:
        raise ConfigError("give --model or --model-config, not both")
    spec = model_spec(model, model_config)
    if spec is None:
        if heads is None:
            raise ConfigError("give --model NAME --tp N, --model-config PATH, or --heads N")
        if tp != 1:  # --heads is the local count already: a TP without a model would divide nothing
            raise ConfigError(f"--tp {tp} divides a model's heads: give --model or --model-config with it, or "
                              f"--heads alone (the heads one GPU holds)")
        if heads <= 0:
            raise ShapeError(f"heads must be > 0, got {heads}")
        return heads, None, None
    local = spec.local_heads(tp)
    if heads is not None and heads != local:
        raise ConfigError(f"--heads {heads} contradicts {spec.name} at tp={tp} ({local} heads)")
    return local, spec.softmax_scale(), spec


def model_spec(model: str | None = None, model_config: str | Path | None = None) -> ModelSpec | None:
    """The preset ``model``, else the config.json ``model_config``, else None (errors as
    :func:`load_model` and :func:`read_hf_config`)."""
    return load_model(model) if model else read_hf_config(model_config) if model_config else None
