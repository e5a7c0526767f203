//! The files JIT runtimes write to name their code: perf maps (`/tmp/perf-PID.map`) and
//! jitdump (`jit-PID.dump`), parsed as they grow, their names interned in one set.

pub mod jitdump;
pub mod names;
pub mod perfmap;
