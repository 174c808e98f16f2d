// dtrain as the first process of a PID namespace (a container's entry point without an init:
// `docker run` without --init, a Kubernetes container, `unshare --pid --fork dtrain ...`).
//
// PID 1 inherits every orphan of its namespace (the children of `docker exec` and `kubectl
// exec` sessions, of exec probes, a rank's own helpers): nothing reaps them unless PID 1 does,
// and as zombies they count against the pod's PID limit until the container ends. So, as PID 1,
// dtrain runs itself as a child under a minimal init of its own, as `docker run --init` (tini)
// would: the init starts the same binary with the same arguments, environment and descriptors,
// reaps every child that ends, passes the signals sent to it on to that child, and exits with the
// child's status (128 + the signal's number when a signal ended it, the status a shell reports:
// PID 1 cannot end by a signal's default action). Everything dtrain does is then done by a
// process that is not PID 1, whose signals act as anywhere else.
//
// Signals: every signal sent to the init (docker stop's SIGTERM, `kill -INT 1`, a hang-up) is
// passed on, once. The child leads a process group of its own and takes the terminal's
// foreground when the init had it, as tini does: a terminal's own signals (Ctrl-C, Ctrl-Z, a
// window change) reach the child alone, and a signal sent to the init's group (`timeout`) the
// init alone -- either way one signal, never two (dtrain takes a second as "stop at once").
#pragma once

namespace dtrain {

// When this process is PID 1: runs the init described above and never returns (it exits with
// the child's status). Otherwise returns at once; so it does, after one line on stderr, when the
// child cannot be started (dtrain then runs as PID 1, reaping nothing). Call first thing in main,
// before any thread is started.
void become_init_if_pid1(char** argv);

}  // namespace dtrain
