"""Mutation testing of stoic's core with cosmic-ray (``make mutation``; docs/mutation.md).

For each module named in tools/mutation.toml: copy ``src/``, ``tests/`` and ``pyproject.toml``
to a temporary directory (the work tree is never mutated), let cosmic-ray enumerate every
mutant of the module, drop those inside annotations (never evaluated: every core module has
``from __future__ import annotations``), draw a fixed-seed sample, and run the module's own
test files against each drawn mutant with cosmic-ray's worker (``mutate_and_test``: mutate the
file, run the command, restore it). Killed / survived per module and every survivor are
printed; the cosmic-ray session of each module is kept in ``.mutation/NAME.sqlite``
(``cr-report .mutation/NAME.sqlite``) and a summary in ``.mutation/NAME.json``.

Runs under the interpreter that has cosmic-ray (``.venv-mutation``); the tests run under
``--python`` (the project's ``.venv``). Modules run in parallel, ``--jobs`` at a time.
"""

from __future__ import annotations

import argparse
import glob
import hashlib
import json
import os
import random
import shlex
import shutil
import subprocess
import sys
import tempfile
import time
import tomllib
from pathlib import Path
from typing import Any

ROOT = Path(__file__).resolve().parent.parent
TOOLS = Path(__file__).resolve().parent
COPIED = ("src", "tests", "pyproject.toml")


def _load(config_path: Path) -> tuple[dict[str, Any], dict[str, dict[str, Any]]]:
    with config_path.open("rb") as handle:
        config = tomllib.load(handle)
    return config.get("defaults", {}), config["modules"]


def _test_files(spec: dict[str, Any], root: Path) -> list[str]:
    """The module's test files, relative to ``root``, in order, each once."""
    excluded = set(spec.get("exclude", ()))
    files: list[str] = []
    for pattern in spec["tests"]:
        for match in sorted(glob.glob(pattern, root_dir=root)):
            if match not in excluded and match not in files:
                files.append(match)
    return files


# --------------------------------------------------------------------------- one module (worker)

def _in_annotation(module_ast: Any, position: tuple[int, int]) -> bool:
    """Whether ``position`` lies in a parameter, return or variable annotation."""
    pos = tuple(position)
    leaf = module_ast.get_leaf_for_position(pos)
    node = leaf.parent if leaf is not None else None
    while node is not None:
        kind = node.type
        annotation = None
        if kind in ("param", "funcdef", "async_funcdef"):
            annotation = node.annotation
        elif kind == "annassign" and len(node.children) > 1:
            annotation = node.children[1]
        if annotation is not None and annotation.start_pos <= pos < annotation.end_pos:
            return True
        if kind in ("suite", "file_input"):  # statements never sit inside an annotation
            return False
        node = node.parent
    return False


def _killed_by(output: str | None) -> str:
    """The test file whose failure killed a mutant (pytest -x: the first FAILED/ERROR line)."""
    if output == "timeout":
        return "(timeout)"
    for line in (output or "").splitlines():
        if line.startswith(("FAILED ", "ERROR ")):
            return line.split(" ", 1)[1].split("::", 1)[0].split(" - ", 1)[0]
    return "(other)"


def _changed_lines(diff: str) -> tuple[str, str]:
    old = [line[1:].strip() for line in diff.splitlines() if line.startswith("-") and not line.startswith("---")]
    new = [line[1:].strip() for line in diff.splitlines() if line.startswith("+") and not line.startswith("+++")]
    return " / ".join(old), " / ".join(new)


def _previous_kills(previous: Path | None, name: str, source_sha: str) -> set[tuple[str, int]]:
    """(operator, occurrence) of the mutants killed in an earlier session of the same source."""
    if previous is None:
        return set()
    from cosmic_ray.work_db import WorkDB, use_db
    from cosmic_ray.work_item import TestOutcome

    summary = json.loads((previous / f"{name}.json").read_text())
    if summary.get("source_sha256") != source_sha:
        raise SystemExit(f"[{name}] {previous} is a session of another version of the module: run it in full")
    with use_db(str(previous / f"{name}.sqlite"), WorkDB.Mode.open) as db:
        return {
            (item.mutations[0].operator_name, item.mutations[0].occurrence)
            for item, result in db.completed_work_items
            if result.test_outcome in (TestOutcome.KILLED, TestOutcome.INCOMPETENT)
        }


