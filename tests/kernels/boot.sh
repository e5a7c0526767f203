#!/bin/bash
# Boots one kernel of the matrix on the guest initramfs under qemu, the serial console on
# stdout, and returns when the guest powers off (or the hard timeout kills qemu).
#
#   tests/kernels/boot.sh VMLINUZ INITRD [TIMEOUT_SECONDS] [KERNEL_ARGS...]
#
# TCG, never KVM: nested KVM hangs on the machines this runs on, and TCG boots a cloud kernel
# in seconds anyway. -cpu max gives the guest every feature TCG emulates (RDRAND for early
# entropy, the TSC the fixtures time their rounds with). panic=-1 and -no-reboot: a guest
# whose init dies ends qemu at once instead of rebooting into the same failure.
# EMBER_QEMU overrides the qemu binary, EMBER_QEMU_SMP and EMBER_QEMU_MEM its size.
set -euo pipefail

kernel=${1:?usage: boot.sh VMLINUZ INITRD [TIMEOUT_SECONDS] [KERNEL_ARGS...]}
initrd=${2:?usage: boot.sh VMLINUZ INITRD [TIMEOUT_SECONDS] [KERNEL_ARGS...]}
limit=${3:-240}
shift $(($# < 3 ? $# : 3))
qemu=${EMBER_QEMU:-qemu-system-x86_64}

# -k: qemu stuck in a device reset ignores SIGTERM; SIGKILL follows 5 s later.
# One vCPU by default: with two, Debian's 7.2 oopsed on an int3 in the scheduler
# (ttwu_do_activate) as tracepoints were detached, which is text patching racing TCG's
# translated code across vCPUs, not the guest's programs.
exec timeout -k 5 "$limit" "$qemu" -accel tcg -cpu max -smp "${EMBER_QEMU_SMP:-1}" \
	-m "${EMBER_QEMU_MEM:-1536}" -nographic -no-reboot -nic none \
	-kernel "$kernel" -initrd "$initrd" \
	-append "console=ttyS0 panic=-1 quiet random.trust_cpu=on $*" </dev/null
