#!/usr/bin/env python3
"""tests/conf_keys.py: every config key the tree names must exist.

A message or a page that names a key the loader does not know sends a user
looking for a setting that is not there (issue 16: a transport warning
named `transport.chunk_kb`). This reads the sections and keys from
conf/keys.h, then scans

  - the string literals of our C sources (base/ kernels/ sparsify/
    topology/ conf/ node/ tools/; comments are not messages),
  - the docs pages (docs/*.md, README.md) and the example configs
    (conf/examples/*.ini),

for `section.key` where section is one of the config sections, and fails
with file:line for every key conf/keys.h does not list.

What is not a key: a file name whose first part happens to be a section
(`status.json`, `cluster.key`, `node.key`), told by its extension; a name
inside a longer dotted or slashed name (`node/gossip/gossip.c`,
`c->train.lr` is a key anyway); a call (`x.y(`); a field of the status
JSON whose object is named like a section (`gossip.timeouts` is a counter
of the status page, not a key; the field names are read from node/).

Run: python3 tests/conf_keys.py [SOURCE_ROOT]
     python3 tests/conf_keys.py --self-test
"""
import os
import re
import sys

C_DIRS = ('base', 'kernels', 'sparsify', 'topology', 'conf', 'node', 'tools')
C_EXT = ('.c', '.h', '.cu')
# File extensions (and the like) after a section name: not keys.
NOT_KEYS = {'json', 'bin', 'ini', 'c', 'h', 'cu', 'md', 'log', 'key', 'pub', 'txt', 'py',
            'gz', 'so', 'tmp', 'html', 'csv', 'svg', 'png', 'dot', 'sh', 'tsv', 'out', 'pid',
            'conf', 'sbatch', 'service'}
# The status JSON (docs/status.md) has objects named like config sections
# (gossip, transport, train) holding counters and results: `gossip.timeouts`
# is a counter of the status page, not a key. Their field names are read
# from node/: the metric rows of the stats X-macro lists
# (X(TYPE, field, "json_name", "dsnode_...", ...), a row may continue on
# the next line after a backslash), the metric groups
# (.json = "name") and the fields node/status/json.c puts.
STATUS_FIELD_RES = (
    re.compile(r'\bX\(\s*\w+\s*,\s*\w+\s*,\s*"(\w+)"[\s\\]*,[\s\\]*"dsnode_'),
    re.compile(r'\.json\s*=\s*"(\w+)"'),
    re.compile(r'\bput\w*\(\s*\w+\s*,\s*\w+\s*,\s*"(\w+)"'),
)


def read_keys(root):
    text = open(os.path.join(root, 'conf', 'keys.h'), encoding='utf-8').read()
    sections = re.findall(r'\bS\((\w+), X\)', text)
    keys = set(re.findall(r'\bX\((?:STR|INT|FLOAT|BOOL|ENUM|ILIST|SLIST),\s*(\w+),\s*(\w+),',
                          text))
    if not sections or not keys:
        sys.exit('conf_keys: cannot read the sections and keys of conf/keys.h')
    return sections, {f'{s}.{k}' for s, k in keys}


def read_status_fields(root):
    fields = set()
    for dirpath, _, names in os.walk(os.path.join(root, 'node')):
        for f in names:
            if f.endswith(('.c', '.h')):
                text = open(os.path.join(dirpath, f), encoding='utf-8', errors='replace').read()
                for r in STATUS_FIELD_RES:
                    fields.update(r.findall(text))
    if not {'timeouts', 'drops', 'test_acc'} <= fields:
        sys.exit('conf_keys: cannot find the status field names in node/ '
                 f'(found {len(fields)}); update STATUS_FIELD_RES')
    return fields


def mention_re(sections):
    return re.compile(r'(?<![\w./>-])(' + '|'.join(map(re.escape, sections)) +
                      r')\.([A-Za-z_]\w*)(?![\w(]|\.\w)')


