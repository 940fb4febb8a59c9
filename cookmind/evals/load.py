"""Load what to evaluate: a CookMind checkpoint or a Hugging Face causal LM from a local folder."""

from __future__ import annotations

from pathlib import Path


def load_model_and_tokenizer(model_path, tokenizer_path=None, device: str = "cpu"):
    """(model in eval mode, tokenizer). Hugging Face folders load with transformers (offline);
    anything else with ``cookmind.model.load_model`` and our ``Tokenizer.load``."""
    from cookmind.model import resolve_model_dir
    from cookmind.model.hf import is_hf_model_dir

    model_path = resolve_model_dir(model_path)
    if not model_path.is_dir():
        raise FileNotFoundError(f"model folder {model_path} not found; pass a CookMind checkpoint or a Hugging Face model folder")
    tok_path = Path(tokenizer_path) if tokenizer_path else model_path
    if is_hf_model_dir(model_path):
        from transformers import AutoModelForCausalLM, AutoTokenizer

        model = AutoModelForCausalLM.from_pretrained(model_path, local_files_only=True).to(device)
        tokenizer = AutoTokenizer.from_pretrained(tok_path, local_files_only=True)
    else:
        from cookmind.model import load_model
        from cookmind.tokenizer import Tokenizer

        model = load_model(model_path, device=device)
        tokenizer = Tokenizer.load(tok_path)
    model.eval()
    return model, tokenizer
