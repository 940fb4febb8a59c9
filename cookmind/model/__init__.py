"""The CookMind model: config, from-scratch layers, the language model, its KV cache and safetensors I/O."""

from cookmind.model.config import CookMindConfig
from cookmind.model.kv_cache import KVCache
from cookmind.model.lm import CookMindLM, LMOutput
from cookmind.model.model_io import ModelLoadError, load_model, resolve_model_dir, save_model

__all__ = [
    "CookMindConfig",
    "CookMindLM",
    "KVCache",
    "LMOutput",
    "ModelLoadError",
    "load_model",
    "resolve_model_dir",
    "save_model",
]
