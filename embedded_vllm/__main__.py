"""Command line of the embedded vLLM server.

python -m embedded_vllm install            # vLLM's CPU build in its own venv, and the tiny model
python -m embedded_vllm serve [--port 8000] [--num-blocks 128 ...]   # until Ctrl-C (--no-prefix-caching)
python -m embedded_vllm serve --reasoning-parser qwen3 --enable-auto-tool-choice --tool-call-parser hermes
python -m embedded_vllm serve --embed      # the tiny model as an embedding model: /v1/embeddings
python -m embedded_vllm serve --vision     # a tiny vision-language model: chat with one image per request
python -m embedded_vllm serve --rerank     # a tiny cross-encoder: /v1/rerank (also /rerank, /v2/rerank)
python -m embedded_vllm serve --lora       # the tiny model and two LoRA adapters: tiny-lora-a, tiny-lora-b
python -m embedded_vllm serve --speculative ngram   # speculative decoding: /metrics gains vllm:spec_decode_*
python -m embedded_vllm demo               # server + stepped load + table, results in reports/
python -m embedded_vllm demo --capacity    # server + capacity search (--find-capacity users) against --slo
python -m embedded_vllm wait URL           # wait until URL/health answers (used by docker-compose)
"""

from __future__ import annotations

import argparse
import signal
import sys
import time
import urllib.request

from .demo import DEFAULT_CAPACITY_SLO
from .server import EmbeddedServerError, EmbeddedVLLM, ServerSettings, ensure_installed, ensure_model


def _settings_args(p: argparse.ArgumentParser) -> None:
    d = ServerSettings()
    p.add_argument("--port", type=int, default=d.port, help="0: any free port")
    p.add_argument("--num-blocks", type=int, default=d.num_blocks, help="KV-cache blocks")
    p.add_argument("--block-size", type=int, default=d.block_size, help="tokens per block (a multiple of 32)")
    p.add_argument("--max-model-len", type=int, default=d.max_model_len)
    p.add_argument("--max-num-seqs", type=int, default=d.max_num_seqs, help="max concurrent sequences")
    p.add_argument("--startup-timeout", type=float, default=d.startup_timeout_s, help="seconds")
    p.add_argument("--no-prefix-caching", action="store_true", help="disable vLLM's prefix caching (on by default)")
    p.add_argument(
        "--reasoning-parser",
        default=d.reasoning_parser,
        metavar="NAME",
        help="vLLM's reasoning parser: thoughts stream as delta.reasoning (qwen3 with the tiny model; "
        "docs/how-to/reasoning-models.md)",
    )
    p.add_argument(
        "--enable-auto-tool-choice",
        action="store_true",
        help="let the model call the request's tools (tool_choice auto); needs --tool-call-parser",
    )
    p.add_argument(
        "--tool-call-parser",
        default=d.tool_call_parser,
        metavar="NAME",
        help="vLLM's tool-call parser for --enable-auto-tool-choice (hermes with the tiny model)",
    )
    p.add_argument(
        "--speculative",
        choices=["ngram"],
        default=d.speculative or None,
        help="speculative decoding: ngram (prompt lookup, 3 draft tokens; /metrics gains vllm:spec_decode_*, "
        "docs/how-to/gpu-telemetry.md#speculative-decoding)",
    )
    p.add_argument(
        "--embed",
        action="store_true",
        help="serve the tiny model as an embedding model (vLLM's pooling runner): /v1/embeddings only "
        "(load it with --endpoint embeddings)",
    )
    p.add_argument(
        "--vision",
        action="store_true",
        help="serve a tiny random-weight vision-language model (BLIP-2 layout): chat with one image per request "
        "(--endpoint chat --images 1:WxH), 32 prompt tokens per image",
    )
    p.add_argument(
        "--rerank",
        action="store_true",
        help="serve a tiny random-weight cross-encoder (the tiny model with a one-label score head): /v1/rerank, "
        "/rerank, /v2/rerank and /score (load it with --endpoint rerank)",
    )
    p.add_argument(
        "--lora",
        action="store_true",
        help="serve the tiny model with two tiny random-weight LoRA adapters, models 'tiny-lora-a' and "
        "'tiny-lora-b' beside 'tiny' (vLLM's --enable-lora --lora-modules; load a mix with --lora-mix)",
    )


def _settings(a: argparse.Namespace) -> ServerSettings:
    return ServerSettings(
        port=a.port,
        num_blocks=a.num_blocks,
        block_size=a.block_size,
        max_model_len=a.max_model_len,
        max_num_seqs=a.max_num_seqs,
        startup_timeout_s=a.startup_timeout,
        prefix_caching=not a.no_prefix_caching,
        reasoning_parser=a.reasoning_parser,
        tool_call_parser=a.tool_call_parser if a.enable_auto_tool_choice else "",
        embed=getattr(a, "embed", False),
        vision=getattr(a, "vision", False),
        rerank=getattr(a, "rerank", False),
        lora=getattr(a, "lora", False),
        speculative=getattr(a, "speculative", None) or "",
    )


