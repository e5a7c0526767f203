/* SPDX-License-Identifier: Apache-2.0 */
/*
 * What the agent tells the walker of a Python process, and the tail a record's
 * interpreter frames add.
 */
#ifndef EMBER_CONTRACT_PYTHON_H
#define EMBER_CONTRACT_PYTHON_H

/*
 * Interpreter frames (Python). Where the table walker meets a frame of the
 * interpreter's eval loop (a range of `struct ember_py_proc`), it first records
 * the interpreter frames that eval call runs, innermost first, from the thread's
 * own PyThreadState, then the eval frame itself. An interpreter frame takes two
 * user slots: the code object's address, then (instruction offset in 2-byte code
 * units << 32 | the code's co_firstlineno as a fingerprint). The tail after the
 * ips says which user slots start an interpreter frame and which are eval frames.
 */
enum ember_py_limit {
	EMBER_PY_EVAL_RANGES = 2,    /* ranges of the eval loop's code per process */
	EMBER_PY_NO_FIELD = 0xffff,  /* a field the version does not have (`cframe_current`) */
	EMBER_PY_FRAME_BYTES = 128,  /* bytes of a frame the walker reads at once: every field it reads is inside them */
};

/* How a thread's PyThreadState is found from its thread pointer (tp, %fs base). */
enum ember_py_tls {
	EMBER_PY_TLS_TP = 0,  /* *(tp + tls_offset): a pthread key's slot, or static TLS */
	EMBER_PY_TLS_DTV = 1, /* *(dtv[tls_module] + tls_offset), dtv = *(tp + 8): libpython's TLS block */
	EMBER_PY_TLS_TSD = 2, /* *(*(tp + tls_module) + tls_offset): musl's self->tsd[key] */
};

/* How eval calls and frames pair (see FrameModel in parse/src/python/layout.rs). */
enum ember_py_model {
	EMBER_PY_OBJECTS = 0, /* <= 3.10: one frame per eval call */
	EMBER_PY_ENTRY = 1,   /* 3.11: frames up to the one whose `frame_owner` byte (is_entry) is set */
	EMBER_PY_CSTACK = 2,  /* 3.12+: frames up to an eval call's entry frame (owner >= owner_cstack, not recorded) */
};

/* Value of the `py_procs` hash (key: tgid), written whole by the agent. */
struct ember_py_proc {
	__u64 eval_start[EMBER_PY_EVAL_RANGES]; /* process addresses of the eval loop's code; 0: unused */
	__u64 eval_end[EMBER_PY_EVAL_RANGES];
	__s64 tls_offset;
	__u64 tls_module;
	__u64 code_type;   /* PyCode_Type: a frame whose code object is not of it ends the walk */
	__u8 tls_mode;     /* enum ember_py_tls */
	__u8 model;        /* enum ember_py_model */
	__u8 owner_cstack; /* EMBER_PY_CSTACK: owner values from this one up mark an eval call's entry frame */
	__u8 code_tagged;  /* the frame's code pointer carries tag bits (3.14 _PyStackRef): mask 7 */
	__u16 tstate_frame;   /* PyThreadState: frame, cframe or current_frame */
	__u16 cframe_current; /* _PyCFrame.current_frame, or EMBER_PY_NO_FIELD */
	__u16 frame_code;
	__u16 frame_previous;
	__u16 frame_instr;    /* <= 3.10: the int f_lasti; else the instruction pointer */
	__u16 frame_owner;    /* 3.11 is_entry, 3.12+ owner (one byte) */
	__u16 frame_size;     /* bytes read per frame, <= EMBER_PY_FRAME_BYTES */
	__u16 code_firstlineno;
	__u16 code_adaptive;  /* 3.11+: where the bytecode starts in the code object */
	__u16 object_type;    /* PyObject.ob_type: 8, 24 in free-threaded builds */
	__u16 frame_tlbc;     /* 3.14t: the frame's tlbc_index (an int), or EMBER_PY_NO_FIELD */
	__u16 code_tlbc;      /* 3.14t: the code's co_tlbc, {size, entries[size]} of bytecode copies */
	__u16 pad[2];
};

/* How a sample's interpreter frames came out. */
enum ember_py_result {
	EMBER_PY_NONE = 0,      /* not an interpreter's process, or no eval frame met: no tail */
	EMBER_PY_OK = 1,        /* every eval frame got its frames */
	EMBER_PY_NO_STATE = 2,  /* an eval frame, but the thread's state or frame was not found */
	EMBER_PY_TRUNCATED = 3, /* the stack's frame cap ended the walk */
	EMBER_PY_MISMATCH = 4,  /* an eval frame had no interpreter frame left (one surplus is normal), or a
				 * frame's code was not a code object (a frame being set up): the rest dropped */
	EMBER_PY_READ = 5,      /* a frame could not be read: the rest are missing */
	EMBER_PY_APPENDED = 6,  /* the native walk stopped early (an unwind error) with interpreter frames
				 * left: they follow its last native frame, not interleaved (up to the frame cap) */
	EMBER_PY_RESULT_MAX = 7,
};

/* After the ips of a record whose py_result is not EMBER_PY_NONE. Bit i: user slot i. */
struct ember_py_tail {
	__u64 py_start[2]; /* slot i and i + 1 are an interpreter frame */
	__u64 eval[2];     /* slot i is a frame of the eval loop */
};

#endif /* EMBER_CONTRACT_PYTHON_H */
