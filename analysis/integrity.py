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
from .batch import run_kind
from .kinds import RequestKind
from .server_metrics import GENERATION_TOKENS, SUCCESS, ServerSeries, server_rows
from .sse import CUT_OFF

NORMAL_END = ("stop", "length")
# vLLM's prompt-token counter under its own name (no canonical series: only the embeddings check reads it).
PROMPT_TOKENS = {"vllm": "vllm:prompt_tokens_total"}


def integrity(
    records: pd.DataFrame,
    metrics: pd.DataFrame | None,
    model: str | None = None,
    profile: servers.ServerProfile | str | None = None,
    unreadable: int = 0,
    settle_s: float = 0.0,
) -> dict:
    """Client ok requests and output tokens against the increase of the server's counters from the first scrape to
    the last; {'available': False, ...} without two successful scrapes. `profile`: the server's (default vLLM);
    `unreadable`: the record lines the merge skipped (cut off by a crash, or torn by a full disk), said in the text
    and kept as `unreadable_lines` (a request whose only record was such a line is missing from the client side);
    `settle_s`: how long a scrape may take (prometheus_text.scrape_timeout_s): an ok request that finished within it
    of the last successful scrape, or after it, may be missing from the server's counters."""
    check = _integrity(records, metrics, model, servers.get(profile), settle_s)
    check["unreadable_lines"] = int(unreadable)
    check["text"] = integrity_text(check)
    return check


def _integrity(
    records: pd.DataFrame, metrics: pd.DataFrame | None, model: str | None, profile, settle_s: float = 0.0
) -> dict:
    def unavailable(reason: str) -> dict:
        return {"available": False, "reason": reason}

    # A batch kind's run (e.g. embeddings) generates no tokens: only the finished requests and the prompt tokens
    # are compared.
    batch = run_kind(records)
    embeddings = batch is not None
    needed = ("success",) if embeddings else ("success", "generation_tokens")
    lacking = [k for k in needed if not profile.has(k)]
    if lacking:
        return unavailable(f"a {profile.title} server has no counter of {' and '.join(_WHAT[k] for k in lacking)}")
    if metrics is None or not len(server_rows(metrics)):  # a GPU exporter's samples are not the server's
        return unavailable("no server metrics were scraped")
    server = ServerSeries(metrics, model)
    if not server.has(SUCCESS) or (not embeddings and not server.has(GENERATION_TOKENS)):
        names = " / ".join(profile.server_name(k) or "" for k in needed)
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
    ok = records[records["status"] == "ok"]
    if embeddings:
        if math.isnan(finished):
            return unavailable("fewer than two successful scrapes")
        return _batch(batch, records, ok, server, finished, profile)
    tokens = server.increase(GENERATION_TOKENS, start, math.inf)
    if math.isnan(finished) or math.isnan(tokens):
        return unavailable("fewer than two successful scrapes")
    out: dict = {}
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
    out["cut_off"] = int((records["error_type"] == CUT_OFF).sum()) if "error_type" in records.columns else 0
    out["requests_match"] = out["client_ok"] == out["server_finished"]
    # When the run's last scrape failed (a busy server answering after its timeout), the counters end at an earlier
    # scrape: ok requests that finished after it, or within a scrape's time before it, may not be in them (seen in a
    # stress run: the records held 2 more ok requests than the server's last counters).
    timed = {"start_time", "duration_s"} <= set(ok.columns)  # a record always has them; a hand-made table may not
    late = ok[(ok["start_time"] + ok["duration_s"]) > server.last_scrape - settle_s] if timed else ok.iloc[:0]
    out["late"] = len(late)
    late_tokens = int(pd.to_numeric(late["output_tokens"], errors="coerce").fillna(0).sum())
    # A stream cut off at the stop may have been sent whole already, unread in its socket when its user was
    # stopped: the server counts it finished. Its count then lies between the ok requests and those plus the cut-off
    # ones (seen in a 2-user run stopped mid-stream on a loaded machine: +1, "MISMATCH" with nothing lost).
    low, high = out["client_ok"] - out["late"], out["client_ok"] + out["cut_off"]
    out["requests_within"] = low <= out["server_finished"] <= high
    out["tokens_match"] = out["client_ok_tokens"] == out["server_generated_tokens"]
    tokens_within = out["client_ok_tokens"] - late_tokens <= out["server_generated_tokens"] <= out["client_ok_tokens"]
    # Failed and cut-off streams make the token counts differ legitimately (vLLM counts tokens it generated that
    # never arrived; the client counts tokens of streams the server did not finish): only flagged without them.
    out["mismatch"] = not out["requests_within"] or (not tokens_within and out["not_ok"] == 0)
    return out


