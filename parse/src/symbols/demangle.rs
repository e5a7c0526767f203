//! Demangling within a byte cap: symbol names come from hostile files, and a C++ name of a
//! few hundred bytes whose template arguments refer back to earlier ones (each level
//! `B<prev, prev>`) doubles its demangled length per level without ever nesting deeper than
//! the demangler's recursion limit: 350 bytes demangle to tens of gigabytes, at one core's
//! full speed for as long as it takes.
//!
//! So the demangled text goes into a writer that fails past [`MAX_DEMANGLED`] bytes: the
//! demanglers (cpp_demangle, rustc-demangle) pass a writer's error straight up, so the walk
//! stops at the first write past the cap, and the name is shown as stored. Pure, so the fuzz
//! target runs it on any bytes.

use std::fmt::{self, Write};

/// Longest name demangled, in bytes; longer ones are shown as stored.
pub const MAX_DEMANGLE: usize = 4096;

/// Longest demangled text kept, in bytes; a name whose demangled form is longer is shown as
/// stored.
pub const MAX_DEMANGLED: usize = 4096;

/// What became of a name.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Outcome {
    /// Demangled (Rust or C++).
    Demangled,
    /// Not a mangled name, or one the demanglers refuse (or over [`MAX_DEMANGLE`]): as stored.
    AsStored,
    /// Its demangled form passed [`MAX_DEMANGLED`]: as stored.
    TooLong,
    /// A demangler panicked (caught): as stored.
    Panicked,
}

/// A `fmt::Write` into a string that fails, keeping what it has, once `cap` bytes would be
/// passed.
struct Capped {
    out: String,
    cap: usize,
    over: bool,
}

impl Write for Capped {
    fn write_str(&mut self, s: &str) -> fmt::Result {
        if self.over || self.out.len() + s.len() > self.cap {
            self.over = true;
            return Err(fmt::Error);
        }
        self.out.push_str(s);
        Ok(())
    }
}

/// A symbol name as people read it: Rust (`{:#}`, no hash) and C++ demangled, at most
/// [`MAX_DEMANGLED`] bytes; anything else (or anything over the caps) as stored, invalid
/// UTF-8 replaced.
pub fn demangle(raw: &[u8]) -> (String, Outcome) {
    let stored = || String::from_utf8_lossy(raw).into_owned();
    if raw.len() > MAX_DEMANGLE {
        return (stored(), Outcome::AsStored);
    }
    // A demangler bug costs the demangling only.
    let pretty = std::panic::catch_unwind(|| {
        let mut w = Capped {
            out: String::new(),
            cap: MAX_DEMANGLED,
            over: false,
        };
        let text = String::from_utf8_lossy(raw);
        if let Ok(d) = rustc_demangle::try_demangle(&text) {
            let ok = write!(w, "{d:#}").is_ok();
            return (ok.then_some(w.out), w.over);
        }
        let options = cpp_demangle::ParseOptions::default().recursion_limit(256);
        let Ok(sym) = cpp_demangle::Symbol::new_with_options(raw, &options) else {
            return (None, false);
        };
        let options = cpp_demangle::DemangleOptions::default().recursion_limit(256);
        let ok = sym.structured_demangle(&mut w, &options).is_ok();
        (ok.then_some(w.out), w.over)
    });
    match pretty {
        Ok((Some(p), _)) => (p, Outcome::Demangled),
        Ok((None, true)) => (stored(), Outcome::TooLong),
        Ok((None, false)) => (stored(), Outcome::AsStored),
        Err(_) => (stored(), Outcome::Panicked),
    }
}

