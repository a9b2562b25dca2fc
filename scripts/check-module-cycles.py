#!/usr/bin/env python3
"""Fails when the modules of a crate import each other in a cycle.

A module is a file. For every crate root of every workspace member (src/lib.rs,
src/main.rs, src/bin/*.rs, src/bin/*/main.rs, tests/*.rs, tests/*/main.rs,
benches/*.rs, examples/*.rs, build.rs and any explicit `path` in Cargo.toml), the
module tree is read from `mod x;` declarations (`x.rs` or `x/mod.rs`, or `#[path]`)
and inline `mod x { ... }` blocks. Every `crate::`, `super::` and `self::` path of
every file counts -- `use` trees (braces, nesting, `self`, globs, `pub use`) and
inline paths in expressions, types, patterns and attributes alike -- and is resolved
to the deepest module it names; that module's file is the target. `super::x::Y`
names the file of module `x`, `super::f` the parent's file.

Not counted: a file's paths to itself, and paths from a module to its own
descendants (the parent-facade direction: `pub use self::child::Thing`, whatever the
spelling). Code that exists only under test (an item whose `cfg` is false without
`test`: `#[cfg(test)] mod tests { ... }`, `#[cfg(test)] mod x;`, `#[cfg(test)] use
...`, `#[cfg(all(test, ...))] fn ...`, and a module under `#![cfg(test)]`) is skipped. Comments and string, char and raw string literals are skipped by
the lexer, so braces and `crate::` inside them do not count; intra-doc links are
comments. `pub(in crate::a)` is a visibility, not a dependency.

Every elementary cycle of the file graph is printed as `a.rs -> b.rs -> a.rs`,
followed by each path that makes one of its edges (file:line: path). Exit status: 0
without cycles, 1 with cycles, 2 when the tree cannot be read (a declared module
whose file is missing, a malformed Cargo.toml).

Usage: check-module-cycles.py [WORKSPACE_DIR]   (default: the repository root)
Needs Python 3.11 (tomllib) and nothing else; its tests are test_check_module_cycles.py.
"""

from __future__ import annotations

import glob
import os
import sys
import tomllib
from dataclasses import dataclass, field

# At most this many cycles are printed per strongly connected component; a tangle
# bigger than that is reported with its count and member files instead.
MAX_CYCLES_PER_COMPONENT = 200
SEARCH_STEPS = 1_000_000

ANCHORS = ("crate", "super", "self")

# Keywords that start an item, after attributes, visibility and qualifiers.
ITEM_KEYWORDS = {
    "mod", "fn", "use", "impl", "struct", "enum", "trait", "type", "const",
    "static", "extern", "union", "macro_rules",
}


class TreeError(Exception):
    """The crate's module tree cannot be read (exit status 2)."""


# --------------------------------------------------------------------------- lexer


@dataclass(frozen=True)
class Token:
    kind: str  # "ident", "punct", "str", "lit", "lifetime"
    text: str
    line: int


def _ident_start(c: str) -> bool:
    return c == "_" or c.isalpha()


def _ident_char(c: str) -> bool:
    return c == "_" or c.isalnum()


