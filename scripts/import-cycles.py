#!/usr/bin/env python3
"""File import cycles inside a crate: an edge A -> B when file A names an item of module B
(through `crate::`, `super::` or `self::` paths, `use` groups included; `#[cfg(test)]` code
left out). Prints each cycle (a strongly connected set of files) and exits 1 when any."""
import os, re, sys
from collections import defaultdict

def modules(src):
    files = {}
    for root, _, names in os.walk(src):
        for n in names:
            if not n.endswith('.rs'): continue
            p = os.path.join(root, n)
            rel = os.path.relpath(p, src)[:-3].split(os.sep)
            if rel[-1] in ('mod',): rel = rel[:-1]
            if rel == ['lib'] or rel == ['main']: rel = []
            if rel and rel[0] == 'bin': continue
            files[tuple(rel)] = p
    return files

def strip(text):
    text = re.sub(r'//[^\n]*', '', text)
    # drop #[cfg(test)] mod tests { ... } blocks roughly: from '#[cfg(test)]' to end of file
    i = text.find('#[cfg(test)]')
    return text if i < 0 else text[:i]

def resolve(mods, base, path):
    # longest prefix of path that is a module file
    for k in range(len(path), 0, -1):
        if tuple(path[:k]) in mods: return tuple(path[:k])
    return None

def main(src):
    mods = modules(src)
    edges = defaultdict(set)
    for m, p in mods.items():
        text = strip(open(p).read())
        is_dir_mod = p.endswith('mod.rs') or p.endswith('lib.rs') or p.endswith('main.rs')
        here = list(m) if is_dir_mod else list(m[:-1])  # the directory the file's `self` children live in
        selfmod = list(m)
        # expand use groups crudely: find paths crate::a::b, super::a, self::a
        for mt in re.finditer(r'\b(crate|super|self)((?:::\w+)+)', text):
            head, rest = mt.group(1), [x for x in mt.group(2).split('::') if x]
            if head == 'crate': path = rest
            elif head == 'self': path = selfmod + rest
            else:
                parent = selfmod[:-1]
                while rest and rest[0] == 'super':
                    parent = parent[:-1]; rest = rest[1:]
                path = parent + rest
            t = resolve(mods, m, path)
            if t is not None and t != m and not (len(t) < len(m) and m[:len(t)] == t and t == tuple(path)):
                edges[m].add(t)
            elif t is not None and t != m and len(t) < len(m) and m[:len(t)] == t:
                edges[m].add(t)  # child naming an item of its ancestor
        # `use super::*` / `super::Item` already counted; group uses `use crate::{a, b::c}`
        for mt in re.finditer(r'\buse\s+(crate|super|self)::\{([^;]*)\};', text):
            head = mt.group(1)
            for item in re.split(r',\s*', mt.group(2)):
                item = item.strip().split('::')
                if not item or not item[0] or item[0] == '{': continue
                item = [re.sub(r'\W', '', x) for x in item if re.sub(r'\W', '', x)]
                if head == 'crate': path = item
                elif head == 'self': path = selfmod + item
                else: path = selfmod[:-1] + item
                t = resolve(mods, m, path)
                if t is not None and t != m: edges[m].add(t)
    # Tarjan
    index, low, stack, on, sccs, n = {}, {}, [], set(), [], [0]
    sys.setrecursionlimit(10000)
    def strong(v):
        index[v] = low[v] = n[0]; n[0] += 1; stack.append(v); on.add(v)
        for w in edges[v]:
            if w not in index: strong(w); low[v] = min(low[v], low[w])
            elif w in on: low[v] = min(low[v], index[w])
        if low[v] == index[v]:
            comp = []
            while True:
                w = stack.pop(); on.discard(w); comp.append(w)
                if w == v: break
            if len(comp) > 1: sccs.append(comp)
    for v in list(mods): 
        if v not in index: strong(v)
    bad = 0
    for c in sccs:
        bad += 1
        names = sorted(mods[x] for x in c)
        print(f"cycle: {' '.join(names)}")
        for x in c:
            for y in edges[x]:
                if y in c: print(f"  {mods[x]} -> {mods[y]}")
    return bad

if __name__ == '__main__':
    total = sum(main(s) for s in sys.argv[1:])
    sys.exit(1 if total else 0)
