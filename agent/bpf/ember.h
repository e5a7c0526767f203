/* SPDX-License-Identifier: Apache-2.0 */
/*
 * The contract between ember's BPF programs and its Rust side: one header per job
 * under contract/, each included here.
 *
 * The Rust types are generated from these headers' BTF by libbpf-cargo (the
 * `ember_cfg` rodata and the `*_layout` globals of ember.bpf.c pull them into the
 * skeleton), so nothing here is copied by hand: every constant is an enum, and
 * agent/src/capture/abi.rs checks each struct's layout and each enum's values.
 */
#ifndef EMBER_H
#define EMBER_H

#include "contract/record.h"
#include "contract/unwind.h"
#include "contract/python.h"
#include "contract/offcpu.h"
#include "contract/runqlat.h"

#endif /* EMBER_H */
