"""A real vLLM (CPU build) serving a tiny generated model on 127.0.0.1: for the demo and integration tests."""

from .server import (
    EmbeddedServerError,
    EmbeddedVLLM,
    ServerSettings,
    ensure_installed,
    ensure_loras,
    ensure_model,
    ensure_vision_model,
)

__all__ = [
    "EmbeddedServerError",
    "EmbeddedVLLM",
    "ServerSettings",
    "ensure_installed",
    "ensure_loras",
    "ensure_model",
    "ensure_vision_model",
]
