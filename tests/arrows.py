#!/usr/bin/env python3
"""tests/arrows.py: every #include "x/y.h" of ours must follow the arrows.

The rooms of the tree and what each may include (besides itself, config.h
and system headers) are listed below; docs/architecture.md draws the same
map. An include that is not allowed fails the test with file:line, the
include, and the rule. Run: python3 tests/arrows.py [SOURCE_ROOT]
"""
import os
import re
import sys

# room -> rooms it may include. A room is the longest matching prefix of a
# path. Arrows only point down: the list must stay acyclic (checked below).
ARROWS = {
    'base': [],
    'kernels': [],
    'topology': ['base'],
    'sparsify': ['kernels', 'base'],
    'conf': ['sparsify', 'topology', 'kernels', 'base'],
    'node/wire': ['base'],
    'node/sec': ['node/wire', 'conf', 'base'],
    'node/transport': ['base'],
    'node/net': ['node/sec', 'node/wire', 'node/transport', 'base'],
    'node/membership': ['node/wire', 'base'],
    'node/train': ['kernels', 'base'],
    'node/gossip': ['node/net', 'node/sec', 'node/wire', 'node/transport', 'node/train',
                    'conf', 'sparsify', 'topology', 'kernels', 'base'],
    'node/status': ['base'],
    'node/runtime': ['node/status', 'node/gossip', 'node/train', 'node/membership', 'node/net',
                     'node/transport', 'node/sec', 'node/wire', 'conf', 'sparsify', 'topology',
                     'kernels', 'base'],
    'node': ['node/run', 'node/runtime', 'node/sec', 'conf', 'kernels', 'base'],  # main.c
    # `dsnode run`'s loop: a program of the public API (include/dsnode/
    # dsnode.h, an angle-bracket include), never of the engine inside it.
    'node/run': ['node/train', 'conf', 'kernels', 'base'],
    # libdsnode: the public API over the engine. Its header,
    # include/dsnode/dsnode.h, includes nothing of ours (it is installed).
    'node/api': ['node/runtime', 'node/status', 'node/train', 'conf', 'base'],
    'include': [],
    'tools/dslaunch': ['conf', 'base'],
    'tools/dsviz': ['topology', 'base'],
    # dsbench is white-box by declaration (tools/dsbench/meson.build): it
    # measures internals, and links what it measures.
    'tools/dsbench': ['tools/dslaunch', 'tools/dsviz', 'node/runtime', 'node/status',
                      'node/gossip', 'node/train', 'node/membership', 'node/net',
                      'node/transport', 'node/sec', 'node/wire', 'conf', 'sparsify', 'topology',
                      'kernels', 'base'],
    'tests': None,  # tests may include anything
}

INCLUDE = re.compile(r'^\s*#\s*include\s+"([^"]+)"')
SOURCE = ('.c', '.h', '.cu')


def room_of(path):
    best = None
    for room in ARROWS:
        if path == room or path.startswith(room + '/'):
            if best is None or len(room) > len(best):
                best = room
    return best


def acyclic():
    state = {}

    def visit(r, stack):
        if state.get(r) == 1:
            raise SystemExit('arrows: cycle through ' + ' -> '.join(stack + [r]))
        if state.get(r) == 2:
            return
        state[r] = 1
        for t in ARROWS[r] or []:
            visit(t, stack + [r])
        state[r] = 2

    for r in ARROWS:
        visit(r, [])


def doc_matches(root):
    """docs/architecture.md's table of arrows must be this list, row for row."""
    path = os.path.join(root, 'docs', 'architecture.md')
    with open(path, encoding='utf-8') as f:
        text = f.read()
    start = text.find('| room | may include |')
    if start < 0:
        print('docs/architecture.md: no "| room | may include |" table')
        return 1
    rows = {}
    for line in text[start:].splitlines()[2:]:
        if not line.startswith('|'):
            break
        room, inc = [c.strip() for c in line.strip('|').split('|')]
        room = 'node' if room == 'node (main.c)' else room
        rows[room] = (None if inc == 'anything' else
                      [] if inc == 'nothing of ours' else [x.strip() for x in inc.split(',')])
    bad = 0
    for room in sorted(set(rows) | set(ARROWS)):
        if rows.get(room, 'missing') != ARROWS.get(room, 'missing'):
            print(f'docs/architecture.md: row {room}: {rows.get(room, "missing")} '
                  f'but tests/arrows.py says {ARROWS.get(room, "missing")}')
            bad += 1
    return bad


def main():
    root = sys.argv[1] if len(sys.argv) > 1 else os.path.join(os.path.dirname(__file__), '..')
    acyclic()
    bad = doc_matches(root)
    checked = 0
    for top in sorted(set(r.split('/')[0] for r in ARROWS)):
        for dirpath, _, files in os.walk(os.path.join(root, top)):
            for name in sorted(files):
                if not name.endswith(SOURCE):
                    continue
                path = os.path.relpath(os.path.join(dirpath, name), root)
                src = room_of(path)
                if src is None or ARROWS[src] is None:
                    continue
                with open(os.path.join(root, path), encoding='utf-8') as f:
                    for no, line in enumerate(f, 1):
                        m = INCLUDE.match(line)
                        if not m or m.group(1) == 'config.h':
                            continue
                        inc = m.group(1)
                        if '/' not in inc:  # same folder, by relative name
                            continue
                        checked += 1
                        dst = room_of(inc)
                        if dst is None:
                            print(f'{path}:{no}: #include "{inc}": not a room of the tree')
                            bad += 1
                        elif dst != src and dst not in ARROWS[src]:
                            allowed = ', '.join(ARROWS[src]) or 'nothing of ours'
                            print(f'{path}:{no}: #include "{inc}": {src} -> {dst} is not an '
                                  f'arrow ({src} may include {allowed})')
                            bad += 1
    print(f'arrows: {checked} includes checked, {bad} not allowed')
    return 1 if bad else 0


if __name__ == '__main__':
    sys.exit(main())
