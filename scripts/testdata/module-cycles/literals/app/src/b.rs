//! Names [`crate::a::f`] only in comments, strings, raw strings, byte strings and
//! chars. A lexer that let them through would see a cycle: the `}` literals below
//! would close the test module early and `crate::a::f()` in it would count.

// crate::a::f()
/* crate::a::f() /* nested: crate::a::f() */ still a comment: crate::a::f() */

/// Returns text that looks like code: `crate::a::f()`.
pub fn g() -> &'static str {
    let _brace = '}';
    let _quote = '\'';
    let _bytes = b"crate::a::f() }";
    let _byte = b'}';
    let _raw = r#"crate::a::f() " } "#;
    let _raw_bytes = br##"crate::a::f() "# }"##;
    let _escaped = "\" } crate::a::f() \\";
    "crate::a::f()"
}

pub fn longest<'a>(x: &'a str, y: &'a str) -> &'a str {
    'outer: loop {
        break 'outer if x.len() >= y.len() { x } else { y };
    }
}

#[cfg(test)]
mod tests {
    const CLOSE: &str = "}}";
    const RAW: &str = r"}}";
    const C: char = '}';

    #[test]
    fn calls_a() {
        assert_eq!(CLOSE.len() + RAW.len(), 4);
        assert_eq!(C, '}');
        assert_eq!(crate::a::f(), super::g().len());
    }
}
