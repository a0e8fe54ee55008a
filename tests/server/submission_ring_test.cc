// Submission rings against an in-process CPU attnd (docs/SERVICE.md "Submission rings"): entries
// run in order with NaN-poisoned outputs, bad entries get the failure bit without stalling the
// ring, a head overrun errors the ring, slots rewritten while the poller reads never crash it or
// run anything but a validated copy, and a ring closes with CloseRing (entries taken still run),
// its region's unregistration and its lease; another owner gets NOT_FOUND.
#include <fcntl.h>
#include <sys/mman.h>
#include <unistd.h>

#include <atomic>
#include <chrono>
#include <cstring>
#include <initializer_list>
#include <memory>
#include <random>
#include <thread>
#include <tuple>
#include <vector>

#include "absl/strings/match.h"
#include "server/ops/prepared_calls.h"
#include "server/ops/stream_ordered.h"
#include "server/ops/submission_rings.h"
#include "tests/server/daemon_fixture.h"

namespace attnd::server::testing {
namespace {

namespace L = ops::ring_layout;
using std::chrono::milliseconds;

constexpr uint64_t kQ = 0, kKv = 128 << 10, kIdx = 512 << 10, kOut = 576 << 10, kLse = 704 << 10;
constexpr uint64_t kWords = 1 << 20;    // signal words: ready at +16k, done at +16k+8
constexpr uint64_t kRing = 1536 << 10;  // the ring, 64-byte aligned
constexpr uint64_t kFail = ops::kSignalFailureBit;

uint64_t ReadyAt(int k) { return kWords + 16 * k; }
uint64_t DoneAt(int k) { return kWords + 16 * k + 8; }

class SubmissionRingTest : public DaemonTest {
 protected:
  void SetUp() override {
    DaemonTest::SetUp();
    ASSERT_TRUE(shm_.ok());
    std::memset(shm_.data() + kWords, 0, 64 << 10);
    Register(stub_.get(), "r", shm_);
    std::memcpy(shm_.data() + kQ, q_.raw(), SpanBytes(q_));
    std::memcpy(shm_.data() + kKv, kv_.raw(), SpanBytes(kv_));
    std::memcpy(shm_.data() + kIdx, indices_.raw(), SpanBytes(indices_));
    Poison();
    call_ = Prepare(stub_.get());
  }

  static void Register(v1::Attention::Stub* stub, const std::string& name, const ScopedShm& shm,
                       const std::string& lease = "") {
    grpc::ClientContext ctx;
    v1::RegisterHostRegionRequest reg;
    reg.set_name(name);
    reg.set_key(shm.key());
    reg.set_byte_size(shm.size());
    reg.set_lease_id(lease);
    v1::RegisterRegionResponse r;
    grpc::Status s = stub->RegisterHostRegion(&ctx, reg, &r);
    ASSERT_TRUE(s.ok()) << s.error_message();
  }

  v1::SparseMlaRequest RegionRequest() {
    v1::SparseMlaRequest req;
    *req.mutable_q() = RegionTensor(q_, v1::DTYPE_BF16, shm_, "r", kQ);
    *req.mutable_kv() = RegionTensor(kv_, v1::DTYPE_BF16, shm_, "r", kKv);
    *req.mutable_indices() = RegionTensor(indices_, v1::DTYPE_I32, shm_, "r", kIdx);
    req.set_sm_scale(kScale);
    for (auto [field, off] : {std::pair<v1::Tensor*, uint64_t>{req.mutable_out(), kOut},
                              std::pair<v1::Tensor*, uint64_t>{req.mutable_lse(), kLse}}) {
      field->mutable_region()->set_region("r");
      field->mutable_region()->set_offset(off);
    }
    return req;
  }

  uint64_t Prepare(v1::Attention::Stub* stub) {
    v1::PrepareCallRequest prep;
    *prep.mutable_sparse_mla() = RegionRequest();
    v1::PrepareCallResponse prepared;
    grpc::ClientContext ctx;
    grpc::Status s = stub->PrepareCall(&ctx, prep, &prepared);
    EXPECT_TRUE(s.ok()) << s.error_message();
    return prepared.call_id();
  }

  grpc::Status OpenRing(v1::Attention::Stub* stub, const std::string& region, uint64_t offset,
                        uint32_t entries, uint64_t* id, const std::string& signals = "") {
    grpc::ClientContext ctx;
    v1::OpenRingRequest req;
    req.set_region(region);
    req.set_offset(offset);
    req.set_entries(entries);
    req.set_signal_region(signals);
    v1::OpenRingResponse resp;
    grpc::Status s = stub->OpenRing(&ctx, req, &resp);
    if (s.ok()) {
      *id = resp.ring_id();
      EXPECT_EQ(resp.byte_size(), L::Bytes(entries));
    }
    return s;
  }
  grpc::Status CloseRing(v1::Attention::Stub* stub, uint64_t id) {
    grpc::ClientContext ctx;
    v1::CloseRingRequest req;
    req.set_ring_id(id);
    v1::CloseRingResponse resp;
    return stub->CloseRing(&ctx, req, &resp);
  }

  void Poison() {
    std::memset(shm_.data() + kOut, 0xff, SpanBytes(want_out_));  // bf16/f32 NaN
    std::memset(shm_.data() + kLse, 0xff, SpanBytes(want_lse_));
  }
  bool OutputsPoisoned() const {
    const uint8_t* p = reinterpret_cast<const uint8_t*>(shm_.data() + kOut);
    for (size_t i = 0; i < SpanBytes(want_out_); ++i) {
      if (p[i] != 0xff) return false;
    }
    return true;
  }
  bool OutputsMatch() const {
    return std::memcmp(shm_.data() + kOut, want_out_.raw(), SpanBytes(want_out_)) == 0 &&
           std::memcmp(shm_.data() + kLse, want_lse_.raw(), SpanBytes(want_lse_)) == 0;
  }

