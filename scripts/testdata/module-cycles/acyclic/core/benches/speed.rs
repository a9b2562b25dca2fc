//! A bench root with an inline module.

mod timing {
    pub fn run() -> u32 {
        1
    }
}

fn main() {
    assert_eq!(self::timing::run(), 1);
}
