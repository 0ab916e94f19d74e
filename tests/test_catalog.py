"""The event catalog is consistent data, and the reference docs are generated from it."""

from __future__ import annotations

import importlib.util
import re
from pathlib import Path
from types import ModuleType

import pytest
from otel_support import SAMPLES

from stoic.events import CATALOG, Level, check_event
from stoic.events._catalog import _SPECS

ROOT = Path(__file__).resolve().parent.parent
_KINDS = "breaker|ratelimiter|bulkhead|hedge|retry|timeout|fallback|throttle|keyed|control|fleet"
NAME = re.compile(rf"^({_KINDS})\.[a-z]+(_[a-z]+)*$")
KEY = re.compile(r"^[a-z]+(_[a-z]+)*(\.[a-z]+(_[a-z]+)*)*$")
SECONDS_KEYS = {"open_for", "retry_after", "duration", "waited", "elapsed", "latency", "next_delay", "requested",
                "capped", "outage"}


def test_names_are_unique_dotted_lowercase_and_keyed_by_themselves():
    assert len(_SPECS) == len(CATALOG)  # no name given twice
    for name, spec in CATALOG.items():
        assert spec.name == name
        assert NAME.match(name), name


@pytest.mark.parametrize("name", list(CATALOG))
def test_each_entry_is_well_formed(name):
    spec = CATALOG[name]
    assert isinstance(spec.level, Level)
    assert spec.description.strip() and spec.description.rstrip().endswith((".", ")"))
    for key, attribute in spec.attributes.items():
        assert KEY.match(key), key
        assert attribute.type in {"str", "int", "float", "bool"}, (name, key)
        assert attribute.description.strip(), (name, key)
        assert key != "label", "the label is Event.label, never an attribute"
        assert key != "event", "would collide with structlog's message argument"
    assert spec.required <= spec.allowed
    assert spec.required == {k for k, a in spec.attributes.items() if not a.optional}


def test_errors_are_recorded_by_type_name_and_durations_as_float_seconds():
    for spec in CATALOG.values():
        for key, attribute in spec.attributes.items():
            assert not key.startswith("error") or key == "error.type", (spec.name, key)
            if key == "error.type":
                assert attribute.type == "str"
            if key in SECONDS_KEYS:
                assert attribute.type == "float", (spec.name, key)
                assert "second" in attribute.description, (spec.name, key)


def test_debug_events_are_the_per_call_ones():
    debug = {n for n, s in CATALOG.items() if s.level == Level.DEBUG}
    assert debug == {"breaker.rejected", "breaker.recorded", "breaker.ignored", "ratelimiter.waited",
                     "hedge.attempt_failed"}
    assert {n for n, s in CATALOG.items() if s.level == Level.ERROR} == {"breaker.defect", "retry.defect"}


def test_the_samples_used_by_adapter_tests_cover_the_catalog_and_conform():
    assert list(SAMPLES) == list(CATALOG)
    for name, attributes in SAMPLES.items():
        assert check_event(name, attributes) == [], name
        # every optional attribute but breaker.rejected's reason (it replaces retry_after when the
        # caller, not the breaker, refused) is exercised by the samples
        missing = CATALOG[name].allowed - set(attributes)
        assert missing <= ({"reason"} if name == "breaker.rejected" else set()), (name, missing)


@pytest.mark.parametrize("bad", [None, [1], {"a": 1}, (1,), b"x", object()])
def test_attribute_values_that_are_not_primitives_are_refused(bad):
    for name, spec in CATALOG.items():
        for key in spec.attributes:
            problems = check_event(name, {**SAMPLES[name], key: bad})
            assert any(key in p for p in problems), (name, key, bad)


def test_every_sample_value_is_a_primitive():
    for attributes in SAMPLES.values():
        for value in attributes.values():
            assert type(value) in (str, int, float, bool)


def _generator() -> ModuleType:
    spec = importlib.util.spec_from_file_location("stoic_docs_generate", ROOT / "docs" / "generate.py")
    assert spec is not None and spec.loader is not None
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


@pytest.mark.parametrize("page", ["events.md", "metrics.md"])
def test_committed_reference_docs_equal_what_the_generator_writes(page):
    generator = _generator()
    committed = (ROOT / "docs" / page).read_text(encoding="utf-8")
    assert committed == generator.PAGES[page](), f"docs/{page} is stale: run .venv/bin/python docs/generate.py"


def test_the_event_reference_lists_every_event_and_attribute():
    text = _generator().render_events()
    for name, spec in CATALOG.items():
        assert f"### `{name}`" in text
        for key in spec.attributes:
            assert f"`{key}`" in text


def test_check_mode_reports_a_stale_page(tmp_path, monkeypatch, capsys):
    generator = _generator()
    monkeypatch.setattr(generator, "DOCS", tmp_path)
    assert generator.main(["--check"]) == 1
    assert "stale" in capsys.readouterr().err
    assert generator.main([]) == 0
    assert generator.main(["--check"]) == 0
    (tmp_path / "events.md").write_text("edited by hand\n", encoding="utf-8")
    assert generator.main(["--check"]) == 1


