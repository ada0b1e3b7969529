#include "pptrain/schedule/peer_order.h"

#include <algorithm>
#include <limits>
#include <map>
#include <tuple>
#include <utility>

#include "pptrain/common/check.h"
#include "pptrain/schedule/semantics.h"

namespace pptrain {
namespace {

constexpr size_t kNone = std::numeric_limits<size_t>::max();
// A deadlock's chain of waits names at most this many operations.
constexpr int kMaxChain = 16;

// The reference run of nccl_posting() (peer_order.h): by message_index(), when its SEND ran
// (a count over the whole run) and the position its receiver was about to run then.
struct ReferenceRun {
  std::vector<size_t> sent_at;
  std::vector<size_t> receiver_at;
};

ReferenceRun reference_run(const Schedule& lowered) {
  const int P = lowered.num_ranks;
  ReferenceRun run{std::vector<size_t>(message_count(lowered), kNone),
                   std::vector<size_t>(message_count(lowered), kNone)};
  std::vector<size_t> sent_round(run.sent_at.size(), kNone);
  std::vector<size_t> pc(P, 0);
  size_t left = 0, clock = 0;
  for (const auto& list : lowered.actions) left += list.size();
  for (size_t round = 0; left > 0; ++round) {
    const size_t left_before = left;
    for (int r = 0; r < P; ++r) {
      const auto& list = lowered.actions[r];
      bool computed = false;
      for (; pc[r] < list.size(); ++pc[r], --left, ++clock) {
        const Action& a = list[pc[r]];
        if (is_compute(a.op)) {
          if (computed) break;
          computed = true;
        } else if (is_recv(a.op)) {
          const size_t sent = sent_round[message_index(a, lowered)];
          if (sent == kNone || sent >= round) break;
        } else if (is_send(a.op)) {
          const size_t m = message_index(a, lowered);
          sent_round[m] = round;
          run.sent_at[m] = clock;
          run.receiver_at[m] = pc[rank_of_peer(lowered, a)];
        }
      }
    }
    PPTRAIN_ASSERT(left < left_before, "the reference run of a validated schedule is stuck");
  }
  return run;
}

// One operation as check_posting() runs it: a SEND or RECV as posted.
struct Operation {
  int rank = 0;
  int group = 0;        // in Run::groups_
  size_t position = 0;  // of its action in the rank's list
  int peer = 0;
  bool send = false;
  int channel = 0;     // its (sender, receiver) pair's, in Run::channels_
  size_t ordinal = 0;  // among the channel's sends (or receives) in posting order
  bool met = false;    // it has met its partner
};

// A PostingGroup as check_posting() runs it.
struct Group {
  int rank = 0;
  size_t before = 0;
  std::vector<int> ops;      // in Run::ops_
  std::vector<int> streams;  // one per peer, in Run::streams_
  int unmet = 0;             // operations that have not met their partner
  bool posted = false;
  bool done = false;
  int waiter = -1;  // the rank whose compute action waits for it
};

// One rank's side of its stream to one peer: its groups there, in posting order.
struct Stream {
  std::vector<int> groups;
  size_t head = 0;  // the first one not done
};

// The sends from one rank to another and the receives there, each in posting order.
struct Channel {
  std::vector<int> sends, receives;
};

std::string ordinal(size_t k) {  // 0 -> "1st"
  const size_t n = k + 1;
  const char* suffix = "th";
  if (n % 100 < 11 || n % 100 > 13) {
    if (n % 10 == 1) suffix = "st";
    if (n % 10 == 2) suffix = "nd";
    if (n % 10 == 3) suffix = "rd";
  }
  return std::to_string(n) + suffix;
}

// check_posting()'s run: what can happen is done as soon as it can, a rank walking on when a
// group it waits for finishes and a group trying its operations' partners when it comes first
// on its streams, so that the run is about linear in the number of operations. No step undoes
// another, so the order in which they are taken does not change where the run ends.
class Run {
 public:
  Run(const Schedule& lowered, const PeerPosting& posting) : s_(lowered), posting_(posting) {}

