"""Tests of check-module-cycles.py (run by `make lint`).

The fixtures in testdata/module-cycles/ are small Cargo workspaces that build and
pass their own tests with cargo; each case says whether the check must pass.
"""

import importlib.util
import io
import os
import sys
import tempfile
import unittest

HERE = os.path.dirname(os.path.abspath(__file__))
FIXTURES = os.path.join(HERE, "testdata", "module-cycles")

_spec = importlib.util.spec_from_file_location(
    "check_module_cycles", os.path.join(HERE, "check-module-cycles.py")
)
cmc = importlib.util.module_from_spec(_spec)
sys.modules["check_module_cycles"] = cmc
_spec.loader.exec_module(cmc)


def run(case: str) -> tuple[int, str]:
    out = io.StringIO()
    status = cmc.check(os.path.join(FIXTURES, case), out=out)
    return status, out.getvalue()


def paths(src: str, module: tuple[str, ...] = ()) -> list[str]:
    return [str(r) for r in cmc.parse_file(src, module).refs]


class Fixtures(unittest.TestCase):
    def test_inline_path_cycle_fails(self):
        status, out = run("inline-cycle")
        self.assertEqual(status, 1, out)
        self.assertIn(
            "cycle in app (app/src/lib.rs): app/src/a.rs -> app/src/b.rs -> app/src/a.rs\n", out
        )
        self.assertIn("    app/src/a.rs:4: crate::b::g\n", out)
        self.assertIn("    app/src/b.rs:8: crate::a::f\n", out)
        self.assertIn("1 import cycle(s)", out)

    def test_brace_use_cycle_via_super_fails(self):
        status, out = run("use-super-cycle")
        self.assertEqual(status, 1, out)
        self.assertIn(
            "cycle in net (crates/net/src/lib.rs): crates/net/src/proto/codec.rs"
            " -> crates/net/src/proto/wire.rs -> crates/net/src/proto/codec.rs\n",
            out,
        )
        self.assertIn("    crates/net/src/proto/codec.rs:5: super::wire\n", out)
        self.assertIn("    crates/net/src/proto/wire.rs:3: super::codec::encode\n", out)
        # frame.rs is used by both but uses nobody; mod.rs's `pub use self::frame`
        # is the parent-facade direction.
        self.assertEqual(out.count("cycle in"), 1, out)

    def test_cycle_only_in_test_code_passes(self):
        status, out = run("test-only-cycle")
        self.assertEqual(status, 0, out)
        crate = cmc.load_crate(os.path.join(FIXTURES, "test-only-cycle/app/src/lib.rs"))
        self.assertNotIn(("testutil",), crate.modules)
        self.assertNotIn(("b", "tests"), crate.modules)
        b = os.path.join(FIXTURES, "test-only-cycle/app/src/b.rs")
        self.assertEqual([str(r) for r in crate.refs[b]], [])

    def test_paths_in_comments_and_literals_pass(self):
        status, out = run("literals")
        self.assertEqual(status, 0, out)
        crate = cmc.load_crate(os.path.join(FIXTURES, "literals/app/src/lib.rs"))
        b = os.path.join(FIXTURES, "literals/app/src/b.rs")
        self.assertEqual([str(r) for r in crate.refs[b]], [])

    def test_acyclic_workspace_passes(self):
        status, out = run("acyclic")
        self.assertEqual(status, 0, out)
        # core: lib, bin cli/main.rs, tests/integration/main.rs, benches/speed.rs;
        # tools/gen: main.rs. tools/ignored is excluded (it has a cycle).
        self.assertEqual(out, "no import cycles: 5 crate roots, 16 files\n")

    def test_missing_module_file_is_an_error(self):
        with tempfile.TemporaryDirectory() as d:
            os.makedirs(os.path.join(d, "src"))
            with open(os.path.join(d, "Cargo.toml"), "w") as f:
                f.write('[package]\nname = "x"\nversion = "0.1.0"\n')
            with open(os.path.join(d, "src", "lib.rs"), "w") as f:
                f.write("mod gone;\n")
            err = io.StringIO()
            stderr, sys.stderr = sys.stderr, err
            try:
                status = cmc.check(d, out=io.StringIO())
            finally:
                sys.stderr = stderr
        self.assertEqual(status, 2)
        self.assertIn("mod gone: neither of", err.getvalue())


class Lexer(unittest.TestCase):
    def test_comments_and_literals_are_dropped_and_lines_kept(self):
        src = 'a /* x\n/* y */ crate::b */ b // crate::c\n"s\n{" r#"\n"#\'{\' c\n\'a d'
        toks = cmc.tokenize(src)
        idents = [(t.text, t.line) for t in toks if t.kind == "ident"]
        self.assertEqual(idents, [("a", 1), ("b", 2), ("c", 5), ("d", 6)])
        self.assertFalse([t for t in toks if t.text in ("{", "}")])

    def test_raw_identifier_and_dollar_crate(self):
        self.assertEqual(
            paths("fn f() { r#crate::x(); $crate::m::y() }"), ["crate::x", "crate::m::y"]
        )


