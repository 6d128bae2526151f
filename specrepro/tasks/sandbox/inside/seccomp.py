"""The sandbox's seccomp filter (x86_64): which system calls the program may not make, as a classic BPF
program, and its installation.

Runs inside the sandbox, in the launcher, after the private root is built and before the harness's
interpreter is executed: the filter binds the harness and the program alike. Pure standard library
(``ctypes`` is passed in by the launcher, which never runs the program).
"""

import os

# EPERM: debugging and reading other processes, kernel modules and keys, namespaces and mounts, BPF, perf,
# io_uring, userfaultfd, file handles, personality, host administration; and every way to hold memory that
# RLIMIT_AS does not count or that outlives the process (memfd, System V shared memory, POSIX message
# queues); and execve (only the launcher's one execveat of the interpreter is let through, see below).
DENIED_SYSCALLS = {
    "ptrace": 101, "process_vm_readv": 310, "process_vm_writev": 311, "kexec_load": 246, "kexec_file_load": 320,
    "init_module": 175, "finit_module": 313, "delete_module": 176, "mount": 165, "umount2": 166,
    "pivot_root": 155, "chroot": 161, "unshare": 272, "setns": 308, "keyctl": 250, "add_key": 248,
    "request_key": 249, "bpf": 321, "userfaultfd": 323, "perf_event_open": 298, "personality": 135,
    "io_uring_setup": 425, "io_uring_enter": 426, "io_uring_register": 427, "open_by_handle_at": 304,
    "name_to_handle_at": 303, "acct": 163, "swapon": 167, "swapoff": 168, "reboot": 169, "sethostname": 170,
    "setdomainname": 171, "quotactl": 179, "lookup_dcookie": 212, "move_mount": 429, "open_tree": 428,
    "fsopen": 430, "fsmount": 432, "fspick": 433, "mount_setattr": 442,
    "memfd_create": 319, "memfd_secret": 447, "shmget": 29, "shmat": 30, "shmctl": 31, "shmdt": 67,
    "mq_open": 240, "mq_unlink": 241, "mq_timedsend": 242, "mq_timedreceive": 243, "mq_notify": 244,
    "mq_getsetattr": 245, "execve": 59,
}
CLONE, CLONE3, EXECVEAT, SOCKET, SOCKETPAIR = 56, 435, 322, 41, 53
NAMESPACE_FLAGS = 0x7E020080  # CLONE_NEW{NS,CGROUP,UTS,IPC,USER,PID,NET,TIME}
AF_UNIX = 1
AUDIT_ARCH_X86_64 = 0xC000003E
X32_BIT = 0x40000000

# classic BPF opcodes and seccomp return values
LD, JEQ, JGE, JSET, RET = 0x20, 0x15, 0x35, 0x45, 0x06
ALLOW, KILL, ERRNO = 0x7FFF0000, 0x80000000, 0x00050000
EPERM, ENOSYS = 1, 38
NR, ARCH, ARG0 = 0, 4, 16  # offsets in struct seccomp_data (ARG0: the low 32 bits of the first argument)


def filter_program(exec_fd):
    """The filter as (code, jt, jf, k) tuples. execveat is allowed only on ``exec_fd``: the launcher opens the
    interpreter there (close-on-exec) and RLIMIT_NOFILE is far below it afterwards, so once the interpreter
    runs no descriptor of that number can exist again and every exec fails. Sockets: AF_UNIX only."""
    code = [(LD, 0, 0, ARCH), (JEQ, 1, 0, AUDIT_ARCH_X86_64), (RET, 0, 0, KILL), (LD, 0, 0, NR),
            (JGE, "deny", 0, X32_BIT)]
    code += [(JEQ, "deny", 0, number) for number in DENIED_SYSCALLS.values()]
    code += [(JEQ, "nosys", 0, CLONE3), (JEQ, "exec", 0, EXECVEAT), (JEQ, "family", 0, SOCKET),
             (JEQ, "family", 0, SOCKETPAIR), (JEQ, 0, "allow", CLONE),
             (LD, 0, 0, ARG0), (JSET, "deny", "allow", NAMESPACE_FLAGS)]
    blocks = {"exec": [(LD, 0, 0, ARG0), (JEQ, "allow", "deny", exec_fd)],
              "family": [(LD, 0, 0, ARG0), (JEQ, "allow", "deny", AF_UNIX)],
              "allow": [(RET, 0, 0, ALLOW)], "deny": [(RET, 0, 0, ERRNO | EPERM)],
              "nosys": [(RET, 0, 0, ERRNO | ENOSYS)]}
    where = {}
    for name, block in blocks.items():
        where[name] = len(code)
        code += block

    def offset(index, jump):
        return where[jump] - index - 1 if isinstance(jump, str) else jump

    return [(op, offset(i, jt), offset(i, jf), k) for i, (op, jt, jf, k) in enumerate(code)]


def install_seccomp(ctypes, lib, exec_fd):
    """Install ``filter_program(exec_fd)`` for this process and all it starts (needs no_new_privs or
    CAP_SYS_ADMIN)."""

    class Filter(ctypes.Structure):
        _fields_ = [("code", ctypes.c_uint16), ("jt", ctypes.c_uint8), ("jf", ctypes.c_uint8),
                    ("k", ctypes.c_uint32)]

    class Program(ctypes.Structure):
        _fields_ = [("len", ctypes.c_ushort), ("filter", ctypes.POINTER(Filter))]

    program = filter_program(exec_fd)
    table = (Filter * len(program))(*[Filter(*instruction) for instruction in program])
    fprog = Program(len(program), table)
    set_seccomp, mode_filter = 22, 2
    if lib.prctl(set_seccomp, mode_filter, ctypes.addressof(fprog), 0, 0) != 0:
        error = ctypes.get_errno()
        raise OSError(error, f"seccomp: {os.strerror(error)}")
