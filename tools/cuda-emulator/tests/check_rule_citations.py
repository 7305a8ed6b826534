#!/usr/bin/env python3
# SPDX-License-Identifier: Apache-2.0
"""Checks that every driver-rule citation (§N or §N.N...) in src/, tests/ and tools/ names a
section of docs/cuda-driver-rules.md.

usage: check_rule_citations.py SOURCE_ROOT

OTHER_DOCUMENT lists the few citations of another document's sections. Exit 1 lists each unknown
citation as file:line.
"""
import os
import re
import sys

RULES = os.path.join('docs', 'cuda-driver-rules.md')
SCANNED = ('src', 'tests', 'tools')
CITATION = re.compile(r'§(\d+(?:\.\d+)*)')
HEADING = re.compile(r'^#+\s+§(\d+(?:\.\d+)*)\b')
# (file, section) pairs whose citation names another document on a different line.
OTHER_DOCUMENT: set = set()


def sections(root):
    with open(os.path.join(root, RULES), encoding='utf-8') as f:
        return {m.group(1) for line in f for m in [HEADING.match(line)] if m}


def citations(root):
    for top in SCANNED:
        for dirpath, dirnames, filenames in os.walk(os.path.join(root, top)):
            dirnames[:] = [d for d in dirnames if not d.startswith('.')]
            for name in filenames:
                path = os.path.join(dirpath, name)
                rel = os.path.relpath(path, root)
                try:
                    with open(path, encoding='utf-8') as f:
                        lines = f.readlines()
                except (UnicodeDecodeError, OSError):
                    continue  # not a text file
                for number, line in enumerate(lines, 1):
                    for m in CITATION.finditer(line):
                        if (rel, m.group(1)) not in OTHER_DOCUMENT:
                            yield rel, number, m.group(1)


def main():
    if len(sys.argv) != 2:
        print(__doc__, file=sys.stderr)
        return 2
    root = sys.argv[1]
    if not os.path.isfile(os.path.join(root, RULES)):
        print(f'{RULES} is missing: the "§" citations in the code have no document', file=sys.stderr)
        return 1
    known = sections(root)
    if len(known) < 20:
        print(f'{RULES}: only {len(known)} "§" section headings found', file=sys.stderr)
        return 1
    found = list(citations(root))
    missing = [(rel, number, sec) for rel, number, sec in found if sec not in known]
    for rel, number, sec in missing:
        print(f'{rel}:{number}: cites §{sec}, which {RULES} does not have', file=sys.stderr)
    print(f'{len(found)} citations, {len(known)} sections, {len(missing)} unknown')
    return 1 if missing else 0


if __name__ == '__main__':
    sys.exit(main())
