#!/usr/bin/env python3
# SPDX-License-Identifier: Apache-2.0
"""Runs a command and checks how it ended, for meson tests of the command-line tools.

    expect_run.py --exit N [--stdout-has TEXT]... [--stderr-has TEXT]... [--stdout-json]
                  [--json-has PATH=VALUE]... [--output-lacks TEXT]... -- COMMAND [ARG]...

Fails (exit 1, saying why) unless COMMAND exits with status N exactly (a signal is never a
match), each --stdout-has/--stderr-has text occurs in that stream, no --output-lacks text occurs
in either, and with --stdout-json stdout parses as JSON. --json-has (implies --stdout-json): the
value at PATH in that document (keys and list indexes joined by dots, e.g. devices.0.vmm) equals
VALUE read as JSON (true, 0, "text", []). Unlike meson's should_fail, a crash (SIGABRT, SIGSEGV)
never passes.
"""
import argparse
import json
import subprocess
import sys


def main() -> int:
    parser = argparse.ArgumentParser()
    parser.add_argument("--exit", type=int, required=True, dest="status")
    parser.add_argument("--stdout-has", action="append", default=[])
    parser.add_argument("--stderr-has", action="append", default=[])
    parser.add_argument("--output-lacks", action="append", default=[])
    parser.add_argument("--stdout-json", action="store_true")
    parser.add_argument("--json-has", action="append", default=[])
    parser.add_argument("--timeout", type=float, default=120)
    parser.add_argument("command", nargs=argparse.REMAINDER)
    args = parser.parse_args()
    command = args.command[1:] if args.command[:1] == ["--"] else args.command
    if not command:
        parser.error("no command given")
    run = subprocess.run(command, capture_output=True, timeout=args.timeout)
    out = run.stdout.decode("utf-8", "replace")
    err = run.stderr.decode("utf-8", "replace")
    problems = []
    if run.returncode != args.status:
        how = (f"was killed by signal {-run.returncode}" if run.returncode < 0
               else f"exited with {run.returncode}")
        problems.append(f"{how}, expected exit status {args.status}")
    problems += [f"stdout lacks {t!r}" for t in args.stdout_has if t not in out]
    problems += [f"stderr lacks {t!r}" for t in args.stderr_has if t not in err]
    problems += [f"output has {t!r}" for t in args.output_lacks if t in out or t in err]
    if args.stdout_json or args.json_has:
        try:
            doc = json.loads(run.stdout.decode("utf-8"))
        except (UnicodeDecodeError, json.JSONDecodeError) as e:
            problems.append(f"stdout is not valid UTF-8 JSON: {e}")
        else:
            for check in args.json_has:
                path, _, want = check.partition("=")
                try:
                    got = doc
                    for key in path.split("."):
                        got = got[int(key)] if isinstance(got, list) else got[key]
                except (KeyError, IndexError, ValueError, TypeError):
                    problems.append(f"JSON has no {path!r}")
                    continue
                if got != json.loads(want):
                    problems.append(f"JSON {path} is {got!r}, expected {want}")
    if problems:
        print(f"command: {command}", file=sys.stderr)
        print(f"--- stdout ---\n{out}--- stderr ---\n{err}---", file=sys.stderr)
        for p in problems:
            print(f"expect_run: {p}", file=sys.stderr)
        return 1
    return 0


if __name__ == "__main__":
    sys.exit(main())
