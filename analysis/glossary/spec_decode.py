"""The columns of speculative decoding (issue 35): the server's draft and acceptance counters over each step's window
and the client's tokens per chunk (analysis/spec_decode.py), and the request column they come from."""

from __future__ import annotations

from .columns import CI, REQUESTS, Column

SPEC = "spec_decode"  # steps.csv: speculative decoding (issue 35), after the GPU section: last

_COUNTER = "vLLM's {name} (summed over engines) over the step's measured window: its increase from the last scrape "
_COUNTER += "at or before the window's start to the last scrape inside it, a drop read as a restart"
_USAGE = "the step's measured ok requests whose output_tokens came from the server's usage"
_EXACT = (
    "the step's measured ok requests whose chunks' token counts are known: the server sent usage and the chunks' "
    "counts add up to it (every chunk's count exact with continuous usage; without it, all chunks of one token)"
)
_PAIRS = (
    "ratio estimator over the scrape intervals inside the window (pairs of increases: accepted, draft tokens): R ± "
    "t(n - 1, 0.975) * sqrt(sum((a - R d)^2) / (n - 1)) / (sqrt(n) * mean(d)), clipped to [0, 1]; scrape intervals "
    "taken as independent; empty below 2 intervals with drafts"
)

# steps.csv, speculative decoding: written for every run; the server's columns are empty when it exports no
# speculative-decoding counters (never 0), the client's are any streaming run's.
SPEC_COLUMNS = [
    Column("spec_drafts", SPEC, "drafts", "Drafts the server proposed (one per request per engine step that "
           "speculated); empty when the server exports no speculative-decoding counters.",
           _COUNTER.format(name="vllm:spec_decode_num_drafts_total"), label="Drafts", header="drafts", fmt="int",
           shows="value"),
    Column("spec_draft_tokens", SPEC, "tokens", "Draft tokens proposed (drafts x the speculative tokens each).",
           _COUNTER.format(name="vllm:spec_decode_num_draft_tokens_total"), label="Draft tokens", fmt="int"),
    Column("spec_accepted_tokens", SPEC, "tokens", "Draft tokens the target model accepted.",
           _COUNTER.format(name="vllm:spec_decode_num_accepted_tokens_total"), label="Accepted tokens", fmt="int"),
    Column("spec_acceptance_rate", SPEC, "fraction", "Share of the draft tokens the target model accepted, over the "
           "step's window (vLLM's 'Avg Draft acceptance rate').", "spec_accepted_tokens / spec_draft_tokens; empty "
           "without draft tokens", label="Acceptance rate", header="accept rate", fmt="pct1",
           metric="spec_acceptance_rate"),
    Column("spec_acceptance_length_mean", SPEC, "tokens", "Mean tokens a speculating step produced per request: the "
           "accepted draft tokens plus the target model's own (bonus) token (vLLM's 'Mean acceptance length').",
           "1 + spec_accepted_tokens / spec_drafts; empty without drafts", label="Mean acceptance length",
           header="accept len", fmt="num2", metric="spec_acceptance_length"),
    *[Column(f"spec_acceptance_rate_ci_{end}", SPEC, "fraction", f"{word} bound of the {CI} of "
             "spec_acceptance_rate.", _PAIRS, label=f"Acceptance rate CI {end}", fmt="pct1",
             metric="spec_acceptance_rate")
      for end, word in (("low", "Lower"), ("high", "Upper"))],
    Column("tokens_per_chunk_mean", SPEC, "tokens", f"Mean output tokens per token-carrying chunk over {_USAGE}: "
           "above 1 when a chunk brings several tokens (speculative decoding accepts drafts, or the server batches "
           "its stream); empty when no request had usage.", "sum(output_tokens) / sum(chunks)",
           label="Tokens per chunk", header="tok/chunk", fmt="num2", metric="tokens_per_chunk"),
    *[Column(f"tokens_per_chunk_mean_ci_{end}", SPEC, "tokens", f"{word} bound of the {CI} of "
             "tokens_per_chunk_mean.", "ratio estimator over the requests (output_tokens, chunks): R ± t(n - 1, "
             "0.975) * sqrt(sum((t - R c)^2) / (n - 1)) / (sqrt(n) * mean(c)); empty below 2 requests",
             label=f"Tokens per chunk CI {end}", fmt="num2", metric="tokens_per_chunk")
      for end, word in (("low", "Lower"), ("high", "Upper"))],
    Column("multi_token_chunk_share", SPEC, "fraction", f"Share of the token-carrying chunks of {_EXACT} that carried "
           "more than one token.", "count(chunk_tokens > 1) / count(chunk_tokens)", label="Multi-token chunks",
           header="multi-tok chunks", fmt="pct0", metric="tokens_per_chunk"),
    Column("tokens_per_chunk_p99", SPEC, "tokens", f"99th percentile of the tokens a chunk carried, over the chunks "
           f"of {_EXACT}.", "percentile(chunk_tokens, 99)", label="Tokens per chunk p99", header="tok/chunk p99",
           fmt="num1", metric="tokens_per_chunk"),
]  # fmt: skip

# requests.parquet: appended after `measured` (analysis/records.py SCHEMA's order).
SPEC_REQUEST_COLUMNS = [
    Column("tokens_per_chunk", REQUESTS, "tokens", "Mean output tokens per token-carrying chunk of the answer; none "
           "without usage (the chunks were counted as one token each) or without chunks.",
           "output_tokens / chunks, at the stream's end", metric="tokens_per_chunk"),
]  # fmt: skip