_WHAT = {"success": "finished requests", "generation_tokens": "generated tokens"}


def _batch(
    kind: RequestKind,
    records: pd.DataFrame,
    ok: pd.DataFrame,
    server: ServerSeries,
    finished: float,
    profile: servers.ServerProfile,
) -> dict:
    """A batch kind's run: ok requests' items against the finished requests, the ok requests' prompt tokens against
    the server's prompt-token counter; output tokens do not apply (nothing is generated)."""
    # vLLM makes one engine request per item (an embeddings request's input, a scoring request's pair of texts)
    # and counts each as a finished request (pooling/base/serving.py; measured: a batch of N adds N to
    # request_success_total{stop}), so the items of the ok requests are what the counter must equal.
    items = str(kind.items)
    counts = pd.to_numeric(records[items], errors="coerce").fillna(0)
    ok_items = int(counts[records["status"] == "ok"].sum())
    other_items = int(counts[records["status"] != "ok"].sum())
    out: dict = {
        "available": True, "embeddings": True, "kind": kind.name, "items": items, "client_ok": len(ok),
        f"client_ok_{items}": ok_items, "server_finished": int(finished), f"other_{items}": other_items,
    }  # fmt: skip
    out["not_ok"] = int((records["status"] != "ok").sum())
    out["requests_match"] = ok_items == out["server_finished"]
    # A request cut off at the stop (or failed after it was sent) may still have had some of its inputs pooled and
    # counted: the server's count then lies between the ok inputs and the ok plus those requests' inputs.
    out["requests_within"] = ok_items <= out["server_finished"] <= ok_items + other_items
    name = PROMPT_TOKENS.get(profile.name)
    prompt = server.increase(name, server.first_scrape, math.inf) if name and server.has(name) else math.nan
    client_prompt = pd.to_numeric(ok["prompt_tokens"], errors="coerce")
    out["client_ok_prompt_tokens"] = int(client_prompt.fillna(0).sum()) if client_prompt.notna().any() else None
    out["server_prompt_tokens"] = None if math.isnan(prompt) else int(prompt)
    known = out["client_ok_prompt_tokens"] is not None and out["server_prompt_tokens"] is not None
    out["prompt_tokens_match"] = (out["client_ok_prompt_tokens"] == out["server_prompt_tokens"]) if known else None
    # A failed request may have been counted by the server's prompt counter before it failed: flagged without them.
    out["mismatch"] = not out["requests_within"] or (out["prompt_tokens_match"] is False and out["not_ok"] == 0)
    out["prompt_counter"] = name
    return out


