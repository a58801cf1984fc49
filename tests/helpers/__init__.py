"""Shared test helpers, imported by the test modules (which never import from one another).

paths     ROOT, FIXTURES, LOCUSTFILE
net       free_port, and get / post / wait_for over HTTP
servers   FakeServer: a handle on a running tests/fakeserver.py process (the `fake_server` fixture starts them)
runs      real Locust processes: locust_command, locust, short_run, start_locust, cluster
inprocess Locust in the test's own process: parse_options, run_in_process
records   request records and step timelines with known answers: rec, frame, TIMELINE, make_record
vllm      the real vLLM's counters and gauges: scrape, finished_counts, window_stats
badinput  first_error: the one line a run with bad input stops with, found in this process
compose   load: docker-compose.yml, parsed; client / config: the Compose client that validates it
manifests deploy/kubernetes/: kustomization, resource(kind, name), manifest_files
"""