  std::optional<std::string> check() {
    if (auto problem = build()) return problem;
    for (int r = 0; r < s_.num_ranks; ++r) ranks_to_walk_.push_back(r);
    while (!ranks_to_walk_.empty() || !groups_to_try_.empty()) {
      if (!groups_to_try_.empty()) {
        const int g = groups_to_try_.back();
        groups_to_try_.pop_back();
        if (auto problem = try_group(g)) return problem;
      } else {
        const int r = ranks_to_walk_.back();
        ranks_to_walk_.pop_back();
        walk(r);
      }
    }
    for (const Group& g : groups_) {
      if (!g.done) return deadlock();
    }
    for (int r = 0; r < s_.num_ranks; ++r) {
      if (pc_[r] < s_.actions[r].size()) return deadlock();
    }
    return std::nullopt;
  }

 private:
  const Action& action_of(const Operation& op) const { return s_.actions[op.rank][op.position]; }
  std::string text_of(int op) const {
    const Operation& o = ops_[op];
    return to_string(action_of(o)) + (o.send ? " to rank " : " from rank ") +
           std::to_string(o.peer);
  }
  std::string position_text(int rank, size_t position) const {
    const auto& list = s_.actions[rank];
    return position < list.size()
               ? "position " + std::to_string(position) + " (" + to_string(list[position]) + ")"
               : std::string("the end of its list");
  }

  // The posting as operations, groups, streams and channels, and what each compute action waits
  // for; the first reason it is no posting of the schedule, if any.
  std::optional<std::string> build() {
    const int P = s_.num_ranks;
    if (static_cast<int>(posting_.groups.size()) != P) {
      return "the posting has groups for " + std::to_string(posting_.groups.size()) +
             " ranks, the schedule " + std::to_string(P);
    }
    FactTable<size_t> made_at(s_, kNone, /*messages=*/false);
    std::vector<size_t> needed_at(message_count(s_), kNone);
    find_needs(made_at, needed_at);
    receive_op_.assign(message_count(s_), -1);
    first_group_.assign(P, 0);
    for (int r = 0; r < P; ++r) {
      const auto& list = s_.actions[r];
      std::vector<int> posted_in(list.size(), -1);  // [position] the group posting it
      first_group_[r] = static_cast<int>(groups_.size());
      for (size_t k = 0; k < posting_.groups[r].size(); ++k) {
        if (auto problem = refuse_group(r, k)) return problem;
        const PostingGroup& given = posting_.groups[r][k];
        const int g = static_cast<int>(groups_.size());
        groups_.emplace_back();
        groups_.back().rank = r;
        groups_.back().before = given.before;
        for (const PostedComm& comm : given.comms) {
          if (auto problem = refuse_comm(r, k, comm, made_at, needed_at, posted_in)) return problem;
          add_operation(g, comm);
        }
      }
      for (size_t p = 0; p < list.size(); ++p) {
        if (is_comm(list[p].op) && posted_in[p] < 0) {
          return "rank " + std::to_string(r) + " never posts " + to_string(list[p]) +
                 " (position " + std::to_string(p) + ")";
        }
      }
    }
    first_group_.push_back(static_cast<int>(groups_.size()));
    next_group_ = first_group_;
    next_group_.pop_back();
    pc_.assign(P, 0);
    waits_for_.assign(P, -1);
    return std::nullopt;
  }

  // Where each compute fact is made, the messages each compute action needs (needs_) and the
  // first position of its rank that needs each message.
  void find_needs(FactTable<size_t>& made_at, std::vector<size_t>& needed_at) {
    needs_.assign(s_.num_ranks, {});
    for (int r = 0; r < s_.num_ranks; ++r) {
      const auto& list = s_.actions[r];
      needs_[r].resize(list.size());
      for (size_t p = 0; p < list.size(); ++p) {
        if (!is_compute(list[p].op)) continue;
        for (const Action& atom : atoms_of(list[p])) {
          made_at[produced_by(atom)] = p;
          for (const Need& need : inputs_of(atom, s_, /*lowered=*/true)) {
            if (!is_receipt(need.fact)) continue;
            const size_t m = message_index(producer_of(need), s_);
            needs_[r][p].push_back(m);
            needed_at[m] = std::min(needed_at[m], p);
          }
        }
      }
    }
  }