  std::atomic<uint64_t>& Word(const ScopedShm& shm, uint64_t offset) {
    return *reinterpret_cast<std::atomic<uint64_t>*>(shm.data() + offset);
  }
  std::atomic<uint64_t>& Word(uint64_t offset) { return Word(shm_, offset); }
  // Waits up to `ms` for the word at `offset` to become nonzero; its value.
  uint64_t AwaitWord(const ScopedShm& shm, uint64_t offset, int ms) {
    for (int i = 0; i < ms; ++i) {
      const uint64_t v = Word(shm, offset).load(std::memory_order_acquire);
      if (v != 0) return v;
      std::this_thread::sleep_for(milliseconds(1));
    }
    return Word(shm, offset).load(std::memory_order_acquire);
  }
  uint64_t AwaitWord(uint64_t offset, int ms) { return AwaitWord(shm_, offset, ms); }
  bool AwaitEq(const ScopedShm& shm, uint64_t offset, uint64_t want, int ms) {
    for (int i = 0; i < ms; ++i) {
      if (Word(shm, offset).load(std::memory_order_acquire) == want) return true;
      std::this_thread::sleep_for(milliseconds(1));
    }
    return Word(shm, offset).load() == want;
  }

  // The client's side of one entry, written as docs/SERVICE.md says: fields, then seq, then
  // head. Returns the entry's number.
  struct Slot {
    uint64_t call_id = 0, ready_offset = 0, ready_value = 0, done_offset = 0, done_value = 0,
             flags = 0;
  };
  uint64_t Put(const ScopedShm& shm, uint64_t ring, uint32_t entries, const Slot& e,
               bool bump_head = true, uint64_t seq_delta = 0) {
    uint64_t& head = heads_[ring];
    const uint64_t at = ring + L::kHeaderBytes + (head & (entries - 1)) * L::kEntryBytes;
    Word(shm, at + L::kCallId).store(e.call_id, std::memory_order_relaxed);
    Word(shm, at + L::kReadyOffset).store(e.ready_offset, std::memory_order_relaxed);
    Word(shm, at + L::kReadyValue).store(e.ready_value, std::memory_order_relaxed);
    Word(shm, at + L::kDoneOffset).store(e.done_offset, std::memory_order_relaxed);
    Word(shm, at + L::kDoneValue).store(e.done_value, std::memory_order_relaxed);
    Word(shm, at + L::kFlags).store(e.flags, std::memory_order_relaxed);
    Word(shm, at + L::kSeq).store(head + 1 + seq_delta, std::memory_order_release);
    ++head;
    if (bump_head) Word(shm, ring + L::kHead).store(head, std::memory_order_release);
    return head - 1;
  }
  uint64_t Put(uint32_t entries, const Slot& e) { return Put(shm_, kRing, entries, e); }
  Slot Entry(int k, uint64_t value, bool ready = true) const {
    Slot e;
    e.call_id = call_;
    e.ready_offset = ReadyAt(k);
    e.ready_value = value;
    e.done_offset = DoneAt(k);
    e.done_value = value;
    e.flags = ready ? L::kFlagReady : 0;
    return e;
  }

  std::unique_ptr<v1::Attention::Stub> TcpStub() {
    return v1::Attention::NewStub(
        grpc::CreateChannel(daemon_->grpc_addresses()[1], grpc::InsecureChannelCredentials()));
  }

