"""run.json saves every option of the suite (a run can be reproduced from it), never a secret."""

from __future__ import annotations

import pytest
from locust.argument_parser import get_parser
from vllm_loadtest.locustfiles import settings as options_mod

pytestmark = pytest.mark.unit

SAVED_OPTIONS = options_mod.saved_names()
SECRETS = {"api_key"}  # --api-key-env (the variable's name) is saved, the key itself never


def suite_options() -> set[str]:
    """The dests settings.add_arguments adds to Locust's own parser."""
    parser = get_parser(default_config_files=[])
    locust_own = {a.dest for a in parser._actions}
    options_mod.add_arguments(parser)
    return {a.dest for a in parser._actions} - locust_own


def test_every_suite_option_is_saved_in_run_json():
    options = suite_options()
    assert {"prompt_file", "max_error_rate", "slo", "dataset"} <= options  # the parser was read
    missing = sorted(options - SECRETS - set(SAVED_OPTIONS))
    assert not missing, f"settings.saved_names() leaves out: {missing}"


def test_no_secret_and_no_option_twice():
    assert not SECRETS & set(SAVED_OPTIONS)
    assert len(SAVED_OPTIONS) == len(set(SAVED_OPTIONS)), [o for o in SAVED_OPTIONS if SAVED_OPTIONS.count(o) > 1]
    assert "web_auth" not in SAVED_OPTIONS
    assert {"host", "num_users", "run_time", "api_key_env", "steps"} <= set(SAVED_OPTIONS)