def tokenize(src: str) -> list[Token]:
    """Rust tokens without comments; literals become single "str"/"lit" tokens.

    Good enough for finding paths: `::` is one token, every other punctuation is
    one character, `$crate` is the identifier `crate`, `r#x` the identifier `x`.
    """
    toks: list[Token] = []
    i, n, line = 0, len(src), 1

    def skip_quoted(j: int, quote: str) -> int:
        """j is just past the opening quote; returns the index past the closing one."""
        nonlocal line
        while j < n:
            c = src[j]
            if c == "\\":
                if j + 1 < n and src[j + 1] == "\n":
                    line += 1
                j += 2
                continue
            if c == "\n":
                line += 1
            if c == quote:
                return j + 1
            j += 1
        return n

    def skip_raw(j: int) -> int | None:
        """j is at the `#`s or `"` after an `r` prefix; index past the literal or None."""
        nonlocal line
        hashes = 0
        while j < n and src[j] == "#":
            hashes += 1
            j += 1
        if j >= n or src[j] != '"':
            return None
        end = src.find('"' + "#" * hashes, j + 1)
        end = n if end < 0 else end + 1 + hashes
        line += src.count("\n", j, end)
        return end

    while i < n:
        c = src[i]
        if c == "\n":
            line += 1
            i += 1
        elif c.isspace():
            i += 1
        elif src.startswith("//", i):
            j = src.find("\n", i)
            i = n if j < 0 else j
        elif src.startswith("/*", i):
            depth, j = 1, i + 2
            while j < n and depth:
                if src.startswith("/*", j):
                    depth, j = depth + 1, j + 2
                elif src.startswith("*/", j):
                    depth, j = depth - 1, j + 2
                else:
                    if src[j] == "\n":
                        line += 1
                    j += 1
            i = j
        elif c == '"':
            start = line
            j = skip_quoted(i + 1, '"')
            toks.append(Token("str", src[i + 1 : j - 1], start))
            i = j
        elif c == "'":
            # A char literal ('a', '\n', '{') or a lifetime/label ('a, 'static).
            if i + 1 < n and src[i + 1] == "\\":
                i = skip_quoted(i + 1, "'")
                toks.append(Token("lit", "'", line))
            elif i + 2 < n and src[i + 2] == "'":
                toks.append(Token("lit", src[i : i + 3], line))
                i += 3
            else:
                j = i + 1
                while j < n and _ident_char(src[j]):
                    j += 1
                toks.append(Token("lifetime", src[i:j], line))
                i = j
        elif _ident_start(c):
            # String/char prefixes: b"", b'', c"", r"", r#""#, br"", cr#""#.
            prefix_end = i
            while prefix_end < n and prefix_end - i < 2 and src[prefix_end] in "bcr":
                prefix_end += 1
            prefix = src[i:prefix_end]
            if prefix in ("r", "br", "cr") and prefix_end < n and src[prefix_end] in '#"':
                start = line
                j = skip_raw(prefix_end)
                if j is not None:
                    toks.append(Token("str", src[prefix_end:j], start))
                    i = j
                    continue
                if prefix == "r" and src[prefix_end] == "#":  # raw identifier r#name
                    j = prefix_end + 1
                    while j < n and _ident_char(src[j]):
                        j += 1
                    toks.append(Token("ident", src[prefix_end + 1 : j], line))
                    i = j
                    continue
            if prefix in ("b", "c") and prefix_end < n and src[prefix_end] == '"':
                start = line
                j = skip_quoted(prefix_end + 1, '"')
                toks.append(Token("str", src[prefix_end + 1 : j - 1], start))
                i = j
                continue
            if prefix == "b" and prefix_end < n and src[prefix_end] == "'":
                i = skip_quoted(prefix_end + 1, "'")
                toks.append(Token("lit", "b'", line))
                continue
            j = i
            while j < n and _ident_char(src[j]):
                j += 1
            toks.append(Token("ident", src[i:j], line))
            i = j
        elif c.isdigit():
            j = i
            # Digits, suffixes, and a fraction (`1.5`, but not the `.` of `1.max(2)`).
            while j < n and (
                _ident_char(src[j]) or (src[j] == "." and j + 1 < n and src[j + 1].isdigit())
            ):
                j += 1
            toks.append(Token("lit", src[i:j], line))
            i = j
        elif c == ":" and src.startswith("::", i):
            toks.append(Token("punct", "::", line))
            i += 2
        elif c == "$" and src.startswith("crate", i + 1) and not (
            i + 6 < n and _ident_char(src[i + 6])
        ):
            toks.append(Token("ident", "crate", line))
            i += 6
        else:
            toks.append(Token("punct", c, line))
            i += 1
    return toks


# --------------------------------------------------------------------------- parser


@dataclass
class PathRef:
    """One crate::/super::/self:: path as written in a file."""

    module: tuple[str, ...]  # the (possibly inline) module the path is written in
    segments: tuple[str, ...]
    line: int
    glob: bool = False  # `use super::*`

    def __str__(self) -> str:
        segs = list(self.segments)
        if len(segs) > 1 and segs[-1] == "self":  # `use super::x::{self}`
            segs.pop()
        return "::".join(segs) + ("::*" if self.glob else "")