  ScopedShm shm_{2 << 20};
  uint64_t call_ = 0;
  std::map<uint64_t, uint64_t> heads_;
};

TEST_F(SubmissionRingTest, EntriesRunInOrderAndStoreDone) {
  uint64_t ring = 0;
  ASSERT_TRUE(OpenRing(stub_.get(), "r", kRing, 16, &ring).ok());
  EXPECT_EQ(Word(kRing + L::kState).load(), L::kOpen);
  constexpr int kN = 5;
  for (int k = 0; k < kN; ++k) Put(16, Entry(k, 10 + k));
  ASSERT_TRUE(AwaitEq(shm_, kRing + L::kTail, kN, 5000)) << "the poller took the entries";
  // The last entry's ready first: it still waits behind the earlier ones.
  Word(ReadyAt(kN - 1)).store(10 + kN - 1, std::memory_order_release);
  std::this_thread::sleep_for(milliseconds(100));
  EXPECT_TRUE(OutputsPoisoned());
  for (int k = 0; k < kN; ++k) EXPECT_EQ(Word(DoneAt(k)).load(), 0u) << k;
  Word(ReadyAt(0)).store(10, std::memory_order_release);
  EXPECT_EQ(AwaitWord(DoneAt(0), 5000), 10u);
  EXPECT_TRUE(OutputsMatch());
  std::this_thread::sleep_for(milliseconds(50));
  EXPECT_EQ(Word(DoneAt(1)).load(), 0u) << "entry 1 ran before its ready word";
  for (int k = 1; k < kN - 1; ++k) {
    Poison();
    Word(ReadyAt(k)).store(10 + k, std::memory_order_release);
    EXPECT_EQ(AwaitWord(DoneAt(k), 5000), static_cast<uint64_t>(10 + k));
    EXPECT_TRUE(OutputsMatch()) << k;
  }
  EXPECT_EQ(AwaitWord(DoneAt(kN - 1), 5000), static_cast<uint64_t>(10 + kN - 1));
  // Around the ring several times: no ready word (run at once).
  for (int k = 0; k < 40; ++k) {
    Poison();
    Word(DoneAt(k)).store(0);
    Put(16, Entry(k, 100 + k, /*ready=*/false));
    ASSERT_EQ(AwaitWord(DoneAt(k), 5000), static_cast<uint64_t>(100 + k));
    ASSERT_TRUE(OutputsMatch()) << k;
  }
  EXPECT_TRUE(CloseRing(stub_.get(), ring).ok());
  EXPECT_EQ(Word(kRing + L::kState).load(), L::kClosed);
  EXPECT_EQ(CloseRing(stub_.get(), ring).error_code(), grpc::StatusCode::NOT_FOUND);
}

TEST_F(SubmissionRingTest, BadEntriesGetTheFailureBitAndTheRingGoesOn) {
  uint64_t ring = 0;
  ASSERT_TRUE(OpenRing(stub_.get(), "r", kRing, 16, &ring).ok());
  auto tcp = TcpStub();  // another owner
  Slot unknown = Entry(0, 1, false);
  unknown.call_id = call_ + 1000;
  Put(16, unknown);
  Slot flags = Entry(1, 1, false);
  flags.flags = 6;
  Put(16, flags);
  Slot ready_out = Entry(2, 1, true);
  ready_out.ready_offset = shm_.size();  // past the region
  Put(16, ready_out);
  Slot misaligned = Entry(3, 1, false);
  misaligned.done_offset = DoneAt(3) + 4;  // no word there: nothing is written
  Put(16, misaligned);
  Slot done_out = Entry(4, 1, false);
  done_out.done_offset = ~0ull - 3;
  Put(16, done_out);
  // A slot whose seq is stale (not this lap's): refused.
  Put(shm_, kRing, 16, Entry(5, 1, false), true, /*seq_delta=*/16);
  // Then a good entry: it runs.
  Put(16, Entry(6, 77, false));
  EXPECT_EQ(AwaitWord(DoneAt(6), 5000), 77u);
  EXPECT_TRUE(OutputsMatch());
  for (int k : {0, 1, 2, 5}) EXPECT_EQ(Word(DoneAt(k)).load(), 1 | kFail) << k;
  EXPECT_EQ(Word(DoneAt(3)).load(), 0u);
  EXPECT_EQ(Word(DoneAt(3) + 8).load(), 0u);
  EXPECT_EQ(Word(DoneAt(4)).load(), 0u);
  EXPECT_EQ(Word(kRing + L::kTail).load(), 7u);
  EXPECT_EQ(Word(kRing + L::kState).load(), L::kOpen);
  // The other owner cannot close it, nor open a ring over a region it does not have.
  EXPECT_EQ(CloseRing(tcp.get(), ring).error_code(), grpc::StatusCode::NOT_FOUND);
  uint64_t other = 0;
  EXPECT_EQ(OpenRing(tcp.get(), "r", kRing, 16, &other).error_code(), grpc::StatusCode::NOT_FOUND);
  EXPECT_TRUE(CloseRing(stub_.get(), ring).ok());
}

// Values from the failure bit (2^62) up are refused like other bad entries (docs/SERVICE.md
// "Submission rings"): the done word gets the value with the failure bit and nothing runs. An
// entry without the ready flag ignores its ready value; 2^62 - 1 is the largest value that runs.
TEST_F(SubmissionRingTest, EntriesWithValuesFromTheFailureBitUpAreRefused) {
  constexpr uint64_t kBit = uint64_t{1} << 62;
  static_assert(kFail == kBit);
  uint64_t ring = 0;
  ASSERT_TRUE(OpenRing(stub_.get(), "r", kRing, 16, &ring).ok());
  std::mt19937_64 rng = attnd::testing::MakeRng();
  const uint64_t random_high = kBit + rng() % (~0ull - kBit);
  Slot done_bit = Entry(0, kBit + 5, false);
  Put(16, done_bit);
  Slot done_top = Entry(1, random_high, false);
  Put(16, done_top);
  Slot ready_bit = Entry(2, 11, true);
  ready_bit.ready_value = kBit;
  Put(16, ready_bit);
  Slot ready_top = Entry(3, 12, true);
  ready_top.ready_value = ~0ull;
  Put(16, ready_top);
  for (int k = 0; k < 4; ++k) Word(ReadyAt(k)).store(~0ull, std::memory_order_release);
  ASSERT_TRUE(AwaitEq(shm_, kRing + L::kTail, 4, 5000)) << "the poller took the entries";
  // The tail moves past an entry before the entry is refused: the last refusal's store.
  EXPECT_EQ(AwaitWord(DoneAt(3), 5000), 12 | kFail);
  std::this_thread::sleep_for(milliseconds(50));
  EXPECT_TRUE(OutputsPoisoned()) << "a refused entry ran";
  EXPECT_EQ(Word(DoneAt(0)).load(), kBit + 5);  // already has the bit: stored as it is
  EXPECT_EQ(Word(DoneAt(1)).load(), random_high | kFail);
  EXPECT_EQ(Word(DoneAt(2)).load(), 11 | kFail);
  EXPECT_EQ(Word(DoneAt(3)).load(), 12 | kFail);
  // No ready flag: the ready value is not looked at.
  Slot unflagged = Entry(4, 13, false);
  unflagged.ready_value = ~0ull;
  Put(16, unflagged);
  EXPECT_EQ(AwaitWord(DoneAt(4), 5000), 13u);
  EXPECT_TRUE(OutputsMatch());
  Poison();
  Put(16, Entry(5, kBit - 1, true));
  std::this_thread::sleep_for(milliseconds(20));
  EXPECT_TRUE(OutputsPoisoned());
  Word(ReadyAt(5)).store(kBit - 1, std::memory_order_release);
  EXPECT_EQ(AwaitWord(DoneAt(5), 5000), kBit - 1);
  EXPECT_TRUE(OutputsMatch());
  EXPECT_EQ(Word(kRing + L::kState).load(), L::kOpen);
  EXPECT_TRUE(CloseRing(stub_.get(), ring).ok());
}

// A registry (client shm allowed) with `shm` registered as region "s" of each of `owners`.
std::unique_ptr<regions::RegionRegistry> RegistryWith(const ScopedShm& shm,
                                                      std::initializer_list<const char*> owners) {
  regions::RegionRegistry::Options ro;
  ro.allow_client_shm = true;
  auto registry = std::make_unique<regions::RegionRegistry>(ro);
  for (const char* owner : owners) {
    regions::HostRegionSpec spec;
    spec.name = "s";
    spec.key = shm.key();
    spec.byte_size = shm.size();
    spec.owner = owner;
    EXPECT_TRUE(registry->RegisterHost(spec).ok());
  }
  return registry;
}

// The ring table alone, with two owners of one object: a ring's submitter finds calls in its
// owner's namespace only (as the service's does, PreparedCallTable::Find), so another owner's
// call id is refused like an unknown one; the failure bit goes to the entry's done word.
TEST(SubmissionRingTableTest, ForeignCallIdIsRefusedAndOwnersAreSeparate) {
  ScopedShm shm(1 << 20);
  ASSERT_TRUE(shm.ok());
  const auto registry = RegistryWith(shm, {"uid:a", "uid:b"});
  ops::PreparedCallTable calls(nullptr, {});
  ops::PreparedCallEntry theirs;
  theirs.owner = "uid:b";
  const uint64_t foreign = *calls.Add(std::move(theirs));
  ops::PreparedCallEntry mine;
  mine.owner = "uid:a";
  const uint64_t own = *calls.Add(std::move(mine));
  std::vector<uint64_t> submitted;
  absl::Mutex mu;
  ops::SubmissionRingTable table(registry.get(), nullptr, {});
  ops::SubmissionRingTable::Spec spec;
  spec.owner = "uid:a";
  spec.region = "s";
  spec.offset = 0;
  spec.entries = 4;
  spec.submit = [&](uint64_t call_id, const v1::Signal* ready,
                    const v1::Signal& done) -> absl::Status {
    EXPECT_EQ(ready, nullptr);
    EXPECT_EQ(done.slice().region(), "s");
    absl::StatusOr<std::shared_ptr<const ops::PreparedCallEntry>> e = calls.Find("uid:a", call_id);
    if (!e.ok()) return e.status();
    absl::MutexLock lock(&mu);
    submitted.push_back(call_id);
    return absl::OkStatus();
  };
  absl::StatusOr<uint64_t> ring = table.Open(spec);
  ASSERT_TRUE(ring.ok()) << ring.status();
  EXPECT_EQ(table.Close("uid:b", *ring).code(), absl::StatusCode::kNotFound);
  auto word = [&](uint64_t off) -> std::atomic<uint64_t>& {
    return *reinterpret_cast<std::atomic<uint64_t>*>(shm.data() + off);
  };
  const uint64_t slot0 = L::kHeaderBytes, slot1 = L::kHeaderBytes + L::kEntryBytes;
  for (auto [slot, id, n] : {std::tuple<uint64_t, uint64_t, uint64_t>{slot0, foreign, 0},
                             std::tuple<uint64_t, uint64_t, uint64_t>{slot1, own, 1}}) {
    word(slot + L::kCallId).store(id);
    word(slot + L::kDoneOffset).store(4096 + 8 * n);
    word(slot + L::kDoneValue).store(5);
    word(slot + L::kSeq).store(n + 1, std::memory_order_release);
  }
  word(L::kHead).store(2, std::memory_order_release);
  for (int i = 0; i < 5000 && word(L::kTail).load() != 2; ++i) {
    std::this_thread::sleep_for(milliseconds(1));
  }
  EXPECT_EQ(word(L::kTail).load(), 2u);
  EXPECT_EQ(word(4096).load(), 5 | kFail) << "the foreign id's done word";
  EXPECT_EQ(word(4104).load(), 0u) << "a submitted call's done is the runner's to store";
  {
    // The poller moves the tail past an entry before it submits it: wait for the submit.
    absl::MutexLock lock(&mu);
    mu.AwaitWithTimeout(absl::Condition(
                            +[](std::vector<uint64_t>* s) { return !s->empty(); }, &submitted),
                        absl::Seconds(10));
    EXPECT_EQ(submitted, std::vector<uint64_t>{own});
  }
  EXPECT_EQ(table.open(), 1);
  table.DropRegions("uid:b", {"s"});  // another owner's region of that name: not this ring
  EXPECT_EQ(table.open(), 1);
  table.DropRegions("uid:a", {"s"});
  EXPECT_EQ(table.open(), 0);
  EXPECT_EQ(word(L::kState).load(), L::kClosed);
  EXPECT_EQ(table.closed_reason("uid:a", *ring), "a region it uses was unregistered");
  // CloseRing of the ring the daemon closed: NOT_FOUND saying why; another owner's: unknown.
  const absl::Status again = table.Close("uid:a", *ring);
  EXPECT_EQ(again.code(), absl::StatusCode::kNotFound);
  EXPECT_NE(again.message().find("closed already: a region it uses was unregistered"),
            std::string::npos)
      << again;
  const absl::Status other = table.Close("uid:b", *ring);
  EXPECT_EQ(other.code(), absl::StatusCode::kNotFound);
  EXPECT_EQ(other.message().find("closed already"), std::string::npos) << other;
}

TEST(SubmissionRingTableTest, RingsPerOwnerAreBoundedAndGoWithTheirLease) {
  ScopedShm shm(1 << 20);
  ASSERT_TRUE(shm.ok());
  const auto registry = RegistryWith(shm, {"uid:a"});
  ops::SubmissionRingTable::Options options;
  options.max_per_owner = 2;
  ops::SubmissionRingTable table(registry.get(), nullptr, options);
  auto spec = [](uint64_t offset, const std::string& lease) {
    ops::SubmissionRingTable::Spec s;
    s.owner = "uid:a";
    s.lease = lease;
    s.region = "s";
    s.offset = offset;
    s.entries = 2;
    s.submit = [](uint64_t, const v1::Signal*, const v1::Signal&) { return absl::OkStatus(); };
    return s;
  };
  ASSERT_TRUE(table.Open(spec(0, "lease-1")).ok());
  ASSERT_TRUE(table.Open(spec(4096, "lease-1")).ok());
  EXPECT_EQ(table.Open(spec(8192, "")).status().code(), absl::StatusCode::kResourceExhausted);
  table.DropLease("lease-2");
  EXPECT_EQ(table.open(), 2);
  table.DropLease("lease-1");
  EXPECT_EQ(table.open(), 0);
  for (uint64_t at : {0, 4096}) {
    EXPECT_EQ(reinterpret_cast<std::atomic<uint64_t>*>(shm.data() + at + L::kState)->load(),
              L::kClosed);
  }
  EXPECT_TRUE(table.Open(spec(8192, "")).ok());
}

// A ring the poller closed itself (here inside a sweep, as an unregistration completing on the
// poller thread does) is out of the table before its pins are released at the sweep's end:
// DropLease, which the service calls as a lease ends, returns only once that ring is shut down
// too, so the lease's regions are unpinned (and unmapped) when the lease closes. Before, it
// returned at once and the region stayed mapped until the poller got round to it (a session
// fuzz input found it under load: "nothing mapped once the session closed").
TEST(SubmissionRingTableTest, DropLeaseWaitsForRingsThePollerClosed) {
  ScopedShm shm(1 << 20);
  ASSERT_TRUE(shm.ok());
  const auto registry = RegistryWith(shm, {"uid:a"});
  ops::SubmissionRingTable table(registry.get(), nullptr, {});
  std::atomic<bool> closed_in_sweep{false};
  ops::SubmissionRingTable::Spec spec;
  spec.owner = "uid:a";
  spec.lease = "lease-1";
  spec.region = "s";
  spec.offset = 0;
  spec.entries = 4;
  spec.submit = [&](uint64_t, const v1::Signal*, const v1::Signal&) -> absl::Status {
    table.DropRegions("uid:a", {"s"});  // closed inside the sweep: shut down at its end
    closed_in_sweep.store(true);
    std::this_thread::sleep_for(milliseconds(50));  // the sweep goes on a while
    return absl::OkStatus();
  };
  ASSERT_TRUE(table.Open(spec).ok());
  auto word = [&](uint64_t off) -> std::atomic<uint64_t>& {
    return *reinterpret_cast<std::atomic<uint64_t>*>(shm.data() + off);
  };
  word(L::kHeaderBytes + L::kCallId).store(1);
  word(L::kHeaderBytes + L::kDoneOffset).store(4096);
  word(L::kHeaderBytes + L::kDoneValue).store(1);
  word(L::kHeaderBytes + L::kSeq).store(1, std::memory_order_release);
  word(L::kHead).store(1, std::memory_order_release);
  for (int i = 0; i < 5000 && !closed_in_sweep.load(); ++i) {
    std::this_thread::sleep_for(milliseconds(1));
  }
  ASSERT_TRUE(closed_in_sweep.load());
  EXPECT_EQ(table.open(), 0);  // out of the table already, its pins not yet released
  table.DropLease("lease-1");
  EXPECT_EQ(word(L::kState).load(), L::kClosed) << "shut down before DropLease returned";
  bool unpinned = false;
  ASSERT_TRUE(
      registry
          ->UnregisterAsync("uid:a", "s", "", [&](std::vector<std::string>) { unpinned = true; })
          .ok());
  EXPECT_TRUE(unpinned) << "no pin left: the region went at once";
}

TEST_F(SubmissionRingTest, OpenRefusesBadRings) {
  uint64_t id = 0;
  EXPECT_EQ(OpenRing(stub_.get(), "r", kRing, 3, &id).error_code(),
            grpc::StatusCode::INVALID_ARGUMENT);
  EXPECT_EQ(OpenRing(stub_.get(), "r", kRing, 0, &id).error_code(),
            grpc::StatusCode::INVALID_ARGUMENT);
  EXPECT_EQ(OpenRing(stub_.get(), "r", kRing, 8192, &id).error_code(),
            grpc::StatusCode::INVALID_ARGUMENT);
  EXPECT_EQ(OpenRing(stub_.get(), "r", kRing + 32, 16, &id).error_code(),
            grpc::StatusCode::INVALID_ARGUMENT);
  EXPECT_EQ(OpenRing(stub_.get(), "r", shm_.size() - 256, 16, &id).error_code(),
            grpc::StatusCode::INVALID_ARGUMENT);
  EXPECT_EQ(OpenRing(stub_.get(), "r", ~0ull - 63, 16, &id).error_code(),
            grpc::StatusCode::INVALID_ARGUMENT);
  EXPECT_EQ(OpenRing(stub_.get(), "nope", kRing, 16, &id).error_code(),
            grpc::StatusCode::NOT_FOUND);
  EXPECT_EQ(OpenRing(stub_.get(), "r", kRing, 16, &id, "nope").error_code(),
            grpc::StatusCode::NOT_FOUND);
  grpc::ClientContext ctx;
  v1::OpenRingRequest req;
  req.set_region("r");
  req.set_offset(kRing);
  req.set_entries(16);
  req.set_lease_id("lease-nope");
  v1::OpenRingResponse resp;
  EXPECT_EQ(stub_->OpenRing(&ctx, req, &resp).error_code(), grpc::StatusCode::NOT_FOUND);
}

TEST_F(SubmissionRingTest, HeadOverrunErrorsTheRingOnly) {
  ScopedShm other(1 << 20);
  ASSERT_TRUE(other.ok());
  Register(stub_.get(), "o", other);
  uint64_t bad = 0, good = 0;
  ASSERT_TRUE(OpenRing(stub_.get(), "o", 0, 8, &bad, "r").ok());
  ASSERT_TRUE(OpenRing(stub_.get(), "r", kRing, 8, &good).ok());
  Word(other, L::kHead).store(9, std::memory_order_release);  // 9 > 8 entries past tail 0
  EXPECT_TRUE(AwaitEq(other, L::kState, L::kErrored, 5000));
  EXPECT_EQ(Word(other, L::kTail).load(), 0u);
  EXPECT_EQ(CloseRing(stub_.get(), bad).error_code(), grpc::StatusCode::NOT_FOUND);
  // The other ring is unaffected.
  Put(8, Entry(0, 5, false));
  EXPECT_EQ(AwaitWord(DoneAt(0), 5000), 5u);
  EXPECT_TRUE(OutputsMatch());
  // A head that goes backwards is the same error.
  Word(kRing + L::kHead).store(0, std::memory_order_release);
  EXPECT_TRUE(AwaitEq(shm_, kRing + L::kState, L::kErrored, 5000));
}

TEST_F(SubmissionRingTest, SlotsRewrittenWhileThePollerReadsThemAreHarmless) {
  uint64_t ring = 0;
  constexpr uint32_t kEntries = 64;
  ASSERT_TRUE(OpenRing(stub_.get(), "r", kRing, kEntries, &ring).ok());
  // The client writes valid entries (done words DoneAt(k), k < 32) while a second thread flips
  // their fields under the poller. The words at DoneAt(k) + 8 (= ReadyAt(k + 1)) are canaries
  // that only a store through an unvalidated (misaligned) offset could touch.
  std::atomic<bool> stop{false};
  std::atomic<uint64_t> seq_hint{1};
  std::thread flipper([&] {
    std::mt19937_64 rng(1234);
    while (!stop.load(std::memory_order_relaxed)) {
      const uint64_t slot = kRing + L::kHeaderBytes + (rng() % kEntries) * L::kEntryBytes;
      const uint64_t field = (rng() % 6) * 8;  // seq .. done_value (flags stay 0: no waits)
      uint64_t v = rng();
      switch (rng() % 6) {
        case 0: v = call_; break;                        // a real call id
        case 1: v = DoneAt(rng() % 32); break;           // a valid done word
        case 2: v = DoneAt(rng() % 32) + 4; break;       // misaligned
        case 3: v = seq_hint.load() + rng() % 4; break;  // a plausible seq
        default: break;                                  // garbage
      }
      Word(slot + field).store(v, std::memory_order_relaxed);
    }
  });
  for (int lap = 0; lap < 8; ++lap) {
    for (uint32_t i = 0; i < kEntries; ++i) {
      const int k = static_cast<int>(i % 32);
      Slot e = Entry(k, 1000 + k, /*ready=*/false);
      Put(shm_, kRing, kEntries, e, /*bump_head=*/i + 1 == kEntries);
      seq_hint.store(heads_[kRing]);
    }
    ASSERT_TRUE(AwaitEq(shm_, kRing + L::kTail, heads_[kRing], 10000)) << "lap " << lap;
  }
  stop = true;
  flipper.join();
  // Wait for the calls the storm queued to be over: one more entry, on the same ordered queue,
  // ends only after them (its done word, DoneAt(41), is no storm entry's).
  Word(DoneAt(41)).store(0);
  Put(kEntries, Entry(41, 4141, false));
  EXPECT_EQ(AwaitWord(DoneAt(41), 60000) & ~kFail, 4141u);
  for (int k = 0; k < 32; ++k) {
    const uint64_t canary = Word(ReadyAt(k + 1)).load();
    EXPECT_EQ(canary, 0u) << "word DoneAt(" << k << ") + 8 was written";
  }
  // The daemon and the ring still work (the storm may have stored done words over the inputs:
  // they are written again).
  ASSERT_EQ(Word(kRing + L::kState).load(), L::kOpen);
  std::memcpy(shm_.data() + kQ, q_.raw(), SpanBytes(q_));
  std::memcpy(shm_.data() + kKv, kv_.raw(), SpanBytes(kv_));
  std::memcpy(shm_.data() + kIdx, indices_.raw(), SpanBytes(indices_));
  Poison();
  Word(DoneAt(40)).store(0);
  Put(kEntries, Entry(40, 4242, false));
  EXPECT_EQ(AwaitWord(DoneAt(40), 5000), 4242u);
  EXPECT_TRUE(OutputsMatch());
  grpc::ClientContext ctx;
  v1::GetInfoResponse info;
  EXPECT_TRUE(stub_->GetInfo(&ctx, v1::GetInfoRequest(), &info).ok());
}

TEST_F(SubmissionRingTest, CloseStopsPollingAndTakenEntriesStillRun) {
  uint64_t ring = 0;
  ASSERT_TRUE(OpenRing(stub_.get(), "r", kRing, 16, &ring).ok());
  Put(16, Entry(0, 3));
  ASSERT_TRUE(AwaitEq(shm_, kRing + L::kTail, 1, 5000));
  ASSERT_TRUE(CloseRing(stub_.get(), ring).ok());
  EXPECT_EQ(Word(kRing + L::kState).load(), L::kClosed);
  Put(16, Entry(1, 4, false));  // after the close: never taken
  Word(ReadyAt(0)).store(3, std::memory_order_release);
  EXPECT_EQ(AwaitWord(DoneAt(0), 5000), 3u);
  EXPECT_TRUE(OutputsMatch());
  std::this_thread::sleep_for(milliseconds(100));
  EXPECT_EQ(Word(kRing + L::kTail).load(), 1u);
  EXPECT_EQ(Word(DoneAt(1)).load(), 0u);
}

TEST_F(SubmissionRingTest, TheBeatWordMovesWhileTheRingIsPolledOnly) {
  // A stale beat from before: OpenRing resets it.
  Word(kRing + L::kBeat).store(777, std::memory_order_release);
  uint64_t ring = 0;
  ASSERT_TRUE(OpenRing(stub_.get(), "r", kRing, 16, &ring).ok());
  uint64_t first = 0;
  for (int i = 0; i < 5000 && (first == 0 || first == 777); ++i) {
    std::this_thread::sleep_for(milliseconds(1));
    first = Word(kRing + L::kBeat).load(std::memory_order_acquire);
  }
  ASSERT_NE(first, 0u);
  ASSERT_LT(first, 777u) << "counted from 0 again";
  std::this_thread::sleep_for(milliseconds(30));
  uint64_t later = Word(kRing + L::kBeat).load();
  // A poller descheduled for the whole 30 ms on a loaded machine: look a while longer.
  for (int i = 0; i < 5000 && later == first; ++i) {
    std::this_thread::sleep_for(milliseconds(1));
    later = Word(kRing + L::kBeat).load();
  }
  EXPECT_GT(later, first) << "at least every " << L::kBeatPeriod << " while the poller backs off";
  EXPECT_LT(later, 1000u) << "not faster than every " << L::kBeatPeriod;
  ASSERT_TRUE(CloseRing(stub_.get(), ring).ok());
  const uint64_t closed = Word(kRing + L::kBeat).load();
  std::this_thread::sleep_for(milliseconds(30));
  EXPECT_EQ(Word(kRing + L::kBeat).load(), closed) << "no beat once the ring is closed";
}

TEST_F(SubmissionRingTest, UnregisteringItsRegionClosesTheRing) {
  ScopedShm other(1 << 20);
  ASSERT_TRUE(other.ok());
  Register(stub_.get(), "o", other);
  uint64_t ring = 0;
  ASSERT_TRUE(OpenRing(stub_.get(), "o", 0, 8, &ring, "r").ok());
  Put(other, 0, 8, Entry(0, 1, false));
  EXPECT_EQ(AwaitWord(DoneAt(0), 5000), 1u);
  // The unregistration completes (the ring's pin goes), and the ring says closed.
  grpc::ClientContext ctx;
  ctx.set_deadline(std::chrono::system_clock::now() + std::chrono::seconds(10));
  v1::UnregisterRegionRequest un;
  un.set_name("o");
  v1::UnregisterRegionResponse ur;
  ASSERT_TRUE(stub_->UnregisterRegion(&ctx, un, &ur).ok());
  EXPECT_EQ(Word(other, L::kState).load(), L::kClosed);
  EXPECT_EQ(CloseRing(stub_.get(), ring).error_code(), grpc::StatusCode::NOT_FOUND);
  // The signal region's unregistration (all unleased regions at once) closes a ring too.
  Register(stub_.get(), "o", other);
  ASSERT_TRUE(OpenRing(stub_.get(), "o", 0, 8, &ring, "r").ok());
  grpc::ClientContext ctx2;
  ctx2.set_deadline(std::chrono::system_clock::now() + std::chrono::seconds(10));
  un.set_name("");
  ASSERT_TRUE(stub_->UnregisterRegion(&ctx2, un, &ur).ok());
  EXPECT_EQ(Word(other, L::kState).load(), L::kClosed);
}

TEST_F(SubmissionRingTest, TruncatedRingRegionErrorsTheRingNotTheDaemon) {
  ScopedShm other(1 << 20);
  ASSERT_TRUE(other.ok());
  Register(stub_.get(), "o", other);
  uint64_t ring = 0;
  ASSERT_TRUE(OpenRing(stub_.get(), "o", 0, 8, &ring, "r").ok());
  Put(other, 0, 8, Entry(0, 2, false));
  EXPECT_EQ(AwaitWord(DoneAt(0), 5000), 2u);
  // The owner shrinks the object under the ring (this process no longer touches `other`).
  const int fd = shm_open(other.key().c_str(), O_RDWR, 0);
  ASSERT_GE(fd, 0);
  ASSERT_EQ(ftruncate(fd, 0), 0);
  close(fd);
  bool closed = false;
  for (int i = 0; i < 5000 && !closed; ++i) {
    closed = CloseRing(stub_.get(), ring).error_code() == grpc::StatusCode::NOT_FOUND;
    if (!closed) std::this_thread::sleep_for(milliseconds(1));
  }
  EXPECT_TRUE(closed) << "the ring over the truncated object was not errored";
  // Everything else goes on.
  uint64_t good = 0;
  ASSERT_TRUE(OpenRing(stub_.get(), "r", kRing, 8, &good).ok());
  Put(8, Entry(1, 3, false));
  EXPECT_EQ(AwaitWord(DoneAt(1), 5000), 3u);
  EXPECT_TRUE(OutputsMatch());
}

TEST_F(SubmissionRingTest, SessionRingRunsOnTheSessionAndEndsWithItsLease) {
  uint64_t ring = 0;
  grpc::ClientContext ctx;
  auto a = stub_->Session(&ctx);
  v1::SessionRequest m;
  m.set_request_id(1);
  m.mutable_open();
  ASSERT_TRUE(a->Write(m));
  v1::SessionResponse resp;
  ASSERT_TRUE(a->Read(&resp));
  m.Clear();
  m.set_request_id(2);
  m.mutable_open_ring()->set_region("r");
  m.mutable_open_ring()->set_offset(kRing);
  m.mutable_open_ring()->set_entries(16);
  ASSERT_TRUE(a->Write(m));
  ASSERT_TRUE(a->Read(&resp));
  ASSERT_EQ(resp.code(), 0) << resp.message();
  ASSERT_TRUE(resp.has_open_ring());
  ring = resp.open_ring().ring_id();
  Put(16, Entry(0, 8, false));
  EXPECT_EQ(AwaitWord(DoneAt(0), 5000), 8u);
  EXPECT_TRUE(OutputsMatch());
  // A pending entry, then the Session dies: the ring closes, the call fails with the bit.
  Put(16, Entry(1, 9));
  ASSERT_TRUE(AwaitEq(shm_, kRing + L::kTail, 2, 5000));
  ctx.TryCancel();
  EXPECT_TRUE(AwaitEq(shm_, kRing + L::kState, L::kClosed, 5000));
  EXPECT_EQ(AwaitWord(DoneAt(1), 5000), 9 | kFail);
  EXPECT_EQ(CloseRing(stub_.get(), ring).error_code(), grpc::StatusCode::NOT_FOUND);
}

TEST_F(SubmissionRingTest, UnaryRingUnderASessionLeaseEndsWithIt) {
  grpc::ClientContext ctx;
  auto a = stub_->Session(&ctx);
  v1::SessionRequest m;
  m.set_request_id(1);
  m.mutable_open();
  ASSERT_TRUE(a->Write(m));
  v1::SessionResponse resp;
  ASSERT_TRUE(a->Read(&resp));
  grpc::ClientContext uctx;
  v1::OpenRingRequest req;
  req.set_region("r");
  req.set_offset(kRing);
  req.set_entries(8);
  req.set_lease_id(resp.opened().lease_id());
  v1::OpenRingResponse opened;
  ASSERT_TRUE(stub_->OpenRing(&uctx, req, &opened).ok());
  Put(8, Entry(0, 6, false));
  EXPECT_EQ(AwaitWord(DoneAt(0), 5000), 6u);
  a->WritesDone();
  EXPECT_TRUE(a->Finish().ok());
  EXPECT_TRUE(AwaitEq(shm_, kRing + L::kState, L::kClosed, 5000));
  EXPECT_EQ(CloseRing(stub_.get(), opened.ring_id()).error_code(), grpc::StatusCode::NOT_FOUND);
}

TEST_F(SubmissionRingTest, SessionCloseRingMessage) {
  grpc::ClientContext ctx;
  auto a = stub_->Session(&ctx);
  v1::SessionRequest m;
  m.set_request_id(1);
  m.mutable_open();
  ASSERT_TRUE(a->Write(m));
  v1::SessionResponse resp;
  ASSERT_TRUE(a->Read(&resp));
  m.Clear();
  m.set_request_id(2);
  m.mutable_open_ring()->set_region("r");
  m.mutable_open_ring()->set_offset(kRing);
  m.mutable_open_ring()->set_entries(4);
  ASSERT_TRUE(a->Write(m));
  ASSERT_TRUE(a->Read(&resp));
  ASSERT_EQ(resp.code(), 0) << resp.message();
  m.Clear();
  m.set_request_id(3);
  m.mutable_close_ring()->set_ring_id(resp.open_ring().ring_id());
  ASSERT_TRUE(a->Write(m));
  ASSERT_TRUE(a->Read(&resp));
  EXPECT_EQ(resp.code(), 0) << resp.message();
  EXPECT_TRUE(resp.has_close_ring());
  EXPECT_EQ(Word(kRing + L::kState).load(), L::kClosed);
  m.set_request_id(4);
  ASSERT_TRUE(a->Write(m));
  ASSERT_TRUE(a->Read(&resp));
  EXPECT_EQ(resp.code(), static_cast<int>(grpc::StatusCode::NOT_FOUND));
  a->WritesDone();
  EXPECT_TRUE(a->Finish().ok());
}

}  // namespace
}  // namespace attnd::server::testing