  std::optional<std::string> refuse_group(int r, size_t k) const {
    const std::vector<PostingGroup>& groups = posting_.groups[r];
    const std::string what = "rank " + std::to_string(r) + "'s group " + std::to_string(k) +
                             " is posted before position " + std::to_string(groups[k].before);
    if (groups[k].before > s_.actions[r].size()) {
      return what + ", past the end of its " + std::to_string(s_.actions[r].size()) + " actions";
    }
    if (k > 0 && groups[k].before < groups[k - 1].before) {
      return what + ", ahead of its group " + std::to_string(k - 1) + " before position " +
             std::to_string(groups[k - 1].before);
    }
    return std::nullopt;
  }

  // Why rank r's group k may not post `comm`, if it may not; else marks it posted.
  std::optional<std::string> refuse_comm(int r, size_t k, const PostedComm& comm,
                                         const FactTable<size_t>& made_at,
                                         const std::vector<size_t>& needed_at,
                                         std::vector<int>& posted_in) const {
    const auto& list = s_.actions[r];
    if (comm.position >= list.size() || !is_comm(list[comm.position].op)) {
      return "rank " + std::to_string(r) + " posts position " + std::to_string(comm.position) +
             ", which is no SEND or RECV of its list";
    }
    const Action& a = list[comm.position];
    const std::string what = "rank " + std::to_string(r) + " posts " + to_string(a);
    if (posted_in[comm.position] >= 0) {
      return what + " twice (groups " + std::to_string(posted_in[comm.position]) + " and " +
             std::to_string(k) + ")";
    }
    posted_in[comm.position] = static_cast<int>(k);
    const int peer = rank_of_peer(s_, a);
    if (comm.peer != peer) {
      return what + " to rank " + std::to_string(comm.peer) + ", but its other end is on rank " +
             std::to_string(peer);
    }
    const size_t before = posting_.groups[r][k].before;
    if (is_send(a.op)) {
      const size_t made = made_at[*inputs_of(a, s_, /*lowered=*/true).begin()];
      if (made == kNone || before <= made) {
        return what + " before " + position_text(r, before) + ", ahead of " +
               (made == kNone ? std::string("anything that makes what it sends")
                              : to_string(list[made]) + " that makes what it sends");
      }
      return std::nullopt;
    }
    const size_t needed = needed_at[message_index(a, s_)];
    if (needed != kNone && before > needed) {
      return what + " before " + position_text(r, before) + ", after " + to_string(list[needed]) +
             " (position " + std::to_string(needed) + ") that needs it";
    }
    return std::nullopt;
  }

  // `comm` (checked) as an operation of group g, last on its channel and its stream.
  void add_operation(int g, const PostedComm& comm) {
    Group& group = groups_[g];
    const Action& a = s_.actions[group.rank][comm.position];
    const bool send = is_send(a.op);
    const auto channel = channel_of_.emplace(
        send ? std::make_pair(group.rank, comm.peer) : std::make_pair(comm.peer, group.rank),
        static_cast<int>(channels_.size()));
    if (channel.second) channels_.emplace_back();
    std::vector<int>& order =
        send ? channels_[channel.first->second].sends : channels_[channel.first->second].receives;
    const int o = static_cast<int>(ops_.size());
    ops_.push_back(Operation{group.rank, g, comm.position, comm.peer, send, channel.first->second,
                             order.size()});
    order.push_back(o);
    if (!send) receive_op_[message_index(a, s_)] = o;
    group.ops.push_back(o);
    ++group.unmet;
    const auto stream = stream_of_.emplace(std::make_pair(group.rank, comm.peer),
                                           static_cast<int>(streams_.size()));
    if (stream.second) streams_.emplace_back();
    if (std::find(group.streams.begin(), group.streams.end(), stream.first->second) ==
        group.streams.end()) {
      group.streams.push_back(stream.first->second);
      streams_[stream.first->second].groups.push_back(g);
    }
  }

  bool running(int g) const {
    const Group& group = groups_[g];
    if (!group.posted || group.done) return false;
    for (int s : group.streams) {
      if (streams_[s].groups[streams_[s].head] != g) return false;
    }
    return true;
  }

  // The operation at the other end: the same ordinal in the other half of its channel.
  int partner(int o) const {
    const Operation& op = ops_[o];
    const Channel& channel = channels_[op.channel];
    const std::vector<int>& other = op.send ? channel.receives : channel.sends;
    return op.ordinal < other.size() ? other[op.ordinal] : -1;
  }