@dataclass
class ModDecl:
    """`mod name;` (file) or `mod name { ... }` (inline) found in a file."""

    parent: tuple[str, ...]
    name: str
    inline: bool
    path_attr: str | None
    line: int


@dataclass
class ParsedFile:
    refs: list[PathRef] = field(default_factory=list)
    mods: list[ModDecl] = field(default_factory=list)
    test_only: bool = False  # `#![cfg(test)]` at the top


def eval_cfg(toks: list[Token]) -> bool | None:
    """Three-valued cfg predicate with `test` false and everything else unknown."""
    pos = 0

    def pred() -> bool | None:
        nonlocal pos
        if pos >= len(toks) or toks[pos].kind != "ident":
            return None
        name = toks[pos].text
        pos += 1
        if pos < len(toks) and toks[pos].text == "(" and name in ("all", "any", "not"):
            pos += 1
            args = []
            while pos < len(toks) and toks[pos].text != ")":
                args.append(pred())
                if pos < len(toks) and toks[pos].text == ",":
                    pos += 1
                elif pos < len(toks) and toks[pos].text != ")":
                    pos += 1  # something we do not understand; keep going
            pos += 1
            if name == "not":
                return None if not args or args[0] is None else not args[0]
            if name == "all":
                if any(a is False for a in args):
                    return False
                return True if all(a is True for a in args) else None
            if any(a is True for a in args):
                return True
            return False if all(a is False for a in args) else None
        if pos < len(toks) and toks[pos].text == "=":
            pos += 2  # key = "value"
            return None
        return False if name == "test" else None

    return pred()


def attr_is_test_only(attr: list[Token]) -> bool:
    """True for `cfg(...)` attributes that are false when not compiling tests."""
    if len(attr) >= 3 and attr[0].text == "cfg" and attr[1].text == "(":
        return eval_cfg(attr[2:-1]) is False
    return False


def attr_path(attr: list[Token]) -> str | None:
    if len(attr) == 3 and attr[0].text == "path" and attr[1].text == "=" and attr[2].kind == "str":
        return attr[2].text
    return None


CLOSE = {"(": ")", "[": "]", "{": "}"}


