"""Shared by the structured-output tests (CPU with the server packages, CUDA without them)."""

VOCAB = 330  # the model's ids: the tokenizer's 320 and 10 it never produces (padding, as real models have)
# short valid outputs only: a random model must finish within max_tokens
SCHEMA = {
    "type": "object",
    "properties": {
        "ok": {"type": "boolean"},
        "n": {"type": "integer", "minimum": 0, "maximum": 9},
        "colour": {"enum": ["red", "green", "blue"]},
        "note": {"type": "string", "maxLength": 6},
    },
    "required": ["ok", "n", "colour", "note"],
    "additionalProperties": False,
}
RESPONSE_FORMAT = {"type": "json_schema", "json_schema": {"name": "answer", "schema": SCHEMA, "strict": True}}
YES_NO = 'start: "yes" | "no"'