class Paths(unittest.TestCase):
    def test_use_trees_expand_to_every_leaf(self):
        self.assertEqual(
            paths("use crate::{a::b, c::{d, e as f}};\npub use super::{self as s, g::*};"),
            ["crate::a::b", "crate::c::d", "crate::c::e", "super", "super::g::*"],
        )

    def test_inline_paths_in_expressions_types_patterns_and_attributes(self):
        src = """
            #[crate::attr::mark]
            fn f(x: crate::t::T) -> Vec<self::U> {
                match x { crate::t::T::A => super::g(), _ => Vec::<super::h::H>::new() }
            }
        """
        self.assertEqual(
            paths(src, ("m",)),
            [
                "crate::attr::mark",
                "crate::t::T",
                "self::U",
                "crate::t::T::A",
                "super::g",
                "super::h::H",
            ],
        )

    def test_visibility_is_not_a_dependency(self):
        self.assertEqual(paths("pub(in crate::a) fn f() {} pub(crate) fn g() {}"), [])

    def test_cfg_test_items_are_skipped_others_count(self):
        src = """
            #[cfg(test)] use crate::a;
            #[cfg(all(test, feature = "x"))] fn t() { crate::b::f() }
            #[cfg(not(test))] fn n() { crate::c::f() }
            #[cfg(any(test, unix))] fn u() { crate::d::f() }
            #[cfg(test)]
            #[allow(dead_code)]
            pub(crate) mod tests { use crate::e; }
            #[cfg(test)] const S: [u8; 2] = [1, 2];
            fn after() { crate::f::g() }
        """
        self.assertEqual(paths(src), ["crate::c::f", "crate::d::f", "crate::f::g"])

    def test_inner_attributes_apply_to_their_module_not_the_next_item(self):
        src = "mod inner {\n    #![allow(dead_code)]\n    use crate::a;\n}"
        self.assertEqual(paths(src), ["crate::a"])
        src = "mod t { #![cfg(test)] use crate::a; fn f() { crate::b::g() } }\nuse crate::c;"
        self.assertEqual(paths(src), ["crate::c"])

    def test_whole_file_under_cfg_test(self):
        parsed = cmc.parse_file("#![allow(x)]\n#![cfg(test)]\nuse crate::a;\n")
        self.assertTrue(parsed.test_only)
        self.assertEqual(parsed.refs, [])

    def test_inline_modules_give_paths_their_module(self):
        src = "mod x { mod y { use super::z; } fn f() { self::g() } }\nuse self::h;"
        parsed = cmc.parse_file(src, ("m",))
        self.assertEqual(
            [(r.module, str(r)) for r in parsed.refs],
            [(("m", "x", "y"), "super::z"), (("m", "x"), "self::g"), (("m",), "self::h")],
        )


class Resolution(unittest.TestCase):
    def setUp(self):
        crate = cmc.Crate("lib.rs")
        for module, file in [
            ((), "lib.rs"),
            (("ads",), "ads/mod.rs"),
            (("ads", "resource"), "ads/resource.rs"),
            (("ads", "sotw"), "ads/sotw.rs"),
        ]:
            crate.modules[module] = cmc.Module(file, module)
        self.crate = crate

    def target(self, path: str, module=("ads", "sotw")) -> str:
        ref = cmc.PathRef(module, tuple(path.split("::")), 1)
        return self.crate.modules[cmc.resolve(self.crate, ref)].file

    def test_deepest_module_file(self):
        self.assertEqual(self.target("super::resource::Resource"), "ads/resource.rs")
        self.assertEqual(self.target("super::to_envoy_any"), "ads/mod.rs")
        self.assertEqual(self.target("crate::ads::resource::Resource::new"), "ads/resource.rs")
        self.assertEqual(self.target("super::super::ads::sotw::f"), "ads/sotw.rs")
        self.assertEqual(self.target("crate::metrics::X"), "lib.rs")
        self.assertEqual(self.target("self::Machine"), "ads/sotw.rs")

    def test_above_the_root_is_ignored(self):
        ref = cmc.PathRef((), ("super", "x"), 1)
        self.assertIsNone(cmc.resolve(self.crate, ref))


class Cycles(unittest.TestCase):
    def test_every_elementary_cycle_once(self):
        succ = {"a": ["b", "c"], "b": ["a", "c"], "c": ["a"]}
        comps = [c for c in cmc.strongly_connected(["a", "b", "c"], succ) if len(c) > 1]
        self.assertEqual(comps, [["a", "b", "c"]])
        cycles, complete = cmc.elementary_cycles(comps[0], succ)
        self.assertTrue(complete)
        self.assertEqual(sorted(cycles), [["a", "b", "a"], ["a", "b", "c", "a"], ["a", "c", "a"]])


if __name__ == "__main__":
    unittest.main()
