"""Runs a command under a Kubernetes/OCI seccomp profile (JSON), as a container runtime would.

  seccomp_run.py PROFILE.json -- COMMAND [ARGS...]

Loads the profile's default action, its SCMP_ACT_ALLOW rules (with their argument
conditions, EQ and MASKED_EQ) and SCMP_ACT_ERRNO rules with libseccomp (python3-seccomp;
names unknown on this architecture are skipped, as runtimes do), then
execs COMMAND. tests/deploy/check.sh uses it to run ember under deploy/seccomp/ember.json.
"""

import json
import os
import sys

import seccomp


def main():
    if len(sys.argv) < 4 or sys.argv[2] != "--":
        sys.exit(__doc__)
    profile = json.load(open(sys.argv[1]))
    if profile["defaultAction"] != "SCMP_ACT_ERRNO":
        sys.exit(f"unexpected defaultAction {profile['defaultAction']}")
    f = seccomp.SyscallFilter(defaction=seccomp.ERRNO(profile.get("defaultErrnoRet", 1)))
    ops = {"SCMP_CMP_EQ": seccomp.EQ, "SCMP_CMP_MASKED_EQ": seccomp.MASKED_EQ}
    for rule in profile["syscalls"]:
        if rule["action"] == "SCMP_ACT_ALLOW":
            action = seccomp.ALLOW
        elif rule["action"] == "SCMP_ACT_ERRNO" and "errnoRet" in rule:
            action = seccomp.ERRNO(rule["errnoRet"])
        else:
            sys.exit(f"unsupported rule {rule}")
        # OCI: for MASKED_EQ, value is the mask and valueTwo the value compared (as
        # runc passes them to libseccomp); the rule's args are all required (AND).
        args = []
        for a in rule.get("args", []):
            if a["op"] not in ops:
                sys.exit(f"unsupported op in {rule}")
            args.append(seccomp.Arg(a["index"], ops[a["op"]], a["value"], a.get("valueTwo", 0)))
        for name in rule["names"]:
            try:
                f.add_rule(action, name, *args)
            except (RuntimeError, ValueError):
                pass  # not a syscall on this architecture
    f.load()
    os.execvp(sys.argv[3], sys.argv[3:])


main()
