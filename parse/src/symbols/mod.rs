//! Symbol tables of ELF objects ([`table::SymTable`]), their names packed in LZ4 blocks
//! ([`packed`]), and the demangling of those names ([`demangle`]).

pub mod demangle;
pub mod packed;
pub mod table;
