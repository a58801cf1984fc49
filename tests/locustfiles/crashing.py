"""A load generator with a bug: its task raises. The run must exit 2 (the tool failed), not 0 or 1."""

from locust import constant
from vllm_loadtest.locustfiles import plugin, shape
from vllm_loadtest.locustfiles.openai_user import OpenAIStreamingUser

plugin.install()


def broken_task(user) -> None:
    raise RuntimeError("a bug in the load generator")


class CrashingUser(OpenAIStreamingUser):
    tasks = (broken_task,)
    wait_time = constant(0.1)


class Steps(shape.StepLoadShape):  # the module, not the class: Locust lists every shape class it finds
    pass
