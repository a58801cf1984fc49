"""--endpoint chat: /v1/chat/completions, streamed; the body's `messages` (the dataset's text as one user message,
or a source's own messages), --images as content parts (locustfiles/images.py: placeholders in the prepared body,
each request's data URLs spliced in before its send stamp), and the chat request options."""

from __future__ import annotations

import itertools

from ...analysis import kinds
from .. import images, request_options
from .streaming import StreamingRequester


class ChatRequester(StreamingRequester):
    kind = kinds.CHAT

    @classmethod
    def add_prompt(cls, payload: dict, prompt, options) -> None:
        # A source's chat messages as they are, else the text as one user message.
        payload["messages"] = prompt if isinstance(prompt, list) else [{"role": "user", "content": prompt}]
        if options.images:
            # Placeholders for the data URLs, spliced in per request before the send stamp (locustfiles/images.py).
            payload["messages"] = images.attach(payload["messages"], images.spec_of(options).count)

    @classmethod
    def add_fields(cls, payload: dict, fields: request_options.RequestFields, profile) -> None:
        if fields.chat:
            payload.update(fields.chat)  # chat_template_kwargs, tools, tool_choice
            if fields.chat_template_kwargs is not None and not profile.chat_template_kwargs:
                del payload["chat_template_kwargs"]  # refused before the run for a profile without it (options.py)

    def __init__(self, user, opts) -> None:
        # --images: the process's image maker; each body's placeholders get the request's data URLs (prepare).
        self.images = user.shared.image_maker(opts)
        super().__init__(user, opts)
        if self.images is not None:
            self.image_count = self.images.spec.count
            self._image_requests = itertools.count()
            self.prepare = self._prepare_with_images

    @property
    def prepared_once(self) -> bool:
        return self.images is None

    def _prepare_with_images(self, body: bytes) -> tuple[bytes, bytes]:
        """--images: the body with this request's data URLs in place of its placeholders, prepared (before the
        send stamp). Each request's images are seeded by the user's seed and its request counter."""
        urls = self.images.urls(f"{self.user._seed}:{next(self._image_requests)}")
        return self.user.http.prepare(images.splice(body, urls))
