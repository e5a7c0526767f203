//! Checks, before anything is loaded, that ember holds the capabilities it needs.

/// A Linux capability ember may need, with its bit number.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Capability {
    /// Name as `capabilities(7)` spells it.
    pub name: &'static str,
    /// Bit in the capability sets.
    pub bit: u32,
}

const CAP_SYS_ADMIN: Capability = Capability {
    name: "CAP_SYS_ADMIN",
    bit: 21,
};
const CAP_PERFMON: Capability = Capability {
    name: "CAP_PERFMON",
    bit: 38,
};
const CAP_BPF: Capability = Capability {
    name: "CAP_BPF",
    bit: 39,
};
const CAP_SYS_PTRACE: Capability = Capability {
    name: "CAP_SYS_PTRACE",
    bit: 19,
};
const CAP_CHECKPOINT_RESTORE: Capability = Capability {
    name: "CAP_CHECKPOINT_RESTORE",
    bit: 40,
};

/// Capabilities required to load and attach the sampler and to read other processes'
/// mappings: CAP_BPF + CAP_PERFMON (or CAP_SYS_ADMIN on their behalf), CAP_SYS_PTRACE
/// for /proc/PID/maps, CAP_CHECKPOINT_RESTORE (or CAP_SYS_ADMIN) for /proc/PID/map_files.
pub fn missing(cap_eff: u64) -> Vec<&'static str> {
    let has = |c: Capability| cap_eff & (1u64 << c.bit) != 0;
    let admin = has(CAP_SYS_ADMIN);
    let mut out = Vec::new();
    for c in [CAP_BPF, CAP_PERFMON, CAP_CHECKPOINT_RESTORE] {
        if !has(c) && !admin {
            out.push(c.name);
        }
    }
    if !has(CAP_SYS_PTRACE) {
        out.push(CAP_SYS_PTRACE.name);
    }
    out
}

/// The effective capability set of this process, from /proc/self/status.
pub fn effective() -> Option<u64> {
    let status = std::fs::read_to_string("/proc/self/status").ok()?;
    u64::from_str_radix(crate::os::procfs::status_field(&status, "CapEff")?, 16).ok()
}

/// Capabilities ember works without, at a cost it should say once: CAP_SYSLOG, without which
/// `/proc/kallsyms` hides kernel addresses (unless `kptr_restrict` allows) and kernel frames
/// stay unnamed.
pub fn degraded(cap_eff: u64) -> Option<&'static str> {
    const CAP_SYSLOG: u32 = 34;
    (cap_eff & (1u64 << CAP_SYSLOG) == 0)
        .then_some("without CAP_SYSLOG, /proc/kallsyms may hide kernel addresses: kernel frames would stay unnamed")
}

/// One sentence for the user when capabilities are missing, or `None` when all are held.
pub fn check() -> Option<String> {
    let missing = missing(effective().unwrap_or(0));
    (!missing.is_empty()).then(|| {
        format!(
            "missing the capabilities {} needed to load the BPF sampler and read process \
             mappings; run ember as root or grant them (see docs/security.md, \"Privileges\").",
            missing.join(", ")
        )
    })
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn root_has_everything() {
        assert!(missing(0x1ff_ffff_ffff).is_empty());
        assert!(degraded(0x1ff_ffff_ffff).is_none());
        assert!(degraded(0).is_some());
    }

    #[test]
    fn nobody_misses_all() {
        assert_eq!(
            missing(0),
            [
                "CAP_BPF",
                "CAP_PERFMON",
                "CAP_CHECKPOINT_RESTORE",
                "CAP_SYS_PTRACE"
            ]
        );
    }

    #[test]
    fn sys_admin_covers_bpf_and_perfmon() {
        let eff = (1 << 21) | (1 << 19);
        assert!(missing(eff).is_empty());
    }

    #[test]
    fn least_privilege_set_is_enough() {
        let eff = (1 << 38) | (1 << 39) | (1 << 19) | (1 << 40);
        assert!(missing(eff).is_empty());
    }
}