def c_literals(text):
    """(line, text) of each run of adjacent string literals, comments and
    character literals skipped; adjacent literals ("a" "b") are joined."""
    out, i, n, line = [], 0, len(text), 1
    cur, cur_line, last_end = None, 0, -1
    while i < n:
        ch = text[i]
        if ch == '\n':
            line += 1
            i += 1
        elif text.startswith('//', i):
            j = text.find('\n', i)
            i = n if j < 0 else j
        elif text.startswith('/*', i):
            j = text.find('*/', i + 2)
            j = n if j < 0 else j + 2
            line += text.count('\n', i, j)
            i = j
        elif ch in '"\'':
            j, buf = i + 1, []
            while j < n and text[j] != ch and text[j] != '\n':
                if text[j] == '\\' and j + 1 < n:
                    buf.append(text[j:j + 2])
                    j += 2
                else:
                    buf.append(text[j])
                    j += 1
            if ch == '"':
                between = text[last_end:i] if last_end >= 0 else 'x'
                if cur is not None and between.strip() == '':
                    cur += ''.join(buf)
                else:
                    if cur is not None:
                        out.append((cur_line, cur))
                    cur, cur_line = ''.join(buf), line
                last_end = j + 1
            i = j + 1
        else:
            i += 1
    if cur is not None:
        out.append((cur_line, cur))
    return out


def bad_mentions(pattern, known, status, chunks):
    """(line, name) of each section.key in chunks that is neither a key
    nor a status field."""
    bad = []
    for line, text in chunks:
        for m in pattern.finditer(text):
            name = f'{m.group(1)}.{m.group(2)}'
            if name in known or m.group(2) in status or m.group(2) in NOT_KEYS:
                continue
            bad.append((line + text.count('\n', 0, m.start()), name))
    return bad


def files(root):
    for d in C_DIRS:
        for dirpath, _, names in os.walk(os.path.join(root, d)):
            for f in sorted(names):
                if f.endswith(C_EXT):
                    yield os.path.join(dirpath, f), 'c'
    for d, ext in (('docs', '.md'), (os.path.join('conf', 'examples'), '.ini')):
        p = os.path.join(root, d)
        for f in sorted(os.listdir(p)):
            if f.endswith(ext):
                yield os.path.join(p, f), 'text'
    yield os.path.join(root, 'README.md'), 'text'


def self_test(pattern, known, status):
    """The scanner finds what it must and nothing else."""
    src = ('ds_warn("x", "receive error%s", e ? " (peers must share transport.chunk_kb)" : "");\n'
           '/* a comment naming train.nope is not a message */\n'
           'snprintf(p, n, "%s/model.bin and status.json", d);\n'
           'f("node/gossip/gossip.c"); f("see gossip." "segmentz here");\n'
           "c = '\"'; f(\"cluster.key and train.lr, gossip.timeouts counted\");\n")
    got = [n for _, n in bad_mentions(pattern, known, status, c_literals(src))]
    want = ['transport.chunk_kb', 'gossip.segmentz']
    if got != want:
        sys.exit(f'conf_keys: self-test: found {got}, expected {want}')


def main():
    args = [a for a in sys.argv[1:] if a != '--self-test']
    root = args[0] if args else os.path.join(os.path.dirname(os.path.abspath(__file__)), '..')
    sections, known = read_keys(root)
    pattern = mention_re(sections)
    status = read_status_fields(root)
    self_test(pattern, known, status)
    if '--self-test' in sys.argv[1:]:
        print('conf_keys: self-test passed')
        return 0
    failures, n_files = [], 0
    for path, kind in files(root):
        text = open(path, encoding='utf-8', errors='replace').read()
        chunks = c_literals(text) if kind == 'c' else [(1, text)]
        n_files += 1
        for line, name in bad_mentions(pattern, known, status, chunks):
            rel = os.path.relpath(path, root)
            failures.append(f'{rel}:{line}: names config key {name}, which conf/keys.h does '
                            f'not list')
    for f in failures:
        print(f)
    print(f'conf_keys: {n_files} files scanned, {len(known)} keys known, '
          f'{len(failures)} unknown keys named')
    return 1 if failures else 0


if __name__ == '__main__':
    sys.exit(main())