def parse_file(src: str, module: tuple[str, ...] = ()) -> ParsedFile:
    """The module declarations and crate/super/self paths of the file of `module`."""
    toks = tokenize(src)
    out = ParsedFile()
    n = len(toks)

    def text(k: int) -> str:
        return toks[k].text if k < n else ""

    def match_close(k: int) -> int:
        """k is at an opening bracket; index of the matching closing one (or n)."""
        stack = []
        while k < n:
            t = toks[k]
            if t.kind == "punct" and t.text in CLOSE:
                stack.append(CLOSE[t.text])
            elif t.kind == "punct" and stack and t.text == stack[-1]:
                stack.pop()
                if not stack:
                    return k
            k += 1
        return n

    def item_keyword(k: int) -> int | None:
        """If an item starts at k (after attributes), the index of its keyword."""
        while k < n and toks[k].kind == "ident":
            word, after = toks[k].text, text(k + 1)
            if word == "pub":
                k = match_close(k + 1) + 1 if after == "(" else k + 1
            elif word == "extern" and k + 1 < n and toks[k + 1].kind == "str":
                k += 2  # extern "C" fn / extern "C" { ... }
            elif word == "const" and after in ("fn", "unsafe", "async", "extern"):
                k += 1
            elif word in ("unsafe", "async", "default", "auto"):
                if after in ("{", "move", "|"):
                    return None  # a block or closure, not an item
                k += 1
            elif word == "const" and after == "{":
                return None
            elif word in ITEM_KEYWORDS:
                return k
            else:
                return None
        return None

    def item_end(k: int) -> int:
        """k at an item's keyword; index just past the item."""
        depth = 0
        while k < n:
            t = toks[k]
            if t.kind == "punct":
                if t.text in CLOSE:
                    depth += 1
                elif t.text in (")", "]", "}"):
                    depth -= 1
                    if depth <= 0 and t.text == "}":
                        return k + 1
                elif t.text == ";" and depth == 0:
                    return k + 1
            k += 1
        return n

    def parse_path(k: int) -> tuple[list[str], int]:
        """Identifiers joined by `::` from k; stops before `::<`, `::{`, `::*`."""
        segs = [toks[k].text]
        k += 1
        while k + 1 < n and toks[k].text == "::" and toks[k + 1].kind == "ident":
            segs.append(toks[k + 1].text)
            k += 2
        return segs, k

    def parse_use_tree(k: int, prefix: list[str], module: tuple[str, ...]) -> int:
        """Records every leaf path of the use tree at k; returns the index after it."""
        segs = list(prefix)
        last_line = toks[k].line if k < n else 0
        glob = False
        while k < n:
            t = toks[k]
            if t.kind == "ident" and t.text != "as":
                segs.append(t.text)
                last_line = t.line
                k += 1
                if text(k) == "::":
                    k += 1
                    continue
                break
            if t.text == "::" and not segs:  # `use ::std::x`
                k += 1
                continue
            if t.text == "{":
                close = match_close(k)
                k += 1
                while k < close:
                    k = parse_use_tree(k, segs, module)
                    if text(k) == ",":
                        k += 1
                    elif k < close:
                        k += 1  # unexpected token; do not loop forever
                k = close + 1
                segs = []  # the leaves were recorded by the subtrees
                break
            if t.text == "*":
                last_line = t.line
                glob = True
                k += 1
                break
            break
        if text(k) == "as":
            k += 2
        if segs and segs[0] in ANCHORS:
            out.refs.append(PathRef(module, tuple(segs), last_line, glob))
        return k

    # Stack of (module path, brace depth at which its inline block closes).
    stack: list[tuple[tuple[str, ...], int]] = [(module, -1)]
    depth = 0
    k = 0

    # `#![cfg(test)]` (after any other inner attributes) makes the whole file test code.
    j = 0
    while j + 2 < n and text(j) == "#" and text(j + 1) == "!" and text(j + 2) == "[":
        close = match_close(j + 2)
        if attr_is_test_only(toks[j + 3 : close]):
            out.test_only = True
            return out
        j = close + 1

    def handle_mod(kw: int, attrs: list[list[Token]]) -> int:
        nonlocal depth
        name_tok = toks[kw + 1] if kw + 1 < n else None
        if name_tok is None or name_tok.kind != "ident":
            return kw + 1
        module = stack[-1][0]
        after = text(kw + 2)
        path_attr = None
        for a in attrs:
            path_attr = attr_path(a) or path_attr
        if after == ";":
            out.mods.append(ModDecl(module, name_tok.text, False, path_attr, name_tok.line))
            return kw + 3
        if after == "{":
            out.mods.append(ModDecl(module, name_tok.text, True, path_attr, name_tok.line))
            depth += 1
            stack.append((module + (name_tok.text,), depth - 1))
            return kw + 3
        return kw + 1

    def attribute_at(k: int) -> int | None:
        """Index of the `[` if an outer (`#[`) or inner (`#![`) attribute starts at k."""
        if text(k) != "#":
            return None
        if text(k + 1) == "[":
            return k + 1
        if text(k + 1) == "!" and text(k + 2) == "[":
            return k + 2
        return None

    while k < n:
        t = toks[k]
        if attribute_at(k) is not None:
            # A run of attributes, then the thing the outer ones apply to (inner ones
            # apply to the enclosing module; only their paths count).
            attrs = []
            module_is_test = False
            while (open_ := attribute_at(k)) is not None:
                close = match_close(open_)
                attr = toks[open_ + 1 : close]
                if open_ == k + 1:
                    attrs.append(attr)
                elif attr_is_test_only(attr):
                    module_is_test = True
                scan_inline(attr, stack[-1][0], out)
                k = close + 1
            if module_is_test and len(stack) > 1:
                # `mod x { #![cfg(test)] ... }`: skip to the block's closing brace.
                level = 0
                while k < n and not (text(k) == "}" and level == 0):
                    level += {"{": 1, "}": -1}.get(text(k), 0)
                    k += 1
                continue
            kw = item_keyword(k)
            if kw is not None and any(attr_is_test_only(a) for a in attrs):
                k = item_end(kw)
                continue
            if kw is not None and toks[kw].text == "mod":
                k = handle_mod(kw, attrs)
            continue
        if t.kind == "ident" and t.text == "mod":
            k = handle_mod(k, [])
            continue
        if t.kind == "ident" and t.text == "use":
            k = parse_use_tree(k + 1, [], stack[-1][0])
            continue
        if t.kind == "ident" and t.text == "pub" and text(k + 1) == "(" and text(k + 2) == "in":
            k = match_close(k + 1) + 1  # pub(in crate::a): a visibility, not a use
            continue
        if (
            t.kind == "ident"
            and t.text in ANCHORS
            and text(k + 1) == "::"
            and (k == 0 or text(k - 1) != "::")
        ):
            segs, k = parse_path(k)
            out.refs.append(PathRef(stack[-1][0], tuple(segs), t.line))
            continue
        if t.kind == "punct" and t.text == "{":
            depth += 1
        elif t.kind == "punct" and t.text == "}":
            depth -= 1
            if len(stack) > 1 and depth == stack[-1][1]:
                stack.pop()
        k += 1
    return out