  void post_through(int r, size_t position) {
    while (next_group_[r] < first_group_[r + 1] && groups_[next_group_[r]].before <= position) {
      groups_[next_group_[r]].posted = true;
      groups_to_try_.push_back(next_group_[r]++);
    }
  }

  void walk(int r) {
    const auto& list = s_.actions[r];
    waits_for_[r] = -1;
    for (; pc_[r] < list.size(); ++pc_[r]) {
      post_through(r, pc_[r]);
      for (size_t m : needs_[r][pc_[r]]) {
        const int o = receive_op_[m];
        if (groups_[ops_[o].group].done) continue;
        waits_for_[r] = o;
        groups_[ops_[o].group].waiter = r;
        return;
      }
    }
    post_through(r, list.size());
  }

  void finish(int g) {
    Group& group = groups_[g];
    group.done = true;
    for (int s : group.streams) {
      Stream& stream = streams_[s];
      while (stream.head < stream.groups.size() && groups_[stream.groups[stream.head]].done) {
        ++stream.head;
      }
      if (stream.head < stream.groups.size()) groups_to_try_.push_back(stream.groups[stream.head]);
    }
    if (group.waiter >= 0) ranks_to_walk_.push_back(group.waiter);
    group.waiter = -1;
  }

  std::optional<std::string> try_group(int g) {
    if (!running(g)) return std::nullopt;
    for (int o : groups_[g].ops) {
      if (ops_[o].met) continue;
      const int p = partner(o);
      if (p < 0 || !running(ops_[p].group)) continue;
      const Operation& op = ops_[o];
      const Operation& send = op.send ? op : ops_[p];
      const Operation& receive = op.send ? ops_[p] : op;
      if (message_index(action_of(send), s_) != message_index(action_of(receive), s_)) {
        return "mismatch: rank " + std::to_string(send.rank) + "'s " + ordinal(send.ordinal) +
               " send to rank " + std::to_string(receive.rank) + " is " +
               to_string(action_of(send)) + ", but rank " + std::to_string(receive.rank) + "'s " +
               ordinal(receive.ordinal) + " receive from rank " + std::to_string(send.rank) +
               " is " + to_string(action_of(receive)) + " (NCCL pairs them by order)";
      }
      for (int end : {o, p}) {
        ops_[end].met = true;
        if (--groups_[ops_[end].group].unmet == 0) finish(ops_[end].group);
      }
    }
    if (groups_[g].unmet == 0 && !groups_[g].done) finish(g);
    return std::nullopt;
  }

  int first_unmet(int g) const {
    for (int o : groups_[g].ops) {
      if (!ops_[o].met) return o;
    }
    return -1;
  }
  // The group first on one of `g`'s streams where `g` is not.
  int queued_behind(int g) const {
    for (int s : groups_[g].streams) {
      const int head = streams_[s].groups[streams_[s].head];
      if (head != g) return head;
    }
    return -1;
  }

  // The chain of waits from the first rank that cannot go on, until it comes back to an
  // operation it named.
  std::string deadlock() const {
    std::string text = "deadlock: ";
    int op = -1;
    for (int r = 0; r < s_.num_ranks && op < 0; ++r) {
      if (waits_for_[r] < 0) continue;
      op = waits_for_[r];
      text += "rank " + std::to_string(r) + "'s " + to_string(s_.actions[r][pc_[r]]) +
              " waits for " + text_of(op);
    }
    for (size_t g = 0; g < groups_.size() && op < 0; ++g) {
      if (groups_[g].done) continue;
      op = first_unmet(static_cast<int>(g));
      text += "rank " + std::to_string(groups_[g].rank) + " ends its list with " + text_of(op) +
              " unfinished";
    }
    std::vector<char> named(ops_.size(), 0);
    for (int links = 0; op >= 0; ++links) {
      if (named[op]) return text + " (a circle)";
      if (links == kMaxChain) return text + ", ...";
      named[op] = 1;
      const int g = ops_[op].group;
      int next = -1;
      if (!running(g)) {
        PPTRAIN_ASSERT(queued_behind(g) >= 0, "a posted group neither running nor queued");
        next = first_unmet(queued_behind(g));
        text += ", which is queued behind " + text_of(next);
      } else if (ops_[op].met) {
        next = first_unmet(g);
        text += ", which is grouped with " + text_of(next);
      } else {
        const int p = partner(op);
        PPTRAIN_ASSERT(p >= 0, "every operation of a checked posting has a partner");
        const Operation& other = ops_[p];
        const std::string whose = ", whose " + to_string(action_of(other));
        if (!groups_[other.group].posted) {
          const int q = other.rank;
          PPTRAIN_ASSERT(waits_for_[q] >= 0, "rank ", q, " stopped short of a group it posts");
          next = waits_for_[q];
          text += whose + " rank " + std::to_string(q) + " posts only after its " +
                  to_string(s_.actions[q][pc_[q]]) + ", which waits for " + text_of(next);
        } else {
          PPTRAIN_ASSERT(!running(other.group), "two running operations that did not meet");
          next = first_unmet(queued_behind(other.group));
          text += whose + " is queued behind " + text_of(next);
        }
      }
      op = next;
    }
    return text;
  }

