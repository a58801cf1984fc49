"""The locustfile of the spawn-message benchmark (tests/benchmarks/bench_spawn_message.py): the suite's own
(locustfiles/vllm_streaming.py), and with BENCH_LOCUST_DEFAULTS=as-is, Locust's `default_args_dict` put back after
the suite's init listener replaced it, so that one run measures Locust as it is and the other the suite's fix."""

from __future__ import annotations

import os

from locust import argument_parser, events
from vllm_loadtest.locustfiles import plugin, shape
from vllm_loadtest.locustfiles.openai_user import OpenAIStreamingUser

LOCUST_AS_IS = argument_parser.default_args_dict

plugin.install()


@events.init.add_listener
def _put_locust_back(environment, **_kw) -> None:  # after plugin's init listener: registered after it
    if os.environ.get("BENCH_LOCUST_DEFAULTS") == "as-is":
        argument_parser.default_args_dict = LOCUST_AS_IS


class VLLMUser(OpenAIStreamingUser):
    pass


class Steps(shape.StepLoadShape):
    pass