def scan_inline(toks: list[Token], module: tuple[str, ...], out: ParsedFile) -> None:
    """Paths inside an attribute (`#[serde(default = ...)]` strings do not count)."""
    n = len(toks)
    k = 0
    while k < n:
        t = toks[k]
        if t.kind == "ident" and t.text in ANCHORS and k + 1 < n and toks[k + 1].text == "::" and (
            k == 0 or toks[k - 1].text != "::"
        ):
            segs = [t.text]
            k += 1
            while k + 1 < n and toks[k].text == "::" and toks[k + 1].kind == "ident":
                segs.append(toks[k + 1].text)
                k += 2
            out.refs.append(PathRef(module, tuple(segs), t.line))
            continue
        k += 1


# --------------------------------------------------------------------------- crates


@dataclass
class Module:
    file: str  # path of the file holding it (inline modules: their enclosing file)
    file_module: tuple[str, ...]  # the module that owns `file`


@dataclass
class Crate:
    root: str
    modules: dict[tuple[str, ...], Module] = field(default_factory=dict)
    refs: dict[str, list[PathRef]] = field(default_factory=dict)  # file -> paths


def is_mod_rs(path: str) -> bool:
    return os.path.basename(path) in ("mod.rs", "lib.rs", "main.rs")


def load_crate(root: str) -> Crate:
    crate = Crate(root)

    def load(file: str, module: tuple[str, ...], children_dir: str) -> None:
        """Parse `file` (the file of `module`); children_dir is where `mod x;` looks."""
        with open(file, encoding="utf-8") as f:
            parsed = parse_file(f.read(), module)
        if parsed.test_only:
            return
        crate.modules[module] = Module(file, module)
        crate.refs[file] = parsed.refs
        inline_dirs = {module: children_dir}
        for decl in parsed.mods:
            path = decl.parent + (decl.name,)
            parent_dir = inline_dirs.get(decl.parent)
            if parent_dir is None:  # inside a skipped (test-only) inline module
                continue
            if decl.inline:
                crate.modules[path] = Module(file, module)
                inline_dirs[path] = os.path.join(parent_dir, decl.path_attr or decl.name)
                continue
            if decl.path_attr is not None:
                base = os.path.dirname(file) if decl.parent == module else parent_dir
                child = os.path.normpath(os.path.join(base, decl.path_attr))
                if not os.path.isfile(child):
                    raise TreeError(
                        f"{file}:{decl.line}: #[path] module {decl.name}: no file {child}"
                    )
                load(child, path, os.path.dirname(child))
                continue
            candidates = [
                os.path.join(parent_dir, decl.name + ".rs"),
                os.path.join(parent_dir, decl.name, "mod.rs"),
            ]
            found = [c for c in candidates if os.path.isfile(c)]
            if len(found) != 1:
                what = "both" if found else "neither"
                raise TreeError(
                    f"{file}:{decl.line}: mod {decl.name}: {what} of {' and '.join(candidates)}"
                )
            child = found[0]
            load(child, path, os.path.dirname(child) if is_mod_rs(child) else child[: -len(".rs")])

    # Declared-but-skipped inline modules never get into `inline_dirs`, so their
    # `mod` children are skipped too; the parser already drops test-only items.
    load(root, (), os.path.dirname(root))
    return crate


