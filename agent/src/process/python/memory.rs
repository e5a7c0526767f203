//! Reads of another process's memory (`process_vm_readv`): the agent's only way into a
//! Python process's objects. Every read is bounded by its buffer; a page that is not
//! mapped fails the read, which the caller counts. The kernel checks ptrace-read access
//! (CAP_SYS_PTRACE for other users' processes; Yama scope 3 refuses every read).

use std::io;

/// The memory of process `pid` (in the agent's pid namespace).
#[derive(Debug, Clone, Copy)]
pub struct ProcMem {
    pid: u32,
}

impl ProcMem {
    /// The memory of `pid`.
    pub fn new(pid: u32) -> Self {
        Self { pid }
    }

    /// Fills `buf` from `addr`, all of it or an error.
    pub fn read(&self, addr: u64, buf: &mut [u8]) -> io::Result<()> {
        if buf.is_empty() {
            return Ok(());
        }
        let local = libc::iovec {
            iov_base: buf.as_mut_ptr().cast(),
            iov_len: buf.len(),
        };
        let remote = libc::iovec {
            iov_base: addr as usize as *mut libc::c_void,
            iov_len: buf.len(),
        };
        // SAFETY: `local` covers exactly `buf`, which the kernel writes at most
        // `buf.len()` bytes into; `remote` is only an address in the other process.
        let n =
            unsafe { libc::process_vm_readv(self.pid as libc::pid_t, &local, 1, &remote, 1, 0) };
        if n < 0 {
            return Err(io::Error::last_os_error());
        }
        if n as usize != buf.len() {
            return Err(io::Error::new(io::ErrorKind::UnexpectedEof, "short read"));
        }
        Ok(())
    }

    /// The little-endian u64 at `addr`.
    pub fn u64_at(&self, addr: u64) -> io::Result<u64> {
        let mut b = [0u8; 8];
        self.read(addr, &mut b)?;
        Ok(u64::from_le_bytes(b))
    }

    /// The little-endian u32 at `addr`.
    pub fn u32_at(&self, addr: u64) -> io::Result<u32> {
        let mut b = [0u8; 4];
        self.read(addr, &mut b)?;
        Ok(u32::from_le_bytes(b))
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn reads_its_own_memory_and_refuses_unmapped_pages() {
        let value: u64 = 0x1122_3344_5566_7788;
        let mem = ProcMem::new(std::process::id());
        assert_eq!(
            mem.u64_at(&value as *const u64 as u64).expect("read"),
            value
        );
        assert!(mem.u64_at(8).is_err());
    }
}
