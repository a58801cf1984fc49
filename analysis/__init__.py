"""Offline analysis of vllm-loadtest runs: records, the step table, and (later) the report."""