def resolve(crate: Crate, ref: PathRef) -> tuple[str, ...] | None:
    """The deepest module a path names, or None if it climbs above the root."""
    anchor, rest = ref.segments[0], list(ref.segments[1:])
    if anchor == "crate":
        cur: tuple[str, ...] = ()
    elif anchor == "self":
        cur = ref.module
    else:
        if not ref.module:
            return None
        cur = ref.module[:-1]
        while rest and rest[0] == "super":
            if not cur:
                return None
            cur = cur[:-1]
            rest.pop(0)
    for seg in rest:
        if seg == "self":
            continue
        if cur + (seg,) not in crate.modules:
            break
        cur = cur + (seg,)
    return cur


@dataclass(frozen=True)
class Edge:
    src: str
    dst: str


def file_graph(crate: Crate) -> dict[Edge, list[tuple[int, str]]]:
    """Edges between files, each with the (line, path) occurrences that make it."""
    edges: dict[Edge, list[tuple[int, str]]] = {}
    for file, refs in crate.refs.items():
        for ref in refs:
            target = resolve(crate, ref)
            if target is None or target not in crate.modules:
                continue
            src = crate.modules.get(ref.module)
            src_module = src.file_module if src is not None else None
            dst = crate.modules[target].file
            if dst == file:
                continue
            if src_module is not None and target[: len(src_module)] == src_module:
                continue  # a module's own descendants
            edges.setdefault(Edge(file, dst), []).append((ref.line, str(ref)))
    return edges


# --------------------------------------------------------------------------- cycles


def strongly_connected(nodes: list[str], succ: dict[str, list[str]]) -> list[list[str]]:
    """Tarjan's algorithm, iterative."""
    index: dict[str, int] = {}
    low: dict[str, int] = {}
    on_stack: set[str] = set()
    stack: list[str] = []
    out: list[list[str]] = []
    counter = 0
    for start in nodes:
        if start in index:
            continue
        work = [(start, 0)]
        while work:
            v, i = work.pop()
            if i == 0:
                index[v] = low[v] = counter
                counter += 1
                stack.append(v)
                on_stack.add(v)
            ws = succ.get(v, [])
            if i < len(ws):
                work.append((v, i + 1))
                w = ws[i]
                if w not in index:
                    work.append((w, 0))
                elif w in on_stack:
                    low[v] = min(low[v], index[w])
                continue
            for w in ws:
                if w in on_stack:
                    low[v] = min(low[v], low[w])
            if low[v] == index[v]:
                comp = []
                while True:
                    w = stack.pop()
                    on_stack.discard(w)
                    comp.append(w)
                    if w == v:
                        break
                out.append(sorted(comp))
    return out


def elementary_cycles(comp: list[str], succ: dict[str, list[str]]) -> tuple[list[list[str]], bool]:
    """Cycles of one component, each starting at its smallest file, and whether all
    were found.

    A depth-first search from each node s that only visits nodes greater than s
    finds each cycle once (from its smallest node). It is exponential in the worst
    case, so it stops after MAX_CYCLES_PER_COMPONENT cycles or SEARCH_STEPS steps.
    """
    members = set(comp)

    def next_nodes(v: str, s: str):
        return iter(sorted(w for w in set(succ.get(v, [])) if w in members and w >= s))

    cycles: list[list[str]] = []
    steps = 0
    for s in comp:
        path = [s]
        on_path = {s}
        iters = [next_nodes(s, s)]
        while iters:
            steps += 1
            if steps > SEARCH_STEPS:
                return cycles, False
            w = next(iters[-1], None)
            if w is None:
                iters.pop()
                on_path.discard(path.pop())
                continue
            if w == s:
                cycles.append(path + [s])
                if len(cycles) >= MAX_CYCLES_PER_COMPONENT:
                    return cycles, False
            elif w not in on_path:
                path.append(w)
                on_path.add(w)
                iters.append(next_nodes(w, s))
    return cycles, True


# --------------------------------------------------------------------------- workspace


