"""The suite's fixes to Locust's own hot paths (locustfiles/startup.py) keep Locust's behaviour."""

from __future__ import annotations

import pytest
from locust import argument_parser
from vllm_loadtest.locustfiles import startup

from tests.helpers.inprocess import parse_options
from tests.helpers.paths import LOCUSTFILE

pytestmark = pytest.mark.unit


def test_locust_defaults_are_built_once_and_filter_a_spawn_message_as_locust_does(monkeypatch):
    # Locust's own, also when an earlier test of this process registered the suite already.
    as_is = getattr(argument_parser.default_args_dict, "__wrapped__", argument_parser.default_args_dict)
    monkeypatch.setattr(argument_parser, "default_args_dict", as_is)  # put back after the test
    options = vars(parse_options("-f", LOCUSTFILE, "--headless"))
    expected = {k for k in options if k not in as_is()}  # the worker's filter (locust/runners.py), as Locust runs it
    locusts = as_is()
    assert "max_tokens" in expected and "host" not in expected

    builds = []
    empty = argument_parser.get_empty_argument_parser
    monkeypatch.setattr(
        argument_parser, "get_empty_argument_parser", lambda *a, **k: builds.append(a) or empty(*a, **k)
    )
    startup.compute_locust_defaults_once()
    kept = {k for k in options if k not in argument_parser.default_args_dict()}
    assert kept == expected
    assert len(builds) == 1  # not once per option of the message
    assert dict(argument_parser.default_args_dict()) == locusts
    startup.compute_locust_defaults_once()  # a second environment in the same process: Locust's, built once more
    assert len(builds) == 2 and argument_parser.default_args_dict.__wrapped__ is as_is