def run_module(name: str, spec: dict[str, Any], settings: dict[str, Any], python: str, out: Path,
               previous: Path | None = None) -> int:
    from cosmic_ray.ast import get_ast_from_path
    from cosmic_ray.commands import init
    from cosmic_ray.mutating import mutate_and_test
    from cosmic_ray.testing import run_tests
    from cosmic_ray.work_db import WorkDB, use_db
    from cosmic_ray.work_item import TestOutcome, WorkerOutcome, WorkResult

    def say(message: str) -> None:
        print(f"[{name}] {message}", flush=True)

    with tempfile.TemporaryDirectory(prefix=f"stoic-mutation-{name}-") as scratch:
        copy = Path(scratch)
        for item in COPIED:
            source = ROOT / item
            if source.is_dir():
                shutil.copytree(source, copy / item, ignore=shutil.ignore_patterns("__pycache__", ".hypothesis"))
            else:
                shutil.copy2(source, copy / item)
        os.chdir(copy)
        # The copy's src/ comes before the editable install's path; the profile plugin from tools/.
        os.environ["PYTHONPATH"] = os.pathsep.join([str(copy / "src"), str(TOOLS)])
        os.environ.pop("CI", None)  # tests that need a server skip rather than fail; none are targeted
        tests = _test_files(spec, copy)
        if not tests:
            say("no test files match: skipped")
            return 2
        extra = [str(a) for a in spec.get("pytest_args", ())]
        command = shlex.join([python, "-m", "pytest", "-x", "-q", "-p", "_mutation_pytest", *extra, *tests])
        module_path = copy / spec["path"]
        source_sha = hashlib.sha256(module_path.read_bytes()).hexdigest()
        kept = _previous_kills(previous, name, source_sha)

        started = time.monotonic()
        outcome, output = run_tests(command, timeout=600)
        clean = time.monotonic() - started
        if outcome != TestOutcome.SURVIVED:
            say(f"the tests fail without any mutation ({outcome.value}):\n{output[-3000:]}")
            return 2
        timeout = max(float(settings["min_timeout"]), float(settings["timeout_factor"]) * clean)
        say(f"{len(tests)} test files, clean run {clean:.1f} s, per-mutant timeout {timeout:.0f} s")

        out.mkdir(parents=True, exist_ok=True)
        session = out / f"{name}.sqlite"
        session.unlink(missing_ok=True)
        with use_db(str(session), WorkDB.Mode.create) as db:
            init([module_path], db, {})
            items = sorted(db.work_items, key=lambda w: (w.mutations[0].operator_name, w.mutations[0].occurrence))
            module_ast = get_ast_from_path(module_path)
            eligible = [w for w in items if not _in_annotation(module_ast, w.mutations[0].start_pos)]
            # A string seed is hashed with SHA-512 by random.Random: the same draw on every run.
            rng = random.Random(f"{settings['seed']}:{name}")
            drawn = rng.sample(eligible, min(int(settings["sample"]), len(eligible)))
            drawn_ids = {w.job_id for w in drawn}
            db.set_multiple_results(
                [w.job_id for w in items if w.job_id not in drawn_ids],
                WorkResult(worker_outcome=WorkerOutcome.SKIPPED, output="not drawn, or inside an annotation"),
            )
            say(f"{len(items)} mutants, {len(eligible)} outside annotations, {len(drawn)} drawn")
            if kept:
                say(f"{sum((w.mutations[0].operator_name, w.mutations[0].occurrence) in kept for w in drawn)} "
                    f"of them killed in {previous}: only the others run")
            for index, item in enumerate(sorted(drawn, key=lambda w: w.mutations[0].start_pos), start=1):
                mutation = item.mutations[0]
                if (mutation.operator_name, mutation.occurrence) in kept:
                    db.set_result(item.job_id, WorkResult(
                        worker_outcome=WorkerOutcome.NORMAL, test_outcome=TestOutcome.KILLED,
                        output=f"killed in {previous}"))
                    continue
                result = mutate_and_test(item.mutations, command, timeout)
                db.set_result(item.job_id, result)
                if index % 25 == 0:
                    say(f"{index}/{len(drawn)} run")

            killed = timeouts = incompetent = 0
            killed_by: dict[str, int] = {}
            survivors: list[dict[str, Any]] = []
            for item, result in db.completed_work_items:
                if result.worker_outcome == WorkerOutcome.SKIPPED:
                    continue
                mutation = item.mutations[0]
                if result.test_outcome == TestOutcome.SURVIVED:
                    old, new = _changed_lines(result.diff or "")
                    survivors.append({
                        "line": mutation.start_pos[0], "column": mutation.start_pos[1],
                        "operator": mutation.operator_name, "occurrence": mutation.occurrence,
                        "old": old, "new": new, "job_id": item.job_id,
                    })
                elif result.test_outcome == TestOutcome.KILLED:
                    killed += 1
                    timeouts += result.output == "timeout"
                    by = _killed_by(result.output) if not (result.output or "").startswith("killed in ") else "(kept)"
                    killed_by[by] = killed_by.get(by, 0) + 1
                else:  # could not run (an exception in the worker): noticed, but not by a test
                    incompetent += 1
        survivors.sort(key=lambda s: (s["line"], s["column"], s["operator"]))
        summary = {
            "module": name, "path": spec["path"], "mutants": len(items), "eligible": len(eligible),
            "drawn": len(drawn), "killed": killed, "timeouts": timeouts, "incompetent": incompetent,
            "survived": len(survivors), "survivors": survivors, "killed_by": killed_by,
            "seconds": round(time.monotonic() - started, 1),
            "seed": settings["seed"], "source_sha256": source_sha,
        }
        (out / f"{name}.json").write_text(json.dumps(summary, indent=2) + "\n")
        say(f"done: {killed} killed, {len(survivors)} survived in {summary['seconds']} s")
        return 0


