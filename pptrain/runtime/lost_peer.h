// What stops a rank whose library thread throws: one line naming the peer that is gone, never an
// abort.
//
// Gloo's network loop and c10d's store client run threads of their own. An exception thrown
// there (a peer's connection that broke in the middle of a message) reaches no code of ours: the
// C++ runtime calls std::terminate, and the rank aborts with "terminate called after throwing an
// instance of 'std::bad_alloc'" instead of saying which peer it lost. connect_transport() installs
// a handler for that case: it looks for the peers of this host whose process ended (waiting up to
// a second for the one that just closed its connection), prints
//
//   pptrain: error: rank 1: lost rank 0 (its process ended): the connection broke (the peer may
//   have exited); a communication thread then failed: std::bad_alloc
//
// as one line, and exits with status 1. The launcher reads "the connection broke" as a peer's
// view of another's failure, not as the cause of the run's.
//
//   stop_with_one_line_on_terminate(rank, peers_met_in_the_store, host_identity());
#pragma once

#include <string>
#include <vector>

namespace pptrain {

// Another rank's process as this one saw it when they met: its host (as host_identity() in
// transport.cpp writes it: name, boot, pid and mount namespaces) and its process id there.
struct PeerProcess {
  int rank = 0;
  std::string host;
  int pid = 0;
};

// The state letter of process `pid` of this host in /proc/PID/stat (R, S, T, Z, ...); 0 when it
// has no entry.
char process_state(int pid);

// Whether process `pid` of this host has ended: no entry in /proc, or a zombie (state Z, or X
// while its parent reaps it) that still answers kill(pid, 0).
bool process_ended(int pid);

// The ranks among `peers` on `host` (this process's host) whose process has ended: no longer
// there, or a zombie its parent has not reaped. A peer on another host is never among them.
std::vector<int> ended_peers(const std::vector<PeerProcess>& peers, const std::string& host);

// The line (without "pptrain: error: ") for rank `rank` whose thread failed with `cause`, when
// the peers `ended` are gone (none: a failure not known to follow a peer's exit).
std::string terminate_line(int rank, const std::vector<int>& ended, const std::string& cause);

// Makes std::terminate in this process print terminate_line() of the exception in flight as
// "pptrain: error: ..." on stderr and exit with status 1. A later call replaces `rank` and
// `peers` (the process's last world).
void stop_with_one_line_on_terminate(int rank, std::vector<PeerProcess> peers, std::string host);

}  // namespace pptrain
