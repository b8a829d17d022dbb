#include "worker/collective/gloo_communicator.h"

#include <algorithm>
#include <chrono>
#include <stdexcept>

#include "absl/strings/str_cat.h"
#include "absl/time/clock.h"
#include "gloo/common/error.h"
#include "gloo/rendezvous/context.h"
#include "gloo/rendezvous/store.h"
#include "gloo/transport/tcp/device.h"
#include "gloo/transport/unbound_buffer.h"
#include "worker/collective/gloo_workarounds.h"

namespace ddp {

absl::StatusOr<std::unique_ptr<GlooCommunicator>> GlooCommunicator::Create(
    gloo::rendezvous::Store& store, const Options& options) {
  PrepareProcessForGloo();
  try {
    gloo::transport::tcp::attr attr;
    attr.hostname = options.host;
    auto device = gloo::transport::tcp::CreateDevice(attr);
    auto context = std::make_shared<gloo::rendezvous::Context>(options.rank, options.world_size);
    context->setTimeout(absl::ToChronoMilliseconds(options.timeout));
    context->connectFullMesh(store, device);
    return std::unique_ptr<GlooCommunicator>(new GlooCommunicator(std::move(context), options));
  } catch (const std::exception& e) {
    return absl::UnavailableError(absl::StrCat("gloo rendezvous of rank ", options.rank, " of ",
                                               options.world_size, " at ", options.host,
                                               " failed: ", e.what()));
  }
}

GlooCommunicator::GlooCommunicator(std::shared_ptr<gloo::Context> context, const Options& options)
    : context_(std::move(context)),
      rank_(options.rank),
      world_size_(options.world_size),
      timeout_(options.timeout) {}

GlooCommunicator::~GlooCommunicator() = default;

namespace {

// A wait that gave up at the communicator's timeout. Gloo throws the same
// IoException for that as for a broken connection, so the wait tells the two
// apart by how long it waited, and says which by this type.
struct WaitTimedOut : std::runtime_error {
  using std::runtime_error::runtime_error;
};

template <typename Wait>
bool TimedWait(absl::Duration timeout, Wait wait) {
  const absl::Time start = absl::Now();
  try {
    return wait();
  } catch (const gloo::IoException& e) {
    if (absl::Now() - start >= timeout) throw WaitTimedOut(e.what());
    throw;
  }
}

}  // namespace

absl::Status GlooCommunicator::Failed(const char* op, const std::exception& e) const {
  const std::string what = e.what();
  if (dynamic_cast<const WaitTimedOut*>(&e) != nullptr) {
    return absl::DeadlineExceededError(
        absl::StrCat("gloo ", op, " on rank ", rank_, " timed out after ",
                     absl::FormatDuration(timeout_), " (a peer is stuck?): ", what));
  }
  return absl::UnavailableError(
      absl::StrCat("gloo ", op, " on rank ", rank_, " failed (a peer left?): ", what));
}

GlooCommunicator::Buffer::Buffer(GlooCommunicator* comm,
                                 std::unique_ptr<gloo::transport::UnboundBuffer> buffer)
    : comm_(comm), buffer_(std::move(buffer)) {}

GlooCommunicator::Buffer::~Buffer() {
  {
    absl::MutexLock lock(&comm_->mu_);
    auto& active = comm_->active_;
    active.erase(std::remove(active.begin(), active.end(), buffer_.get()), active.end());
  }
  buffer_.reset();
}

std::unique_ptr<GlooCommunicator::Buffer> GlooCommunicator::Track(void* data, size_t bytes) {
  auto b = std::make_unique<Buffer>(this, context_->createUnboundBuffer(data, bytes));
  absl::MutexLock lock(&mu_);
  active_.push_back(b->get());
  // Aborted before this buffer existed: make its first wait return at once.
  if (aborted_) {
    (*b)->abortWaitSend();
    (*b)->abortWaitRecv();
  }
  return b;
}

bool GlooCommunicator::WaitSend(gloo::transport::UnboundBuffer* b) {
  return TimedWait(timeout_, [&] { return b->waitSend(absl::ToChronoMilliseconds(timeout_)); });
}

bool GlooCommunicator::WaitRecv(gloo::transport::UnboundBuffer* b) {
  return TimedWait(timeout_, [&] { return b->waitRecv(absl::ToChronoMilliseconds(timeout_)); });
}

template <typename T, typename Add>
absl::Status GlooCommunicator::RingAllReduce(T* data, size_t count, Add add) {
  const int n = world_size_;
  const int right = (rank_ + 1) % n;
  const int left = (rank_ + n - 1) % n;
  // Chunk c covers [begin(c), begin(c + 1)): sizes differ by at most one.
  auto begin = [&](int c) { return count / n * c + std::min<size_t>(c, count % n); };
  auto length = [&](int c) { return begin(c + 1) - begin(c); };
  scratch_.resize((count / n + 1) * sizeof(T));
  const uint64_t slot = context_->nextSlot();
  std::unique_ptr<Buffer> out = Track(data, count * sizeof(T));
  std::unique_ptr<Buffer> in = Track(data, count * sizeof(T));
  std::unique_ptr<Buffer> tmp = Track(scratch_.data(), scratch_.size());
  // Reduce-scatter: after n-1 steps this rank holds the full sum of chunk
  // (rank + 1) % n.
  for (int s = 0; s < n - 1; ++s) {
    const int send = (rank_ - s + n) % n;
    const int recv = (rank_ - s - 1 + n) % n;
    if (length(recv) > 0) (*tmp)->recv(left, slot, 0, length(recv) * sizeof(T));
    if (length(send) > 0)
      (*out)->send(right, slot, begin(send) * sizeof(T), length(send) * sizeof(T));
    if (length(send) > 0 && !WaitSend(out->get())) return absl::AbortedError("aborted");
    if (length(recv) > 0 && !WaitRecv(tmp->get())) return absl::AbortedError("aborted");
    T* dst = data + begin(recv);
    const T* src = reinterpret_cast<const T*>(scratch_.data());
    add(dst, src, length(recv));
  }
  // All-gather: pass the finished chunks around the ring.
  for (int s = 0; s < n - 1; ++s) {
    const int send = (rank_ - s + 1 + n) % n;
    const int recv = (rank_ - s + n) % n;
    if (length(recv) > 0)
      (*in)->recv(left, slot, begin(recv) * sizeof(T), length(recv) * sizeof(T));
    if (length(send) > 0)
      (*out)->send(right, slot, begin(send) * sizeof(T), length(send) * sizeof(T));
    if (length(send) > 0 && !WaitSend(out->get())) return absl::AbortedError("aborted");
    if (length(recv) > 0 && !WaitRecv(in->get())) return absl::AbortedError("aborted");
  }
  return absl::OkStatus();
}

template <typename T, typename Add>
absl::Status GlooCommunicator::AllReduceWith(T* data, size_t count, Add add) {
  {
    absl::MutexLock lock(&mu_);
    if (aborted_) return absl::AbortedError("communicator aborted");
  }
  if (world_size_ == 1 || count == 0) return absl::OkStatus();
  absl::Status status;
  try {
    status = RingAllReduce(data, count, add);
  } catch (const std::exception& e) {
    status = Failed("all-reduce", e);
  }
  absl::MutexLock lock(&mu_);
  if (aborted_) return absl::AbortedError("gloo all-reduce aborted");
  return status;
}

absl::Status GlooCommunicator::AllReduceSum(float* data, size_t count) {
  return AllReduceWith(data, count, AddFloats);
}

absl::Status GlooCommunicator::AllReduceSumHalf(uint16_t* data, size_t count, HalfType type) {
  return AllReduceWith(data, count, [type](uint16_t* dst, const uint16_t* src, size_t n) {
    AddHalves(dst, src, n, type);
  });
}

absl::Status GlooCommunicator::Broadcast(void* data, size_t bytes, int root) {
  {
    absl::MutexLock lock(&mu_);
    if (aborted_) return absl::AbortedError("communicator aborted");
  }
  if (world_size_ == 1 || bytes == 0) return absl::OkStatus();
  absl::Status status;
  try {
    const uint64_t slot = context_->nextSlot();
    std::unique_ptr<Buffer> buffer = Track(data, bytes);
    if (rank_ == root) {
      for (int r = 0; r < world_size_; ++r) {
        if (r != root) (*buffer)->send(r, slot);
      }
      for (int r = 0; r < world_size_ - 1 && status.ok(); ++r) {
        if (!WaitSend(buffer->get())) status = absl::AbortedError("aborted");
      }
    } else {
      (*buffer)->recv(root, slot);
      if (!WaitRecv(buffer->get())) status = absl::AbortedError("aborted");
    }
  } catch (const std::exception& e) {
    status = Failed("broadcast", e);
  }
  absl::MutexLock lock(&mu_);
  if (aborted_) return absl::AbortedError("gloo broadcast aborted");
  return status;
}

void GlooCommunicator::Abort() {
  {
    absl::MutexLock lock(&mu_);
    if (aborted_) return;
    aborted_ = true;
    for (auto* b : active_) {
      b->abortWaitSend();
      b->abortWaitRecv();
    }
  }
  // Peers blocked on this rank see the connections close and fail too,
  // instead of waiting for their timeout.
  context_->closeConnections();
}

}  // namespace ddp
