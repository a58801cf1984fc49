"""Stream completions from a vLLM (or any OpenAI-compatible) server at stepped user counts.

    locust -f locustfiles/vllm_streaming.py --headless --host http://127.0.0.1:8000 \
        --steps 1,2,4,8,16,32,64 --step-duration 30s --max-tokens 256 --ignore-eos
"""

from vllm_loadtest.locustfiles import plugin, shape
from vllm_loadtest.locustfiles.openai_user import OpenAIStreamingUser

plugin.install()


class VLLMUser(OpenAIStreamingUser):
    pass


class Steps(shape.StepLoadShape):  # the module, not the class: Locust lists every shape class it finds
    pass
