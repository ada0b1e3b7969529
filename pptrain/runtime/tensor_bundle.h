// How a TensorBundle (models/tensor_bundle.h) travels between stages.
//
// On the wire (send_bundle / BundleReceive) a message is one buffer of bytes: a header (each
// tensor's name, dtype and shape, and the message's length) and the tensors' bytes. The
// receiver posts its receive ahead, sized as the last message of the same tag was, so that a
// message of the same length as before (the usual case: the same shapes every step) arrives as
// it is sent, in one transfer. When the length changed (the first message of a tag, a batch of
// another sequence length) the sender first sends a notice of the old length that tells the new
// one, and then the message: one round trip more, and no probe or declaration of shapes.
#pragma once

#include <torch/torch.h>

#include <cstdint>
#include <string>
#include <unordered_map>

#include "pptrain/models/tensor_bundle.h"
#include "pptrain/runtime/transport.h"

namespace pptrain {

// The length of the last message of each tag, as its sender and its receiver saw it: both
// ends of a tag's messages remember the same sequence of lengths, which is what lets a receive
// be sized before its message comes. One per Executor, kept from step to step; a tag's next
// message may be sent or received only once its last one has been received.
struct MessageLengths {
  std::unordered_map<int, int64_t> sent;
  std::unordered_map<int, int64_t> received;
};

// The length of a tag's first message as its receive expects it: a notice (magic and length),
// which the sender sends before the message whenever the length changes.
constexpr int64_t kNoticeBytes = 64;

// The bytes of the message of `bundle`: its header and its tensors' data, each padded. What a
// send's copy holds, and a received bundle's tensors (views of their message) keep alive.
int64_t message_bytes(const TensorBundle& bundle);

// Sends `bundle` as the message of `tag` to `peer` (its tensors copied into the message, so
// they may change at once). The result completes when the message is out; it adds the
// tensors' bytes (not the header's) to `bytes_sent`.
PendingComm send_bundle(Transport& transport, const TensorBundle& bundle, int peer, int tag,
                        MessageLengths& lengths, int64_t* bytes_sent = nullptr);

// A message on its way in, its receive posted when made (ahead of the RECV that takes it).
class BundleReceive {
 public:
  BundleReceive() = default;
  // `what` names the message in errors ("the output of stage 1 to stage 2 (microbatch 3)");
  // `lengths` outlives the receive.
  BundleReceive(Transport& transport, int peer, int tag, std::string what, MessageLengths& lengths);

  // Waits for the message (and its second part after a notice of a new length); the tensors
  // it holds, of the names, dtypes and shapes its header tells. Rethrows what went wrong (a
  // timeout, a broken connection); UserError naming the message when it is not one of ours.
  TensorBundle finish();

 private:
  Transport* transport_ = nullptr;
  int peer_ = -1;
  int tag_ = -1;
  std::string what_;
  MessageLengths* lengths_ = nullptr;
  PendingComm first_;
};

}  // namespace pptrain