/// A C++ name of `levels` template arguments, each `B<previous, previous>`: `levels` bytes
/// times about 11, demangling to about 2^`levels` times 30 bytes. For tests and fuzz seeds.
pub fn nesting_name(levels: usize) -> String {
    // Substitutions: S_ = f (the template's name), S0_ = A, S1_ = B, S2_ = B<A, A>, then
    // one per level.
    let seq = |i: usize| -> String {
        if i == 0 {
            return "S_".into();
        }
        let (mut n, mut digits) = (i - 1, Vec::new());
        loop {
            let d = (n % 36) as u8;
            digits.push(if d < 10 { b'0' + d } else { b'A' + d - 10 });
            n /= 36;
            if n == 0 {
                break;
            }
        }
        digits.reverse();
        format!("S{}_", String::from_utf8_lossy(&digits))
    };
    let mut name = String::from("_Z1fI1A1BIS0_S0_E");
    for level in 0..levels {
        let prev = seq(3 + level);
        name.push_str(&format!("{}I{prev}{prev}E", seq(2)));
    }
    name.push_str("Evv");
    name
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::time::{Duration, Instant};

    #[test]
    fn demangles_rust_and_cpp_names() {
        let (n, o) = demangle(b"_ZNK5space3fooEv");
        assert_eq!((n.as_str(), o), ("space::foo() const", Outcome::Demangled));
        let (n, o) = demangle(b"_ZN3std2rt10lang_start17h0123456789abcdefE");
        assert_eq!((n.as_str(), o), ("std::rt::lang_start", Outcome::Demangled));
        let (n, o) = demangle(b"_Z3bari");
        assert_eq!((n.as_str(), o), ("bar(int)", Outcome::Demangled));
        assert_eq!(
            demangle(b"main"),
            ("main".to_owned(), Outcome::AsStored),
            "not mangled"
        );
        let (n, o) = demangle(b"caf\xe9");
        assert_eq!((n.as_str(), o), ("caf\u{fffd}", Outcome::AsStored));
        // A few levels demangle in full.
        let (n, o) = demangle(nesting_name(2).as_bytes());
        assert_eq!(o, Outcome::Demangled);
        assert_eq!(
            n,
            "void f<A, B<A, A>, B<B<A, A>, B<A, A> >, \
             B<B<B<A, A>, B<A, A> >, B<B<A, A>, B<A, A> > > >()"
        );
    }

    /// A 394-byte name that demangles to 2^34 times 30 bytes (500 GB): on the old
    /// unbounded demangler it grew by tens of MB a second and never returned. Run on a
    /// thread with a deadline far past what it takes (about 0.1 ms here), so a regression
    /// fails the test instead of hanging it; the time is printed, not asserted.
    #[test]
    fn a_nesting_name_stops_at_the_cap_and_is_shown_as_stored() {
        let name = nesting_name(34);
        assert!(name.len() < 400, "{}", name.len());
        let (tx, rx) = std::sync::mpsc::channel();
        let input = name.clone();
        std::thread::spawn(move || {
            let started = Instant::now();
            let out = demangle(input.as_bytes());
            let _ = tx.send((out, started.elapsed()));
        });
        let ((out, outcome), took) = rx
            .recv_timeout(Duration::from_secs(60))
            .expect("demangling did not return within 60 s");
        println!("{}-byte name: {outcome:?} in {took:?}", name.len());
        assert_eq!(outcome, Outcome::TooLong);
        assert_eq!(out, name, "shown as stored");
        assert!(out.len() <= MAX_DEMANGLED);
    }

    #[test]
    fn long_and_odd_names_are_shown_as_stored() {
        let long = format!("_Z{}", "a".repeat(MAX_DEMANGLE));
        assert_eq!(demangle(long.as_bytes()), (long.clone(), Outcome::AsStored));
        // Rust names through the same cap: a long legacy path demangles up to it.
        let mut rust = String::from("_ZN");
        for _ in 0..200 {
            rust.push_str("9abcdefghi");
        }
        rust.push_str("17h0123456789abcdefE");
        let (n, o) = demangle(rust.as_bytes());
        assert_eq!(o, Outcome::Demangled);
        assert_eq!(n.len(), 200 * 9 + 199 * 2);
        let mut longer = String::from("_ZN");
        for _ in 0..400 {
            longer.push_str("9abcdefghi");
        }
        longer.push('E');
        assert!(longer.len() <= MAX_DEMANGLE);
        let (n, o) = demangle(longer.as_bytes());
        assert_eq!(
            (n, o),
            (longer.clone(), Outcome::TooLong),
            "4,399 bytes demangled"
        );
    }
}
