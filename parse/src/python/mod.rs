//! CPython's memory, as the agent reads it from a profiled process: which object is an
//! interpreter and of what version ([`detect`]), where its structures keep what the
//! sampler walks and the symbolizer names ([`layout`], [`debug_offsets`]), and the
//! decoders of what it reads there ([`lines`], [`unicode`], [`code`]). Every input is
//! hostile: a process can forge any byte the sampler or the agent reads.

pub mod code;
pub mod cold;
pub mod debug_offsets;
pub mod detect;
pub mod layout;
pub mod lines;
pub mod unicode;

pub use layout::Layout;

/// A CPython version, as `Py_Version` or the object's name gives it.
#[derive(Clone, Copy, Debug, PartialEq, Eq, PartialOrd, Ord, Hash)]
pub struct Version {
    /// 3.
    pub major: u8,
    /// 8 to 14.
    pub minor: u8,
    /// The micro (patch) release; 0 when only the name was known.
    pub micro: u8,
    /// A free-threaded (`t`) build: other object headers, never a GIL build's layout.
    pub free_threaded: bool,
}

impl Version {
    /// The version `Py_Version` (3.11+) encodes: 0xMMmmuu.. (major, minor, micro, level).
    pub fn from_hex(v: u32) -> Version {
        Version {
            major: (v >> 24) as u8,
            minor: (v >> 16) as u8,
            micro: (v >> 8) as u8,
            free_threaded: false,
        }
    }

    /// Whether this is `major.minor`.
    pub fn is(&self, major: u8, minor: u8) -> bool {
        self.major == major && self.minor == minor
    }
}

impl std::fmt::Display for Version {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        write!(f, "{}.{}", self.major, self.minor)?;
        if self.micro != 0 {
            write!(f, ".{}", self.micro)?;
        }
        if self.free_threaded {
            f.write_str("t")?;
        }
        Ok(())
    }
}
