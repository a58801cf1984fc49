"""The options are declared once, by the feature that owns them (locustfiles/declare.py), and composed into one typed
object (locustfiles/settings.py): the parser, the typed object and run.json agree, and no code reads an option with
a default of its own."""

from __future__ import annotations

import dataclasses
import re
from argparse import Namespace

import pytest
from locust.argument_parser import LocustArgumentParser
from vllm_loadtest.analysis import kinds
from vllm_loadtest.locustfiles import declare, settings
from vllm_loadtest.locustfiles.settings import SuiteOptions

from tests.helpers.inprocess import parse_options
from tests.helpers.paths import ROOT

pytestmark = pytest.mark.unit


def parser_actions() -> dict:
    parser = LocustArgumentParser(add_help=False)
    settings.add_arguments(parser)
    return {a.dest: a for a in parser._actions}


def test_every_declaration_class_is_composed_and_listed_once():
    bases = set(SuiteOptions.__mro__[1:-1])
    declared = {c for c in bases if declare.declared(c)}
    assert declared == set(settings.OPTION_CLASSES), declared ^ set(settings.OPTION_CLASSES)
    assert len(settings.OPTION_CLASSES) == len(set(settings.OPTION_CLASSES))
    names = [f.name for c in settings.OPTION_CLASSES for f in declare.declared(c)]
    assert len(names) == len(set(names)), "an option declared by two features"
    for cls in settings.OPTION_CLASSES:
        assert cls.GROUP and cls.__doc__, cls


def test_the_parser_is_the_declarations():
    actions = parser_actions()
    for cls in settings.OPTION_CLASSES:
        for f in declare.declared(cls):
            a = actions[f.name]
            assert a.option_strings == [f.metadata["flag"]] and a.default == f.default, f.name
            assert a.env_var == "LOCUST_" + f.metadata["flag"][2:].upper().replace("-", "_")
            kind = str(f.type).replace(" ", "")
            if kind == "bool":
                assert a.nargs == 0 and a.const is True, f.name  # a switch
            elif kind in ("int", "float", "float|None"):
                assert a.type.__name__ == kind.split("|")[0], f.name
            assert bool(getattr(a, "is_secret", False)) == f.metadata["secret"]
    assert actions["documents_per_request"].option_strings == ["--documents"]  # a dest other than the flag's


def test_a_parsed_namespace_has_every_attribute_of_the_typed_options():
    parsed = parse_options("--steps", "1,2", "--trace-speed", "2", "--ignore-eos")
    typed = settings.read(parsed)
    for f in dataclasses.fields(SuiteOptions):
        assert hasattr(parsed, f.name), f.name  # so a function typed SuiteOptions may be handed either
    assert (typed.steps, typed.trace_speed, typed.ignore_eos, typed.server_profile) == ("1,2", 2.0, True, "")
    assert settings.read(typed) is typed
    assert settings.read(Namespace(turns="3")).turns == "3" and settings.read(Namespace()).endpoint == "completions"
    with pytest.raises(dataclasses.FrozenInstanceError):
        typed.steps = "4"  # type: ignore[misc]


def test_run_json_keeps_locusts_options_then_every_declared_one_but_secrets():
    saved = settings.saved_names()
    assert saved[:3] == ("host", "num_users", "spawn_rate") and "api_key" not in saved and "api_key_env" in saved
    assert "server_profile" not in saved  # run.json has its own section for it


def test_no_option_is_read_with_a_default_of_its_own():
    # getattr(options, "name", default) hid a missing declaration and let two defaults part (105 such reads once).
    pattern = re.compile(r"getattr\(\s*[\w.]*(options|opts)\b[\w.]*,[^,()]+,")  # any getattr with a default
    found = [
        f"{path.relative_to(ROOT)}:{n}"
        for path in sorted((ROOT / "locustfiles").rglob("*.py"))
        for n, line in enumerate(path.read_text(encoding="utf-8").splitlines(), 1)
        if pattern.search(line) and "web_base_path" not in line  # Locust's own option, absent from older Locusts
    ]
    assert not found, found


def test_each_kinds_own_options_are_the_declared_ones():
    # analysis/kinds.py names a kind's own options for the analysis (run.json's values, refused elsewhere); the
    # load side declares them: the two must name the same flags and defaults.
    actions = parser_actions()
    own = [o for kind in kinds.KINDS.values() for o in kind.own_options]
    assert own
    for dest, flag, default in own:
        assert actions[dest].option_strings == [flag] and actions[dest].default == default, dest