def crate_roots(member_dir: str, manifest: dict) -> list[str]:
    roots = []
    explicit = []
    if "lib" in manifest and "path" in manifest["lib"]:
        explicit.append(manifest["lib"]["path"])
    for section in ("bin", "test", "bench", "example"):
        for target in manifest.get(section, []):
            if "path" in target:
                explicit.append(target["path"])
    build = manifest.get("package", {}).get("build")
    if isinstance(build, str):
        explicit.append(build)
    for rel in explicit:
        roots.append(os.path.join(member_dir, rel))
    patterns = [
        "src/lib.rs", "src/main.rs", "src/bin/*.rs", "src/bin/*/main.rs",
        "tests/*.rs", "tests/*/main.rs", "benches/*.rs", "benches/*/main.rs",
        "examples/*.rs", "examples/*/main.rs",
    ]
    if not isinstance(build, (str, bool)):
        patterns.append("build.rs")
    for pattern in patterns:
        roots.extend(sorted(glob.glob(os.path.join(member_dir, pattern))))
    seen, unique = set(), []
    for r in roots:
        r = os.path.normpath(r)
        if r not in seen and os.path.isfile(r):
            seen.add(r)
            unique.append(r)
    return unique


def workspace_members(workspace: str) -> list[tuple[str, dict]]:
    with open(os.path.join(workspace, "Cargo.toml"), "rb") as f:
        root = tomllib.load(f)
    ws = root.get("workspace", {})
    dirs: list[str] = []
    if "package" in root:
        dirs.append(workspace)
    excluded = {os.path.normpath(os.path.join(workspace, e)) for e in ws.get("exclude", [])}
    for pattern in ws.get("members", []):
        for d in sorted(glob.glob(os.path.join(workspace, pattern))):
            d = os.path.normpath(d)
            if d in excluded or d in dirs:
                continue
            if os.path.isfile(os.path.join(d, "Cargo.toml")):
                dirs.append(d)
    if not dirs:
        raise TreeError(f"{workspace}/Cargo.toml: no package and no workspace members")
    members = []
    for d in dirs:
        with open(os.path.join(d, "Cargo.toml"), "rb") as f:
            members.append((d, tomllib.load(f)))
    return members


def check(workspace: str, out=sys.stdout) -> int:
    """Prints the cycles of every crate root of the workspace; returns the exit status."""
    workspace = os.path.normpath(workspace)

    def rel(p: str) -> str:
        return os.path.relpath(p, workspace)

    try:
        members = workspace_members(workspace)
        found = 0
        roots = files = 0
        for member_dir, manifest in members:
            name = manifest.get("package", {}).get("name", rel(member_dir))
            for root in crate_roots(member_dir, manifest):
                crate = load_crate(root)
                roots += 1
                files += len(crate.refs)
                edges = file_graph(crate)
                succ: dict[str, list[str]] = {}
                for e in edges:
                    succ.setdefault(e.src, []).append(e.dst)
                for comp in strongly_connected(sorted(crate.refs), succ):
                    if len(comp) < 2:
                        continue
                    cycles, complete = elementary_cycles(comp, succ)
                    for cycle in cycles:
                        found += 1
                        print(f"cycle in {name} ({rel(root)}): "
                              + " -> ".join(rel(f) for f in cycle), file=out)
                        for a, b in zip(cycle, cycle[1:]):
                            for line, path in sorted(set(edges[Edge(a, b)])):
                                print(f"    {rel(a)}:{line}: {path}", file=out)
                    if not complete:
                        found += 1
                        print(f"    ... and possibly more cycles among {len(comp)} files: "
                              + ", ".join(rel(f) for f in comp), file=out)
    except (TreeError, OSError, tomllib.TOMLDecodeError) as err:
        print(f"check-module-cycles: {err}", file=sys.stderr)
        return 2
    if found:
        print(f"{found} import cycle(s) between modules (a module is a file; see "
              f"scripts/check-module-cycles.py)", file=out)
        return 1
    print(f"no import cycles: {roots} crate roots, {files} files", file=out)
    return 0


def main(argv: list[str]) -> int:
    if len(argv) > 2 or (len(argv) == 2 and argv[1] in ("-h", "--help")):
        print(__doc__)
        return 0 if len(argv) == 2 else 2
    default = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
    return check(argv[1] if len(argv) == 2 else default)


if __name__ == "__main__":
    sys.exit(main(sys.argv))