def _tool_flags_problem(a: argparse.Namespace) -> str | None:
    """vLLM needs both tool flags or neither; one alone is refused before anything starts. --embed, --vision and
    --rerank are different models; --lora adapts the text model."""
    chosen = [f for f in ("embed", "vision", "rerank") if getattr(a, f, False)]
    if len(chosen) > 1:
        return f"{' and '.join('--' + f for f in chosen)} serve different models; choose one"
    if chosen and getattr(a, "lora", False):
        return f"--lora adapts the text model; it does not go with --{chosen[0]}"
    if getattr(a, "speculative", None) and (getattr(a, "embed", False) or getattr(a, "rerank", False)):
        return f"--speculative {a.speculative} speeds up text generation; --embed and --rerank generate none"
    if a.enable_auto_tool_choice and not a.tool_call_parser:
        return "--enable-auto-tool-choice needs --tool-call-parser NAME (e.g. hermes)"
    if a.tool_call_parser and not a.enable_auto_tool_choice:
        return f"--tool-call-parser {a.tool_call_parser} takes effect only with --enable-auto-tool-choice; add it"
    return None


def _sigterm_to_keyboard_interrupt() -> None:
    def handler(signum, frame):
        raise KeyboardInterrupt

    signal.signal(signal.SIGTERM, handler)


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(
        prog="python -m embedded_vllm", description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    sub = ap.add_subparsers(dest="command", required=True)
    sub.add_parser("install", help="install vLLM's CPU build and generate the tiny model")
    serve = sub.add_parser("serve", help="run the server until Ctrl-C")
    _settings_args(serve)
    demo = sub.add_parser("demo", help="start the server, run a stepped load, print the table")
    _settings_args(demo)
    demo.add_argument("--steps", default="1,2,4,8,16,32,64")
    demo.add_argument("--step-duration", default="30s")
    demo.add_argument("--step-warmup", default="8s")
    demo.add_argument("--max-tokens", type=int, default=256)
    demo.add_argument("--run-dir", default="")
    demo.add_argument(
        "--capacity",
        action="store_true",
        help="instead of --steps, search for the highest number of users meeting --slo (--find-capacity users; "
        "each probe lasts --step-duration with --step-warmup); exit 1 when even 1 user breaks it",
    )
    demo.add_argument(
        "--slo",
        default=DEFAULT_CAPACITY_SLO,
        help=f"with --capacity: the objectives searched against (default {DEFAULT_CAPACITY_SLO})",
    )
    wait = sub.add_parser("wait", help="wait until URL/health answers 200")
    wait.add_argument("url")
    wait.add_argument("--timeout", type=float, default=1800)
    a = ap.parse_args(argv)
    problem = _tool_flags_problem(a) if a.command in ("serve", "demo") else None
    if a.command == "demo" and (a.embed or a.vision or a.rerank):
        # The demo's load is streamed text generation, which none of these models serves.
        flag = "--embed" if a.embed else "--vision" if a.vision else "--rerank"
        problem = f"demo runs text generation; use serve {flag} and run the load yourself"
    if problem:
        print(f"error: {problem}", file=sys.stderr)
        return 3
    _sigterm_to_keyboard_interrupt()

    try:
        if a.command == "install":
            python = ensure_installed()
            print(f"vLLM: {python}\nmodel: {ensure_model(python)}")
        elif a.command == "serve":
            with EmbeddedVLLM(_settings(a)) as server:
                models = "models 'tiny', 'tiny-lora-a', 'tiny-lora-b'" if server.settings.lora else "model 'tiny'"
                print(f"Serving {server.url} ({models}); Ctrl-C to stop", flush=True)
                while server.proc and server.proc.poll() is None:
                    time.sleep(1)
                raise EmbeddedServerError(f"vLLM exited unexpectedly; see {server.log}")
        elif a.command == "demo":
            from .demo import run_demo

            return run_demo(_settings(a), a)
        elif a.command == "wait":
            deadline = time.monotonic() + a.timeout
            while time.monotonic() < deadline:
                try:
                    with urllib.request.urlopen(a.url.rstrip("/") + "/health", timeout=5) as r:
                        if r.status == 200:
                            return 0
                except OSError:
                    pass
                time.sleep(2)
            print(f"error: {a.url}/health did not answer within {a.timeout:.0f} s", file=sys.stderr)
            return 1
    except EmbeddedServerError as e:
        print(f"error: {e}", file=sys.stderr)
        return 1
    except KeyboardInterrupt:
        print("interrupted; the server was stopped", file=sys.stderr)
        return 130
    return 0


if __name__ == "__main__":
    sys.exit(main())