def _batch_text(check: dict) -> list[str]:
    """A batch kind's check in plain sentences (items as the server's finished requests, prompt tokens; output
    tokens do not apply)."""
    items, kind = check.get("items", "inputs"), check.get("kind", "embeddings")
    finished, ok_items, other = check["server_finished"], check[f"client_ok_{items}"], check[f"other_{items}"]
    if check["requests_match"]:
        lines = [
            f"Requests: the {check['client_ok']} ok requests carried {ok_items} {items}, exactly the {finished} "
            f"requests the server finished (it counts each of a {kind} request's {items} as one)."
        ]
    elif check["requests_within"]:
        lines = [
            f"Requests: the server finished {finished} {items}, the ok requests carried {ok_items} "
            f"({finished - ok_items:+d}); the {check['not_ok']} failed or cut-off requests ({other} "
            f"{items}) account for a difference."
        ]
    else:
        lines = [
            f"MISMATCH: the server finished {finished} {items}, the ok requests carried {ok_items} "
            f"({finished - ok_items:+d}), beyond the {other} {items} of failed or cut-off requests: "
            "requests from other clients during the run, or records lost."
        ]
    client, server = check.get("client_ok_prompt_tokens"), check.get("server_prompt_tokens")
    if client is None or server is None:
        missing = (
            "the records carry no prompt_tokens"
            if client is None
            else (f"the server exposes no {check.get('prompt_counter') or 'prompt-token counter'}")
        )
        lines.append(f"Prompt tokens: not compared ({missing}).")
    elif check["prompt_tokens_match"]:
        lines.append(f"Prompt tokens: the {client} prompt tokens of the ok requests equal the server's count.")
    elif check["not_ok"]:
        lines.append(
            f"Prompt tokens: the server counted {server}, the ok requests hold {client} ({server - client:+d}); the "
            f"{check['not_ok']} failed or cut-off requests account for a difference."
        )
    else:
        lines.append(
            f"MISMATCH: the server counted {server} prompt tokens, the ok requests hold {client} "
            f"({server - client:+d}), and no request failed: other clients, or lost records."
        )
    lines.append(f"Output tokens: do not apply (a {kind} request generates none).")
    return lines


def _requests_text(check: dict) -> list[str]:
    if check["requests_match"]:
        return [
            f"Requests: the {check['client_ok']} ok requests in the records are exactly the {check['server_finished']} "
            "the server finished normally."
        ]
    extra = check["server_finished"] - check["client_ok"]
    if check.get("requests_within") and extra < 0:
        return [
            f"Requests: the server finished {check['server_finished']} normally, the records hold {check['client_ok']} "
            f"ok ({extra:+d}): {check['late']} of them finished after the run's last successful scrape of the server "
            "(or within a scrape's time of it), which its counters may not hold."
        ]
    if check.get("requests_within"):
        return [
            f"Requests: the server finished {check['server_finished']} normally, the records hold {check['client_ok']} "
            f"ok ({extra:+d}): {extra} of the {check['cut_off']} requests cut off at the stop had been sent whole "
            "before their users were stopped."
        ]
    diff = check["server_finished"] - check["client_ok"]
    return [
        f"MISMATCH: the server finished {check['server_finished']} requests normally, the records hold "
        f"{check['client_ok']} ok ({diff:+d}): requests from other clients during the run, or records lost."
    ]


def integrity_text(check: dict) -> list[str]:
    """The check in plain sentences, then the unreadable record lines, when there were any."""
    lines = _check_text(check)
    bad = check.get("unreadable_lines") or 0
    if bad:
        lines.append(
            f"Unreadable records: {bad} record line(s) could not be read (cut off by a crash, or torn by a full disk) "
            "and were skipped; a request whose only record was such a line is missing from the records."
        )
    return lines


def _check_text(check: dict) -> list[str]:
    if not check.get("available"):
        return [f"Integrity check not available: {check.get('reason', 'no server metrics')}."]
    if check.get("embeddings"):  # any batch kind's check (the key predates the other batch kinds)
        return _batch_text(check)
    lines = _requests_text(check)
    diff = check["server_generated_tokens"] - check["client_ok_tokens"]
    if check["tokens_match"]:
        lines.append(
            f"Tokens: the {check['client_ok_tokens']} output tokens of the ok requests equal the server's count."
        )
    elif check.get("late") and not check["mismatch"] and not check["not_ok"]:
        lines.append(
            f"Tokens: the server generated {check['server_generated_tokens']}, the ok requests hold "
            f"{check['client_ok_tokens']} ({diff:+d}): the {check['late']} that finished after its last successful "
            "scrape account for the difference."
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