def _literal_emits() -> list[tuple[str, int, str, set[str]]]:
    """Every ``emit("name", label, level, now, {...})`` in stoic's source whose attributes are a
    dict literal with string keys: (file, line, name, keys)."""
    import ast

    found: list[tuple[str, int, str, set[str]]] = []
    for path in sorted((ROOT / "src" / "stoic").rglob("*.py")):
        for node in ast.walk(ast.parse(path.read_text(), str(path))):
            if not (isinstance(node, ast.Call) and isinstance(node.func, ast.Name) and node.func.id == "emit"
                    and len(node.args) == 5 and isinstance(node.args[0], ast.Constant)
                    and isinstance(node.args[4], ast.Dict)):
                continue
            keys = node.args[4].keys
            if all(isinstance(k, ast.Constant) and isinstance(k.value, str) for k in keys):
                found.append((str(path.relative_to(ROOT)), node.lineno, node.args[0].value,
                              {k.value for k in keys}))  # type: ignore[union-attr]
    return found


def test_every_event_emitted_with_literal_attributes_has_the_keys_the_catalog_requires():
    # The one kind of contract break a test can miss by not driving that path (the shared
    # breaker's defect event and the shared limiters' oversized event once sent none).
    emits = _literal_emits()
    assert len(emits) >= 30  # the scan finds the emit calls at all
    problems = []
    for file, line, name, keys in emits:
        spec = CATALOG.get(name)
        if spec is None:
            problems.append(f"{file}:{line}: {name} is not in the catalog")
            continue
        if missing := spec.required - keys:
            problems.append(f"{file}:{line}: {name} lacks {sorted(missing)}")
        if extra := keys - spec.allowed:
            problems.append(f"{file}:{line}: {name} sends {sorted(extra)}, not in the catalog")
    assert problems == []



def _built_events() -> list[tuple[str, int, str, set[str] | None, str | None]]:
    """Every event stoic builds, as written in its source: each ``emit("name", label, level, ...)``
    call (keys None: the literal scan above checks them), and each event built as data before
    one emit sends it, a call (``self._event("retry.x", Level.INFO, {...})``, ``self._emit(...)``)
    or a tuple (a breaker's pending ``("breaker.opened", _WARNING, {...})``, a family's
    ``("keyed.full", Level.WARNING, {...})``) holding a catalog name and a dict literal with
    string keys: (file, line, name, keys, level name when written there)."""
    import ast

    def level_of(part: ast.expr) -> str | None:
        text = ast.unparse(part).rpartition(".")[2].lstrip("_")
        return text if text in {"DEBUG", "INFO", "WARNING", "ERROR"} else None

    found: list[tuple[str, int, str, set[str] | None, str | None]] = []
    for path in sorted((ROOT / "src" / "stoic").rglob("*.py")):
        if path.name == "_catalog.py":
            continue
        file = str(path.relative_to(ROOT))
        for node in ast.walk(ast.parse(path.read_text(), str(path))):
            if isinstance(node, ast.Call) and isinstance(node.func, ast.Name) and node.func.id == "emit":
                if len(node.args) == 5 and isinstance(node.args[0], ast.Constant) and node.args[0].value in CATALOG:
                    found.append((file, node.lineno, node.args[0].value, None, level_of(node.args[2])))
                continue
            parts = node.args if isinstance(node, ast.Call) else node.elts if isinstance(node, ast.Tuple) else []
            names = [p.value for p in parts if isinstance(p, ast.Constant) and p.value in CATALOG]
            dicts = [p for p in parts if isinstance(p, ast.Dict)
                     and all(isinstance(k, ast.Constant) and isinstance(k.value, str) for k in p.keys)]
            if len(names) == 1 and len(dicts) == 1:
                levels = [lvl for p in parts if (lvl := level_of(p)) is not None]
                found.append((file, node.lineno, names[0], {k.value for k in dicts[0].keys},  # type: ignore[union-attr]
                              levels[0] if levels else None))
    return found


def test_every_event_has_the_catalog_level_and_one_built_as_data_its_keys():
    # The retry's, a breaker's pending, a family's and the control plane's events are built as
    # data before one emit call sends them, which the literal scan above never sees; and no
    # scan compared an event's level with the catalog's (RecordingSink checks attributes only).
    built = _built_events()
    assert len([b for b in built if b[3] is None]) >= 30 and len([b for b in built if b[3] is not None]) >= 15
    problems = []
    for file, line, name, keys, level in built:
        spec = CATALOG[name]
        if level is not None and level != spec.level.name:
            problems.append(f"{file}:{line}: {name} at {level}, the catalog says {spec.level.name}")
        if keys is None:
            continue
        if missing := spec.required - keys:
            problems.append(f"{file}:{line}: {name} lacks {sorted(missing)}")
        if extra := keys - spec.allowed:
            problems.append(f"{file}:{line}: {name} sends {sorted(extra)}, not in the catalog")
    assert problems == []