  const Schedule& s_;
  const PeerPosting& posting_;
  std::vector<Operation> ops_;
  std::vector<Group> groups_;
  std::vector<Stream> streams_;
  std::vector<Channel> channels_;
  std::map<std::pair<int, int>, int> channel_of_;        // (sender, receiver) -> its channel
  std::map<std::pair<int, int>, int> stream_of_;         // (rank, peer) -> its side of their stream
  std::vector<std::vector<std::vector<size_t>>> needs_;  // [rank][position] messages it needs
  std::vector<int> receive_op_;                          // [message_index] its receive's op
  std::vector<int> first_group_;  // [rank] its first group in groups_; [P] all of them
  std::vector<int> next_group_;   // [rank] its first group not posted yet
  std::vector<size_t> pc_;        // [rank] the action its walk stands at
  std::vector<int> waits_for_;    // [rank] the receive its action at pc_ waits for; -1: none
  std::vector<int> ranks_to_walk_, groups_to_try_;
};

}  // namespace

PeerPosting nccl_posting(const ValidatedSchedule& validated) {
  const Schedule& s = validated.schedule();
  const ReferenceRun run = reference_run(s);
  PeerPosting posting;
  posting.groups.resize(s.num_ranks);
  for (int r = 0; r < s.num_ranks; ++r) {
    // (before, peer, when the SEND ran, position): one group per (before, peer).
    std::vector<std::tuple<size_t, int, size_t, size_t>> comms;
    const auto& list = s.actions[r];
    for (size_t p = 0; p < list.size(); ++p) {
      if (!is_comm(list[p].op)) continue;
      const size_t m = message_index(list[p], s);
      const size_t before = is_send(list[p].op) ? p : run.receiver_at[m];
      comms.emplace_back(before, rank_of_peer(s, list[p]), run.sent_at[m], p);
    }
    std::sort(comms.begin(), comms.end());
    std::vector<PostingGroup>& groups = posting.groups[r];
    for (size_t k = 0; k < comms.size(); ++k) {
      const auto& [before, peer, sent, position] = comms[k];
      if (k == 0 || before != std::get<0>(comms[k - 1]) || peer != std::get<1>(comms[k - 1])) {
        groups.push_back(PostingGroup{before, {}});
      }
      groups.back().comms.push_back(PostedComm{position, peer});
    }
  }
  return posting;
}

PeerPosting per_action_posting(const ValidatedSchedule& validated, int recv_ahead) {
  const Schedule& s = validated.schedule();
  PeerPosting posting;
  posting.groups.resize(s.num_ranks);
  for (int r = 0; r < s.num_ranks; ++r) {
    const auto& list = s.actions[r];
    std::vector<size_t> receives;
    for (size_t p = 0; p < list.size(); ++p) {
      if (is_recv(list[p].op)) receives.push_back(p);
    }
    const std::vector<size_t> posted = receives_posted(list, recv_ahead);
    size_t next = 0;
    for (size_t p = 0; p < list.size(); ++p) {
      for (; next < posted[p]; ++next) {
        posting.groups[r].push_back({p, {{receives[next], rank_of_peer(s, list[receives[next]])}}});
      }
      if (is_send(list[p].op)) posting.groups[r].push_back({p, {{p, rank_of_peer(s, list[p])}}});
    }
  }
  return posting;
}

std::optional<std::string> check_posting(const ValidatedSchedule& validated,
                                         const PeerPosting& posting) {
  return Run(validated.schedule(), posting).check();
}

}  // namespace pptrain
