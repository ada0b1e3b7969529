// How a rank posts its messages when they go over NCCL, and a check that a posting can run.
//
// NCCL matches point-to-point messages by order, not by tag. In torch's ProcessGroupNCCL every
// send and receive between two ranks goes onto one stream of that pair's communicator, in the
// order the rank posts them: a posted operation runs as a kernel that finishes only once its
// partner runs on the other rank, and the next one on the stream starts after it. Operations
// posted as one group (ncclGroupStart..End, torch's batch_isend_irecv) run as one kernel and
// finish together. The k-th send from a to b meets the k-th receive on b from a, so both must
// carry the same message. The runtime's tagged order over Gloo (receives posted ahead, sends at
// their action; runtime/executor.cpp) breaks that: in 1f1b on 2 ranks, rank 0 posts 0RECV_B0
// ahead and queues 0SEND_F0 behind it, while rank 1 makes 1SEND_B0 only after its 1F0, which
// waits for that 0SEND_F0.
//
// A posting (PeerPosting) is plain data: for each rank, its groups in the order it posts them,
// each with the position in its lowered list before which it is posted and its SEND/RECV
// actions with the rank at their other end. check_posting() runs NCCL's rules on all ranks at
// once and names the first deadlock or mismatch; nccl_posting() makes a posting that passes.
//
// The rule of nccl_posting(), in three steps:
//   1. A reference run: the lowered schedule in rounds, each rank running in a round at most one
//      compute action and the messages around it, a RECV only once its SEND ran in an earlier
//      round, ranks in order within a round. It exists because validate() found no deadlock.
//   2. A SEND is posted at its own action. A RECV is posted before the action its rank was about
//      to run when the message's SEND ran in the reference run: never after the RECV itself, and
//      never before the message could be sent. Receives are thus posted only as far ahead as
//      the sender ran ahead (in 1f1b one forward); a skip connection's, sent some P actions
//      before their use, are held that long by the receiver rather than the sender.
//   3. What a rank posts to one peer before one action is one group, ordered by when the SENDs
//      ran in the reference run: its receives, then its own send (as torch batches a forward's
//      send with a backward's receive).
// Each pair's messages are thus posted in the order of their SENDs in the reference run on both
// ends. Why that cannot deadlock: follow the reference run with NCCL's rules; when a SEND runs,
// its receive was posted already (at the receiver's position then), every earlier message of the
// pair has met its partner, so both are first on their stream and meet at once; and every
// operation in a group meets its partner by the time the group's position is passed, before any
// action needing one of its receives runs. NCCL's steps never undo each other, so one run that
// finishes means that none deadlocks.
//
//   const ValidatedSchedule ok = validate(schedule);
//   const PeerPosting posting = nccl_posting(ok);
//   if (auto problem = check_posting(ok, posting)) ...   // "deadlock: rank 0's 0B0 waits ..."
#pragma once

#include <cstddef>
#include <optional>
#include <string>
#include <vector>

#include "pptrain/schedule/validate.h"

namespace pptrain {

// One message a rank posts: its SEND or RECV action and the rank at the other end.
struct PostedComm {
  size_t position = 0;  // of the SEND or RECV action in the rank's lowered list
  int peer = -1;        // the rank at the other end (rank_of_peer)
};

// What a rank posts together, as one NCCL group.
struct PostingGroup {
  size_t before = 0;              // posted before the action at this position runs (the
                                  // list's size: after its last action)
  std::vector<PostedComm> comms;  // in the order they are posted
};

struct PeerPosting {
  // [num_ranks] each rank's groups in the order it posts them (`before` not decreasing).
  std::vector<std::vector<PostingGroup>> groups;
};

// The rule above for a validated schedule (its lowered form, ValidatedSchedule::schedule()).
PeerPosting nccl_posting(const ValidatedSchedule& validated);

// The runtime's order over Gloo as a posting: every SEND or RECV its own group, a SEND at its
// action and the receives where receives_posted(list, recv_ahead) posts them (semantics.h),
// ahead of a SEND at the same position.
PeerPosting per_action_posting(const ValidatedSchedule& validated, int recv_ahead);

// Runs `posting` of `validated`'s lowered schedule under NCCL's rules for all ranks at once:
// each rank walks its list, posting each group when it reaches its position (posting never
// blocks); a compute action waits until the groups of the receives it needs have finished;
// between two ranks the groups run one after the other in the order posted, and a group
// finishes when each of its operations has met its partner running on the other rank (a group
// with several peers runs once it is first on each of their streams). None when every rank gets
// through its list; else one line: the first mismatch (the k-th send from a to b and the k-th
// receive on b from a carry different messages), the chain of waits of a deadlock, or a posting
// that is not one (a comm posted twice or never, at the wrong peer, a SEND before its data is
// made, a RECV after the action that needs it).
std::optional<std::string> check_posting(const ValidatedSchedule& validated,
                                         const PeerPosting& posting);

}  // namespace pptrain
