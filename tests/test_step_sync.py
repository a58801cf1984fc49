"""A worker that asks for the step in force gets it (tracker.SYNC_MESSAGE): Locust's master may send the first step
before a worker's init listeners have registered the step's handler (the message is then dropped as an unknown type),
and a rate step's share of that worker would never be sent. The master answers a sync with the step in force, to that
worker alone; a worker begins a step once even when its message arrives twice; nothing is sent between runs."""

from __future__ import annotations

from types import SimpleNamespace

import pytest
from locust.runners import MasterRunner, WorkerRunner
from vllm_loadtest.locustfiles.tracker import STEP_MESSAGE, SYNC_MESSAGE, StepTracker, answer_syncs

from tests.helpers.inprocess import parse_options

pytestmark = pytest.mark.unit


def fake(cls, **attrs):
    """A runner of class `cls` (for the tracker's isinstance checks) that records what it is asked to send."""
    runner = cls.__new__(cls)
    runner.sent, runner.handlers, runner.greenlet = [], {}, None  # greenlet: what Runner.__del__ reads
    runner.send_message = lambda kind, data=None, client_id=None: runner.sent.append((kind, data, client_id))
    runner.register_message = lambda kind, handler: runner.handlers.__setitem__(kind, handler)
    for k, v in attrs.items():
        setattr(runner, k, v)
    return runner


def tracker(runner) -> StepTracker:
    env = SimpleNamespace(runner=runner, parsed_options=parse_options("--rates", "10"))
    runner.environment = env
    return StepTracker(env)


def test_the_master_answers_a_sync_with_the_step_in_force_to_that_worker_alone():
    nodes = [SimpleNamespace(id="w1"), SimpleNamespace(id="w2")]
    master = fake(MasterRunner, clients=SimpleNamespace(ready=nodes, spawning=[], running=[]))
    master.get_worker_index = lambda client_id: ["w1", "w2"].index(client_id)
    master.environment = SimpleNamespace(runner=master)
    current: list[StepTracker] = []
    answer_syncs(master.environment, lambda: current[0] if current else None)  # from the start of init
    sync = master.handlers[SYNC_MESSAGE]
    sync(master.environment, SimpleNamespace(node_id="w2"))  # before the tracker exists: answered, nothing owed
    assert master.sent == []
    t = tracker(master)
    current.append(t)
    sync(master.environment, SimpleNamespace(node_id="w2"))
    assert master.sent == []  # no step in force: nothing to send
    t.begin_step(0, 8, 1.0, rate_rps=10.0)
    ((kind, step, to),) = master.sent
    assert kind == STEP_MESSAGE and to is None and step["ranks"] == {"w1": 0, "w2": 1}
    sync(master.environment, SimpleNamespace(node_id="w2"))
    assert master.sent[-1] == (STEP_MESSAGE, step, "w2")
    t.pause("ci_target")
    sync(master.environment, SimpleNamespace(node_id="w2"))
    assert master.sent[-1] == (STEP_MESSAGE, {"pause": True}, None)  # paused: nothing more sent


def test_a_worker_asks_once_registered_and_begins_a_step_sent_twice_once():
    worker = fake(WorkerRunner, client_id="w2")
    t = tracker(worker)
    assert worker.sent == [(SYNC_MESSAGE, None, None)]
    begun = []
    t.plan.begin = lambda *args, **kw: begun.append((args, kw))
    step = {"step": 0, "users": 8, "warmup_s": 1.0, "rate_rps": 10.0, "arrival": "constant", "seed": 0,
            "burstiness": 1.0, "ranks": {"w1": 0, "w2": 1}, "started": 123.0}  # fmt: skip
    on_step = worker.handlers[STEP_MESSAGE]
    on_step(worker.environment, SimpleNamespace(data=step))
    on_step(worker.environment, SimpleNamespace(data=step))  # its sync's answer crossed the step's own message
    assert len(begun) == 1 and begun[0][1]["rank"] == 1 and begun[0][1]["processes"] == 2
    on_step(worker.environment, SimpleNamespace(data={**step, "step": 1, "started": 130.0}))
    assert len(begun) == 2
