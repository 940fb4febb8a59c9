"""GenerationConfig: what `generate` and `stream` need besides the model and the prompt."""

from __future__ import annotations

from dataclasses import dataclass

from cookmind.infer.sampling import SamplingParams


@dataclass
class GenerationConfig:
    """Settings of one generation call (see docs/INTERFACES.md). temperature 0 = greedy."""

    max_new_tokens: int = 64
    temperature: float = 0.0
    top_k: int = 0
    top_p: float = 1.0
    repetition_penalty: float = 1.0
    stop_token_ids: tuple[int, ...] = ()
    stop_strings: tuple[str, ...] = ()
    seed: int | None = None
    min_p: float = 0.0
    presence_penalty: float = 0.0
    frequency_penalty: float = 0.0

    def __post_init__(self) -> None:
        if not isinstance(self.max_new_tokens, int) or self.max_new_tokens < 1:
            raise ValueError(f"GenerationConfig.max_new_tokens must be a positive int, got {self.max_new_tokens!r}")
        self.stop_token_ids = tuple(int(t) for t in self.stop_token_ids)
        self.stop_strings = tuple(self.stop_strings)
        self.sampling_params()  # validates the sampling fields

    def sampling_params(self) -> SamplingParams:
        return SamplingParams(temperature=self.temperature, top_k=self.top_k, top_p=self.top_p, min_p=self.min_p,
                              repetition_penalty=self.repetition_penalty, presence_penalty=self.presence_penalty,
                              frequency_penalty=self.frequency_penalty, seed=self.seed)
