"""Inference: sampling pipeline, KV-cache generation, a continuous-batching engine, the
OpenAI-compatible server, the web chat page and the terminal chat."""

from cookmind.infer.generate import generate, generate_steps, stream
from cookmind.infer.sampling import SamplingParams

__all__ = ["SamplingParams", "generate", "generate_steps", "stream"]
