"""The integrity check: the client's records against the server's own counters over the whole run.

Pure: works on the records and the scraped samples. vLLM counts a request in vllm:request_success_total when it
finishes (finished_reason stop or length for a normal end), and every generated token in
vllm:generation_tokens_total, so over a run that no one else used the two sides must agree exactly. Other servers'
counters arrive under the same canonical names (analysis/servers); the profile says which finish reasons count
(None: the server's counter has no such label and counts normal ends only) and which server lacks a counter.
"""

from __future__ import annotations

import math

import pandas as pd

from . import servers
from .server_metrics import GENERATION_TOKENS, SUCCESS, ServerSeries

NORMAL_END = ("stop", "length")


def integrity(
    records: pd.DataFrame,
    metrics: pd.DataFrame | None,
    model: str | None = None,
    profile: servers.ServerProfile | str | None = None,
) -> dict:
    """Client ok requests and output tokens against the increase of the server's counters from the first scrape to
    the last; {'available': False, ...} without two successful scrapes. `profile`: the server's (default vLLM)."""

    def unavailable(reason: str) -> dict:
        out = {"available": False, "reason": reason}
        out["text"] = integrity_text(out)
        return out

    profile = servers.get(profile)
    lacking = [k for k in ("success", "generation_tokens") if not profile.has(k)]
    if lacking:
        return unavailable(f"a {profile.title} server has no counter of {' and '.join(_WHAT[k] for k in lacking)}")
    if metrics is None or not len(metrics):
        return unavailable("no server metrics were scraped")
    server = ServerSeries(metrics, model)
    if not server.has(SUCCESS) or not server.has(GENERATION_TOKENS):
        names = " / ".join(profile.server_name(k) or "" for k in ("success", "generation_tokens"))
        return unavailable(f"the server exposes no {names}")
    start = server.first_scrape
    if profile.success_reasons is None:
        finished = server.increase(SUCCESS, start, math.inf)
        if profile.aborted_counter and not math.isnan(finished):
            # The counter counts aborted requests too (SGLang: a client that goes away aborts its request, which
            # then finishes); its abort counter takes them out. A labelled counter appears only once it has been
            # incremented: absent from every scrape, it counted nothing.
            aborted = server.increase(profile.aborted_counter, start, math.inf)
            finished -= 0.0 if math.isnan(aborted) else aborted
    else:
        by_reason = [server.increase(SUCCESS, start, math.inf, finished_reason=r) for r in profile.success_reasons]
        by_reason = [v for v in by_reason if not math.isnan(v)]
        finished = sum(by_reason) if by_reason else math.nan
    tokens = server.increase(GENERATION_TOKENS, start, math.inf)
    if math.isnan(finished) or math.isnan(tokens):
        return unavailable("fewer than two successful scrapes")
    out: dict = {}
    ok = records[records["status"] == "ok"]
    client_tokens_all = int(pd.to_numeric(records["output_tokens"], errors="coerce").fillna(0).sum())
    out.update(
        available=True,
        client_ok=len(ok),
        server_finished=int(finished),
        client_ok_tokens=int(ok["output_tokens"].sum()),
        client_tokens_all=client_tokens_all,
        server_generated_tokens=int(tokens),
    )
    out["not_ok"] = int((records["status"] != "ok").sum())
    out["requests_match"] = out["client_ok"] == out["server_finished"]
    out["tokens_match"] = out["client_ok_tokens"] == out["server_generated_tokens"]
    # Failed and cut-off streams make the token counts differ legitimately (vLLM counts tokens it generated that
    # never arrived; the client counts tokens of streams the server did not finish): only flagged without them.
    out["mismatch"] = not out["requests_match"] or (not out["tokens_match"] and out["not_ok"] == 0)
    out["text"] = integrity_text(out)
    return out


_WHAT = {"success": "finished requests", "generation_tokens": "generated tokens"}


def integrity_text(check: dict) -> list[str]:
    """The check in plain sentences."""
    if not check.get("available"):
        return [f"Integrity check not available: {check.get('reason', 'no server metrics')}."]
    lines = []
    if check["requests_match"]:
        lines.append(
            f"Requests: the {check['client_ok']} ok requests in the records are exactly the {check['server_finished']} "
            "the server finished normally."
        )
    else:
        diff = check["server_finished"] - check["client_ok"]
        lines.append(
            f"MISMATCH: the server finished {check['server_finished']} requests normally, the records hold "
            f"{check['client_ok']} ok ({diff:+d}): requests from other clients during the run, or records lost."
        )
    diff = check["server_generated_tokens"] - check["client_ok_tokens"]
    if check["tokens_match"]:
        lines.append(
            f"Tokens: the {check['client_ok_tokens']} output tokens of the ok requests equal the server's count."
        )
    elif check["not_ok"]:
        lines.append(
            f"Tokens: the server generated {check['server_generated_tokens']}, the ok requests hold "
            f"{check['client_ok_tokens']} ({diff:+d}); the {check['not_ok']} failed or cut-off streams account for "
            f"a difference (their records hold {check['client_tokens_all'] - check['client_ok_tokens']} tokens)."
        )
    else:
        lines.append(
            f"MISMATCH: the server generated {check['server_generated_tokens']} tokens, the ok requests hold "
            f"{check['client_ok_tokens']} ({diff:+d}), and no request failed: other clients, or lost records."
        )
    return lines