# --------------------------------------------------------------------------- the whole run

def _rate(summary: dict[str, Any]) -> float:
    ran = summary["killed"] + summary["survived"] + summary["incompetent"]
    return 100.0 * (summary["killed"] + summary["incompetent"]) / ran if ran else 100.0


def _report(summaries: list[dict[str, Any]], fail_under: dict[str, float]) -> bool:
    ok = True
    print()
    print(f"{'module':<12} {'mutants':>7} {'drawn':>5} {'killed':>6} {'survived':>8} {'kill rate':>9}")
    for s in summaries:
        rate = _rate(s)
        low = rate < fail_under[s["module"]]
        ok = ok and not low
        note = f"  (< {fail_under[s['module']]:.0f}%)" if low else ""
        timeouts = f" ({s['timeouts']} by timeout)" if s["timeouts"] else ""
        print(f"{s['module']:<12} {s['mutants']:>7} {s['drawn']:>5} {s['killed']:>6} {s['survived']:>8} "
              f"{rate:>8.1f}%{note}{timeouts}")
    for s in summaries:
        by = ", ".join(f"{Path(f).name if f.startswith('tests/') else f} {n}"
                       for f, n in sorted(s.get("killed_by", {}).items(), key=lambda kv: -kv[1]))
        print(f"killed in {s['module']} by: {by}")
    for s in summaries:
        if s["survivors"]:
            print(f"\nsurvivors in {s['path']}:")
            for v in s["survivors"]:
                print(f"  line {v['line']}: {v['operator'].removeprefix('core/')}: {v['old']}  ->  {v['new']}")
    return ok


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--config", type=Path, default=TOOLS / "mutation.toml")
    parser.add_argument("--modules", default="", help="comma-separated names from the config (default: all)")
    parser.add_argument("--sample", type=int, help="mutants drawn per module")
    parser.add_argument("--seed", type=int, help="the draw's seed")
    parser.add_argument("--jobs", type=int, default=2, help="modules run at once")
    parser.add_argument("--python", default=str(ROOT / ".venv" / "bin" / "python"),
                        help="the interpreter that runs the tests (the project's venv)")
    parser.add_argument("--out", type=Path, default=ROOT / ".mutation")
    parser.add_argument("--keep-killed-from", type=Path, metavar="DIR",
                        help="an earlier --out of the same sources: mutants killed there are not run again")
    parser.add_argument("--worker", help=argparse.SUPPRESS)
    args = parser.parse_args(argv)
    args.python = os.path.abspath(args.python)  # not resolve(): the venv's python is a symlink

    defaults, modules = _load(args.config)
    settings = {"sample": 150, "seed": 0, "fail_under": 90.0, "timeout_factor": 4.0, "min_timeout": 30.0}
    settings.update(defaults)
    if args.sample is not None:
        settings["sample"] = args.sample
    if args.seed is not None:
        settings["seed"] = args.seed
    names = [n.strip() for n in args.modules.split(",") if n.strip()] or list(modules)
    unknown = [n for n in names if n not in modules]
    if unknown:
        parser.error(f"unknown module(s) {', '.join(unknown)}; the config has {', '.join(modules)}")

    if args.worker:
        return run_module(args.worker, modules[args.worker], {**settings, **modules[args.worker]},
                          args.python, args.out.resolve(),
                          args.keep_killed_from.resolve() if args.keep_killed_from else None)

    started = time.monotonic()
    pending = list(names)
    running: list[tuple[str, subprocess.Popen[bytes]]] = []
    failed: list[str] = []
    while pending or running:
        while pending and len(running) < max(1, args.jobs):
            name = pending.pop(0)
            command = [sys.executable, str(Path(__file__).resolve()), "--config", str(args.config.resolve()),
                       "--python", args.python, "--out", str(args.out.resolve()), "--worker", name]
            if args.sample is not None:
                command += ["--sample", str(args.sample)]
            if args.seed is not None:
                command += ["--seed", str(args.seed)]
            if args.keep_killed_from is not None:
                command += ["--keep-killed-from", str(args.keep_killed_from.resolve())]
            running.append((name, subprocess.Popen(command)))
        time.sleep(0.5)
        for entry in list(running):
            if entry[1].poll() is not None:
                running.remove(entry)
                if entry[1].returncode:
                    failed.append(entry[0])
    summaries = [json.loads((args.out / f"{n}.json").read_text()) for n in names if n not in failed]
    fail_under = {n: float(modules[n].get("fail_under", settings["fail_under"])) for n in names}
    ok = _report(summaries, fail_under)
    print(f"\nmutation run: {time.monotonic() - started:.0f} s, sample {settings['sample']}, seed {settings['seed']}")
    if failed:
        print(f"could not run: {', '.join(failed)}")
    return 0 if ok and not failed else 1


if __name__ == "__main__":
    sys.exit(main())
