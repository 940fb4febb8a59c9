"""The OpenAI-compatible HTTP server: FastAPI in front of the continuous-batching engine.

Routes: POST /v1/chat/completions (chat.py), POST /v1/completions (completions.py), both streaming as
SSE in OpenAI's chunk format or not; GET /v1/models, /health, /metrics (Prometheus text) and the web
chat page at / (info.py). Every request first passes the guard (security.py: Host, API key, JSON
content type, body size). The app and its error handling are assembled in app.py.
"""

from cookmind.infer.server.app import create_app

__all__ = ["create_app"]
