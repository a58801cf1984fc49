"""What one Locust process builds once and its users share: the model's name, the prompts, the request options
parsed, the image pool, the trace replay. Each is built by a greenlet of its own (a user stopped while waiting for
it cannot leave the others waiting), once per process and options, or taken from what the headless preflight
built before any load (`preflight.Built`). Owned by the process's RunContext (`ctx.resources`)."""

from __future__ import annotations

import itertools
from collections.abc import Callable

import gevent
import locust
from gevent.event import AsyncResult

from . import images, request_options, trace_run
from . import options as opts_mod
from .datasets import Dataset, build_dataset
from .exitcodes import EXIT_SETUP_ERROR
from .preflight import Built, SetupError, dataset_key, discover_model


class ProcessResources:
    """The process's shared inputs; `on_info` is called when run.json's dataset or trace entry changes."""

    def __init__(self, environment, built: Built | None, tracker, on_info: Callable[[], None]) -> None:
        self.environment = environment
        self.tracker = tracker
        self._on_info = on_info
        self._built = built or Built()  # what the headless preflight built: taken instead of built again
        self.user_numbers = itertools.count()  # users started by this process, for their seeds
        self._image_makers: dict[tuple, images.ImageMaker] = {}  # --images: one base pool per options
        self._request_fields = request_options.FieldsCache()  # parsed once per run: build_payload runs per body
        self._models: dict[str, AsyncResult] = {}
        self._datasets: dict[tuple, gevent.Greenlet] = {}
        self.dataset_info: dict | None = None  # how this process built --dataset, for run.json
        self._replays: dict[tuple, gevent.Greenlet] = {}  # --trace: this process's replay, built once per options
        self._replay = None  # this run's, once built and ready
        self.trace_info: dict | None = None  # --trace: the file, slice and rows, for run.json

    def start_run(self) -> None:
        """A run starts: the --tools file is read again (the web UI runs several), the dataset's entry is this run's
        once its first user has built (or reused) it, and a trace's bodies are built again for this run's ranks."""
        self._request_fields.clear()
        self.dataset_info = None
        self._replay = None

    def stop_run(self) -> None:
        if self._replay:
            self._replay.stop()

    def _setup_error(self, e: Exception):
        self.environment.process_exit_code = EXIT_SETUP_ERROR
        return locust.exception.StopTest(str(e))

    def model(self, host: str) -> str:
        """The --model option, or the first model the server lists; looked up once per process."""
        chosen = self.environment.parsed_options.model
        if chosen:
            return chosen
        if host not in self._models:
            result = AsyncResult()
            self._models[host] = result
            try:
                options = self.environment.parsed_options
                result.set(discover_model(host, options.read_timeout, opts_mod.api_key(options)))
            except SetupError as e:
                result.set_exception(e)
        try:
            return self._models[host].get()
        except SetupError as e:
            raise self._setup_error(e) from None

    def dataset(self, host: str, model: str) -> Dataset:
        """The run's prompts (--dataset), built once per process and options."""
        o = self.environment.parsed_options
        key = dataset_key(o, host, model)
        if key not in self._datasets:  # a failed build stays failed: it is a setup error, not retried per user
            if key in self._built.datasets:  # built (and so validated) before any load, by preflight()
                self._datasets[key] = gevent.spawn(self._built.datasets.pop, key)
            else:
                self._datasets[key] = gevent.spawn(build_dataset, o.dataset, o, host, model, opts_mod.api_key(o))
        try:
            dataset = self._datasets[key].get()
        except ValueError as e:  # DatasetError, or an unreadable --prompt-file
            raise self._setup_error(e) from None
        if self.dataset_info is None:
            self.dataset_info = dataset.info
            self._on_info()
        return dataset

    def request_fields(self, options) -> request_options.RequestFields:
        """The run's request options (--tools, --extra-body ...), parsed once per run in this process; raises
        ValueError with a one-line fix."""
        return self._request_fields.get(options)

    @property
    def traces(self) -> trace_run.Traces:
        """--trace: the process's trace, read once."""
        return self._built.traces

    @property
    def gpu_unanswered(self):
        """The GPU exporters the preflight found silent (warned once already)."""
        return self._built.gpu_unanswered

    def image_maker(self, options) -> images.ImageMaker | None:
        """--images: the process's ImageMaker (one base pool shared by its users), or None without --images."""
        key = images.maker_key(options)
        if key is not None and key not in self._image_makers:
            self._image_makers[key] = images.build_maker(options)
        return None if key is None else self._image_makers[key]

    def trace_replay(self, host: str, model: str, payload):
        """--trace: this process's replay (the trace, its prompts, its rows' bodies built ahead); the first user to
        get it this run starts building its rows' bodies with `payload` ((prompt, max_tokens) -> the request body)
        and tells the controller this process is ready."""
        o = self.environment.parsed_options
        key = trace_run.replay_key(o, host, model)
        if key not in self._replays:  # a failed build stays failed: it is a setup error, not retried per user
            built = self._built.replays.pop(key, None)
            if built is not None:
                self._replays[key] = gevent.spawn(lambda: built)
            else:
                build = trace_run.build_replay
                self._replays[key] = gevent.spawn(build, o, host, model, opts_mod.api_key(o), self.traces)
        try:
            replay = self._replays[key].get()
        except ValueError as e:  # TraceError, DatasetError (the tokenizer)
            if self._replay is None:
                self._replay = False
                self.tracker.report_trace_ready(str(e))
            raise self._setup_error(e) from None
        if self._replay is None:
            self._replay = replay
            rank, processes = self.tracker.trace_rank
            replay.prefetch(replay.trace.shard(rank, processes) if rank >= 0 else [], payload)
            known = (self.trace_info or {}).get("ideal_prefix_hit_rate")  # the controller's (a local run)
            self.trace_info = trace_run.info(replay.trace, o, getattr(replay.prompts, "info", None), known)
            self.tracker.report_trace_ready(None, self.trace_info.get("prompts"))
        return replay

    def trace_replay_built(self):
        """This run's replay once built (None before, or when its build failed)."""
        return self._replay or None
