// The target's rules, one at a time, against a fake fabric whose windows the test
// opens, drains and inspects: placement through per-slot windows, distinct-byte
// counting, the verdict and when it is told, generations, expiry and the fallback
// query.
#include "agent/transfer/landing.h"

#include <sys/mman.h>
#include <unistd.h>

#include <map>
#include <thread>
#include <utility>
#include <vector>

#include "absl/functional/any_invocable.h"
#include "absl/synchronization/mutex.h"
#include "absl/synchronization/notification.h"
#include "agent/common/status_macros.h"
#include "agent/transfer/imm.h"
#include "agent/transfer/verdict.h"
#include "gtest/gtest.h"

namespace fuselink::transfer {
namespace {

// Windows as records; a close drains at once unless `hold_drains`, when the test
// runs the drain itself (a write still placing).
class FakeFabric final : public fabric::Fabric {
 public:
  struct Window {
    fabric::RegionKey region;
    std::string peer;
    std::vector<fabric::Extent> extents;
    bool open = true;
  };

  absl::string_view transport() const override { return "fake"; }
  int nic_count() const override { return 4; }
  std::vector<fabric::Endpoint> endpoints() const override { return {}; }
  absl::StatusOr<fabric::RegionKey> RegisterRegion(void*, uint64_t,
                                                   std::shared_ptr<const void>) override {
    return next_region_++;
  }
  absl::Status DeregisterRegion(fabric::RegionKey) override { return absl::OkStatus(); }
  absl::StatusOr<fabric::WindowKey> OpenWindow(
      fabric::RegionKey region, absl::string_view peer,
      std::span<const fabric::Extent> extents) override {
    if (fail_open || opens_left == 0) {
      return absl::ResourceExhaustedError("no windows left");
    }
    if (opens_left > 0) --opens_left;
    const fabric::WindowKey key = next_window_++;
    windows[key] = Window{region, std::string(peer), {extents.begin(), extents.end()}};
    return key;
  }
  bool OpenWindowMayWait() const override { return false; }
  void CloseWindow(fabric::WindowKey key,
                   absl::AnyInvocable<void() &&> drained) override {
    windows[key].open = false;
    if (hold_drains) {
      held.push_back(std::move(drained));
    } else {
      std::move(drained)();
    }
  }
  absl::StatusOr<fabric::PeerId> Connect(absl::string_view,
                                         const std::vector<fabric::Endpoint>&) override {
    return 1;
  }
  void Disconnect(fabric::PeerId) override {}
  void CancelConnects() override {}
  std::string PeerName(fabric::PeerId) const override { return "node-a"; }
  std::optional<fabric::PeerId> FindPeer(absl::string_view) const override {
    return std::nullopt;
  }
  absl::Status PostWrite(fabric::PeerId, int, const fabric::WriteOp&) override {
    return absl::OkStatus();
  }
  fabric::NicCounters counters(int) const override { return {}; }

  void RunHeldDrains() {
    auto drains = std::move(held);
    held.clear();
    for (auto& d : drains) std::move(d)();
  }

  std::map<fabric::WindowKey, Window> windows;
  bool hold_drains = false;
  bool fail_open = false;
  int opens_left = -1;  // windows that open before the next fails; -1: all
  std::vector<absl::AnyInvocable<void() &&>> held;

 private:
  fabric::RegionKey next_region_ = 1;
  fabric::WindowKey next_window_ = 100;
};

constexpr uint32_t kLayers = 2;
constexpr uint32_t kBlocks = 8;
constexpr uint64_t kBlockBytes = 4096;

class LandingTest : public ::testing::Test {
 protected:
  void SetUp() override {
    UniqueFd fd(memfd_create("kv", MFD_CLOEXEC | MFD_ALLOW_SEALING));
    ASSERT_EQ(ftruncate(fd.get(), kLayers * kBlocks * kBlockBytes), 0);
    memory::TensorInfo want;
    want.name = "kv";
    want.layout = memory::Layout{kLayers, kBlocks, kBlockBytes, 0, 0};
    ASSERT_TRUE(registry_
                    .RegisterHost(std::move(want), std::move(fd), 0,
                                  kLayers * kBlocks * kBlockBytes)
                    .ok());
    LandingOptions options;
    options.idle_timeout = absl::Seconds(30);
    options.commit_grace = absl::Seconds(2);
    MakeLanding(options);
  }
  void MakeLanding(LandingOptions options) {
    landing_ = std::make_unique<Landing>(
        &registry_, &fabric_, 4,
        [this](const v1::WatchEvent& e) { events_.push_back(e); },
        [this](const std::string& node, uint32_t imm) {
          notices_.emplace_back(node, imm);
        },
        [this](uint32_t mask) { idle_.push_back(mask); }, options);
  }

  // Blocks {1, 2} (contiguous) and 5 of both layers, from node-a on rail 0.
  v1::PrepareIncomingRequest Request(const std::string& transfer_id = "t1") const {
    v1::PrepareIncomingRequest r;
    r.set_source_node("node-a");
    r.set_transfer_id(transfer_id);
    r.set_tensor("kv");
    for (uint32_t b : {5u, 1u, 2u}) r.add_block_ids(b);
    r.set_layer_begin(0);
    r.set_layer_end(kLayers);
    r.set_block_bytes(kBlockBytes);
    r.set_total_bytes(3 * kLayers * kBlockBytes);
    r.set_source_nic(0);
    return r;
  }

  struct Prepared {
    SlotId slot;
    fabric::WindowKey window;
  };
  Prepared Prepare(const std::string& transfer_id = "t1") {
    absl::StatusOr<v1::PrepareIncomingResponse> r =
        landing_->Prepare(Request(transfer_id));
    EXPECT_TRUE(r.ok()) << r.status();
    if (!r.ok()) return {};
    return Prepared{SlotId::Unpack(r->slot()), r->window_keys(0)};
  }

  static uint64_t Offset(uint32_t layer, uint32_t block) {
    return (uint64_t{layer} * kBlocks + block) * kBlockBytes;
  }
  void Data(const Prepared& p, uint64_t offset, uint32_t bytes, int nic = 0,
            const char* peer = "node-a") {
    landing_->OnArrival(fabric::Arrival{.peer = 1,
                                        .peer_name = peer,
                                        .nic = nic,
                                        .window = p.window,
                                        .offset = offset,
                                        .bytes = bytes,
                                        .imm = EncodeImm(p.slot, ImmOp::kData)});
  }
  void Notice(const Prepared& p, ImmOp op) {
    landing_->OnArrival(
        fabric::Arrival{.peer = 1, .peer_name = "node-a", .imm = EncodeImm(p.slot, op)});
  }
  // Every byte of the transfer, block by block.
  void AllData(const Prepared& p) {
    for (uint32_t layer = 0; layer < kLayers; ++layer) {
      Data(p, Offset(layer, 1), 2 * kBlockBytes);
      Data(p, Offset(layer, 5), kBlockBytes);
    }
  }
  uint8_t VerdictTold() const {
    EXPECT_FALSE(notices_.empty());
    if (notices_.empty()) return 0xee;
    EXPECT_EQ(notices_.back().first, "node-a");
    return DecodeVerdict(notices_.back().second).verdict;
  }

  FakeFabric fabric_;
  memory::Registry registry_{&fabric_};
  std::vector<v1::WatchEvent> events_;
  std::vector<std::pair<std::string, uint32_t>> notices_;
  std::vector<uint32_t> idle_;
  std::unique_ptr<Landing> landing_;  // last: it tells the others as it goes
};

TEST_F(LandingTest, OpensAWindowOverExactlyTheBlocksForTheSource) {
  Prepared p = Prepare();
  ASSERT_TRUE(fabric_.windows.contains(p.window));
  const FakeFabric::Window& w = fabric_.windows[p.window];
  EXPECT_EQ(w.peer, "node-a");
  const std::vector<fabric::Extent> want = {{Offset(0, 1), 2 * kBlockBytes},
                                            {Offset(0, 5), kBlockBytes},
                                            {Offset(1, 1), 2 * kBlockBytes},
                                            {Offset(1, 5), kBlockBytes}};
  ASSERT_EQ(w.extents.size(), want.size());
  for (size_t i = 0; i < want.size(); ++i) {
    EXPECT_EQ(w.extents[i].offset, want[i].offset) << i;
    EXPECT_EQ(w.extents[i].bytes, want[i].bytes) << i;
  }
  EXPECT_EQ(landing_->active(), 1u);
  EXPECT_EQ(landing_->IdleMask(), 0b1110u);  // rail 0 carries the source's own traffic
}

TEST_F(LandingTest, ForeignTrafficKeepsANicFromBeingAdvertisedIdle) {
  Prepare();  // rail 0: the source's own traffic
  ASSERT_EQ(landing_->IdleMask(), 0b1110u);
  idle_.clear();
  // Rail 2 receives foreign traffic: not idle, and the sources hear it at once.
  landing_->SetForeignBusy(1u << 2);
  EXPECT_EQ(landing_->IdleMask(), 0b1010u);
  ASSERT_EQ(idle_.size(), 1u);
  EXPECT_EQ(idle_.back(), 0b1010u);
  // A transfer prepared now is answered the same mask.
  absl::StatusOr<v1::PrepareIncomingResponse> r = landing_->Prepare(Request("t2"));
  ASSERT_TRUE(r.ok()) << r.status();
  EXPECT_EQ(r->idle_nic_mask(), 0b1010u);
  // The owner-busy statistic stays about owners.
  EXPECT_FALSE(landing_->Stats(2).owner_busy);
  EXPECT_TRUE(landing_->Stats(0).owner_busy);
  // The same mask again tells nothing; clearing it tells the sources again.
  const size_t told = idle_.size();
  landing_->SetForeignBusy(1u << 2);
  EXPECT_EQ(idle_.size(), told);
  landing_->SetForeignBusy(0);
  EXPECT_EQ(landing_->IdleMask(), 0b1110u);
  EXPECT_EQ(idle_.back(), 0b1110u);
}

TEST_F(LandingTest, AdmissibleBytesAreWhatOpenWindowsCanStillTake) {
  EXPECT_EQ(landing_->AdmissibleBytes(), 0u);
  Prepared p = Prepare();
  const uint64_t all = 3 * kLayers * kBlockBytes;
  EXPECT_EQ(landing_->AdmissibleBytes(), all);
  Data(p, Offset(0, 1), 2 * kBlockBytes);
  Data(p, Offset(0, 1), 2 * kBlockBytes);  // again: distinct bytes count once
  EXPECT_EQ(landing_->AdmissibleBytes(), all - 2 * kBlockBytes);
  Prepare("t2");
  EXPECT_EQ(landing_->AdmissibleBytes(), 2 * all - 2 * kBlockBytes);
  AllData(p);
  Notice(p, ImmOp::kCommit);  // t1 ends: its window takes nothing more
  EXPECT_EQ(landing_->AdmissibleBytes(), all);
  // A source that keeps at most 3 blocks in flight: no more than that of it.
  v1::PrepareIncomingRequest windowed = Request("t3");
  windowed.set_in_flight_bytes(3 * kBlockBytes);
  ASSERT_TRUE(landing_->Prepare(windowed).ok());
  EXPECT_EQ(landing_->AdmissibleBytes(), all + 3 * kBlockBytes);
}

// Two masks told from two threads reach the sources in the order they were
// computed: the one told last is the landing's mask now.
TEST_F(LandingTest, ConcurrentIdleChangesTellTheNewestMaskLast) {
  absl::Mutex mu;
  std::vector<uint32_t> told;  // in the order on_idle finished telling
  absl::Notification first_entered, release_first;
  bool first = true;
  Landing landing(
      &registry_, &fabric_, 4, [](const v1::WatchEvent&) {},
      [](const std::string&, uint32_t) {},
      [&](uint32_t mask) {
        bool is_first = false;
        {
          absl::MutexLock lock(&mu);
          is_first = std::exchange(first, false);
        }
        if (is_first) {
          first_entered.Notify();
          release_first.WaitForNotification();  // a slow send of the older mask
        }
        absl::MutexLock lock(&mu);
        told.push_back(mask);
      },
      LandingOptions{});
  std::thread a([&] { landing.SetForeignBusy(1u << 1); });
  first_entered.WaitForNotification();
  std::thread b([&] { landing.SetForeignBusy(0); });
  // Give b the time to compute its mask while a is still telling (no assertion
  // depends on it: with the telling serialized, any interleaving passes).
  absl::SleepFor(absl::Milliseconds(50));
  release_first.Notify();
  a.join();
  b.join();
  absl::MutexLock lock(&mu);
  ASSERT_EQ(told.size(), 2u);
  EXPECT_EQ(told[0], 0b1101u);
  EXPECT_EQ(told.back(), landing.IdleMask());
  EXPECT_EQ(told.back(), 0b1111u);
}

TEST_F(LandingTest, CompletesOnlyWithACommitAndEveryByte) {
  Prepared p = Prepare();
  AllData(p);
  EXPECT_TRUE(events_.empty());  // every byte, but no commit yet
  Notice(p, ImmOp::kCommit);
  ASSERT_EQ(events_.size(), 1u);
  EXPECT_EQ(events_[0].code(), 0);
  EXPECT_EQ(events_[0].bytes(), 3 * kLayers * kBlockBytes);
  EXPECT_EQ(events_[0].layers_done_size(), static_cast<int>(kLayers));
  EXPECT_TRUE(events_[0].failed_block_ids().empty());
  EXPECT_EQ(VerdictTold(), static_cast<uint8_t>(Verdict::kCompleted));
  EXPECT_TRUE(VerdictNames(DecodeVerdict(notices_.back().second), p.slot));
  EXPECT_FALSE(fabric_.windows[p.window].open);
  EXPECT_EQ(landing_->active(), 0u);
}

TEST_F(LandingTest, ADuplicateChunkCountsOnce) {
  Prepared p = Prepare();
  for (uint32_t layer = 0; layer < kLayers; ++layer) {
    Data(p, Offset(layer, 1), 2 * kBlockBytes);
    Data(p, Offset(layer, 1), 2 * kBlockBytes);    // resent after a NIC failed
    Data(p, Offset(layer, 1) + 100, kBlockBytes);  // overlapping, hostile
  }
  Data(p, Offset(0, 5), kBlockBytes);  // layer 1's block 5 never comes
  Notice(p, ImmOp::kCommit);
  EXPECT_TRUE(events_.empty());  // waits for the missing bytes, within the grace
  landing_->Expire(absl::Now() + absl::Seconds(3));
  ASSERT_EQ(events_.size(), 1u);
  EXPECT_EQ(events_[0].code(), static_cast<int>(absl::StatusCode::kDataLoss));
  EXPECT_EQ(events_[0].bytes(), (2 * kLayers + 1) * kBlockBytes);
  EXPECT_EQ(VerdictTold(), static_cast<uint8_t>(Verdict::kIncompleteCommit));
  // What the engine recomputes: block 5, whose layer 1 never came.
  EXPECT_EQ(std::vector<uint32_t>(events_[0].layers_done().begin(),
                                  events_[0].layers_done().end()),
            (std::vector<uint32_t>{0}));
  EXPECT_EQ(std::vector<uint32_t>(events_[0].failed_block_ids().begin(),
                                  events_[0].failed_block_ids().end()),
            (std::vector<uint32_t>{5}));
  EXPECT_FALSE(events_[0].outgoing());
}

TEST_F(LandingTest, ACommitWaitsForDataAnotherNicHasNotCountedYet) {
  Prepared p = Prepare();
  Data(p, Offset(0, 1), 2 * kBlockBytes, 0);
  Data(p, Offset(0, 5), kBlockBytes, 1);
  Data(p, Offset(1, 1), 2 * kBlockBytes, 2);
  Notice(p, ImmOp::kCommit);  // NIC 3's poller is behind
  EXPECT_TRUE(events_.empty());
  Data(p, Offset(1, 5), kBlockBytes, 3);
  ASSERT_EQ(events_.size(), 1u);
  EXPECT_EQ(events_[0].code(), 0);
  EXPECT_EQ(landing_->Stats(0).own_bytes, 2 * kBlockBytes);
  EXPECT_EQ(landing_->Stats(3).borrowed_bytes, kBlockBytes);
}

TEST_F(LandingTest, NothingIsToldUntilTheWindowHasDrained) {
  Prepared p = Prepare();
  AllData(p);
  fabric_.hold_drains = true;  // a write is still placing when the commit comes
  Notice(p, ImmOp::kCommit);
  EXPECT_FALSE(fabric_.windows[p.window].open);
  EXPECT_TRUE(events_.empty());
  EXPECT_TRUE(notices_.empty());
  absl::StatusOr<v1::IncomingState> state = landing_->Query("node-a", "t1");
  ASSERT_TRUE(state.ok()) << state.status();
  EXPECT_TRUE(state->open());
  fabric_.RunHeldDrains();
  ASSERT_EQ(events_.size(), 1u);
  EXPECT_EQ(events_[0].code(), 0);
  state = landing_->Query("node-a", "t1");
  ASSERT_TRUE(state.ok()) << state.status();
  EXPECT_FALSE(state->open());
  EXPECT_EQ(state->code(), 0);
  EXPECT_EQ(state->landed_bytes(), 3 * kLayers * kBlockBytes);
}

TEST_F(LandingTest, LateStaleAndMisdirectedArrivalsCountNothing) {
  Prepared p = Prepare();
  Data(p, Offset(0, 1), kBlockBytes, 0, "node-c");  // another node names the slot
  Prepared wrong_generation = p;
  wrong_generation.slot.generation ^= 1;
  Data(wrong_generation, Offset(0, 1), kBlockBytes);
  EXPECT_EQ(landing_->stray_writes(), 2u);
  AllData(p);
  Notice(p, ImmOp::kCommit);
  ASSERT_EQ(events_.size(), 1u);
  EXPECT_EQ(events_[0].bytes(), 3 * kLayers * kBlockBytes);
  Data(p, Offset(0, 1), kBlockBytes);  // late: the slot has ended
  EXPECT_EQ(landing_->stray_writes(), 3u);
  EXPECT_EQ(events_.size(), 1u);
}

TEST_F(LandingTest, BytesOutsideTheSlotsBlocksEndItAsAProtocolBreach) {
  Prepared p = Prepare();
  Data(p, Offset(0, 3), kBlockBytes);  // block 3 was not prepared
  ASSERT_EQ(events_.size(), 1u);
  EXPECT_EQ(events_[0].code(), static_cast<int>(absl::StatusCode::kInvalidArgument));
  EXPECT_EQ(VerdictTold(), static_cast<uint8_t>(Verdict::kProtocol));
}

TEST_F(LandingTest, ARepeatedCommitHearsTheVerdictAgain) {
  Prepared p = Prepare();
  AllData(p);
  Notice(p, ImmOp::kCommit);
  ASSERT_EQ(notices_.size(), 1u);
  Notice(p, ImmOp::kCommit);  // the source missed the first verdict
  ASSERT_EQ(notices_.size(), 2u);
  EXPECT_EQ(notices_[0].second, notices_[1].second);
  EXPECT_EQ(events_.size(), 1u);  // watchers hear it once
}

TEST_F(LandingTest, TheSourcesAbortAndExpiryAndATensorsLossEachEndTheirSlot) {
  Prepared aborted = Prepare("t1");
  Prepare("t2");
  Prepare("t3");
  Notice(aborted, ImmOp::kAbort);
  ASSERT_EQ(events_.size(), 1u);
  EXPECT_EQ(events_[0].code(), static_cast<int>(absl::StatusCode::kAborted));
  landing_->Expire(absl::Now() + absl::Seconds(31));
  ASSERT_EQ(events_.size(), 3u);  // both others were idle
  EXPECT_EQ(VerdictTold(), static_cast<uint8_t>(Verdict::kSourceIdle));
  Prepared owned = Prepare("t4");
  absl::StatusOr<memory::TensorLease> lease = registry_.Acquire("kv");
  ASSERT_TRUE(lease.ok());
  landing_->AbortTensor(lease->id(), TargetStatus(Verdict::kOwnerExited));
  ASSERT_EQ(events_.size(), 4u);
  EXPECT_EQ(events_.back().transfer_id(), "t4");
  EXPECT_EQ(events_.back().code(),
            static_cast<int>(absl::StatusCode::kFailedPrecondition));
  EXPECT_EQ(VerdictTold(), static_cast<uint8_t>(Verdict::kOwnerExited));
  Data(owned, Offset(0, 1), kBlockBytes);  // late
  EXPECT_EQ(events_.size(), 4u);
}

TEST_F(LandingTest, PeerLossAndShutdownEndOpenSlots) {
  Prepare("t1");
  landing_->OnPeerLost("node-c");
  EXPECT_TRUE(events_.empty());
  landing_->OnPeerLost("node-a");
  ASSERT_EQ(events_.size(), 1u);
  EXPECT_EQ(VerdictTold(), static_cast<uint8_t>(Verdict::kPeerLost));
  Prepare("t2");
  landing_->Shutdown();
  ASSERT_EQ(events_.size(), 2u);
  EXPECT_EQ(VerdictTold(), static_cast<uint8_t>(Verdict::kShuttingDown));
  absl::StatusOr<v1::PrepareIncomingResponse> after = landing_->Prepare(Request("t3"));
  EXPECT_EQ(after.status().code(), absl::StatusCode::kUnavailable);
  EXPECT_EQ(ReasonOf(after.status()), "SHUTTING_DOWN");
}

TEST_F(LandingTest, SlotsAreReusedOldestFirstWithANewGeneration) {
  Prepared first = Prepare("t1");
  Notice(first, ImmOp::kAbort);
  Prepared second = Prepare("t2");
  EXPECT_NE(second.slot.index, first.slot.index);  // FIFO: the freed slot goes last
  // Reuse every slot once: the first slot comes back with its generation bumped.
  Prepared again{};
  for (uint32_t i = 0; i < kMaxIncoming; ++i) {
    Prepared p = Prepare(absl::StrCat("u", i));
    if (p.slot.index == first.slot.index) {
      again = p;
      break;
    }
    Notice(p, ImmOp::kAbort);
  }
  EXPECT_EQ(again.slot.index, first.slot.index);
  EXPECT_EQ(again.slot.generation, (first.slot.generation + 1) & 0xffff);
  const uint64_t stray = landing_->stray_writes();
  Data(first, Offset(0, 1), kBlockBytes);  // the old generation's late write
  EXPECT_EQ(landing_->stray_writes(), stray + 1);
  Notice(first, ImmOp::kAbort);       // nor can it end the new one
  EXPECT_EQ(landing_->active(), 2u);  // t2 and the slot's new transfer
}

TEST_F(LandingTest, QueryAnswersOnlyTheTransfersOwnSource) {
  Prepare("t1");
  EXPECT_EQ(landing_->Query("node-c", "t1").status().code(), absl::StatusCode::kNotFound);
  EXPECT_EQ(ReasonOf(landing_->Query("node-a", "nope").status()), "UNKNOWN_TRANSFER");
}

TEST_F(LandingTest, RefusesWhatItCannotPrepare) {
  v1::PrepareIncomingRequest bad_total = Request();
  bad_total.set_total_bytes(1);
  EXPECT_EQ(ReasonOf(landing_->Prepare(bad_total).status()), "BAD_TOTAL");
  v1::PrepareIncomingRequest bad_nic = Request();
  bad_nic.set_source_nic(4);
  EXPECT_EQ(ReasonOf(landing_->Prepare(bad_nic).status()), "BAD_SOURCE_NIC");
  v1::PrepareIncomingRequest duplicate = Request();
  duplicate.add_block_ids(5);
  duplicate.set_total_bytes(4 * kLayers * kBlockBytes);
  EXPECT_EQ(ReasonOf(landing_->Prepare(duplicate).status()), "DUPLICATE_TARGET_BLOCK");
  fabric_.fail_open = true;
  absl::StatusOr<v1::PrepareIncomingResponse> no_window = landing_->Prepare(Request());
  EXPECT_EQ(no_window.status().code(), absl::StatusCode::kUnavailable);
  EXPECT_EQ(ReasonOf(no_window.status()), "WINDOW_FAILED");
  EXPECT_EQ(landing_->active(), 0u);
}

// A slot that is closing still holds its window, which may still place bytes: it
// counts against its source's share until the window drains.
TEST_F(LandingTest, ClosingSlotsCountAgainstTheSourcesShareUntilTheyDrain) {
  LandingOptions options;
  options.max_per_source = 2;
  MakeLanding(options);
  fabric_.hold_drains = true;
  Prepared t1 = Prepare("t1");
  Prepared t2 = Prepare("t2");
  Notice(t1, ImmOp::kAbort);
  Notice(t2, ImmOp::kAbort);
  ASSERT_EQ(fabric_.held.size(), 2u);  // both closing, neither drained
  EXPECT_EQ(landing_->active(), 0u);
  absl::StatusOr<v1::PrepareIncomingResponse> refused = landing_->Prepare(Request("t3"));
  EXPECT_EQ(refused.status().code(), absl::StatusCode::kResourceExhausted);
  EXPECT_EQ(ReasonOf(refused.status()), "SOURCE_SHARE");
  EXPECT_EQ(landing_->share_refusals(), 1u);
  v1::PrepareIncomingRequest other = Request("t3");
  other.set_source_node("node-c");  // another source's share is its own
  EXPECT_TRUE(landing_->Prepare(other).ok());
  std::move(fabric_.held[0])();  // t1's window drains: one slot of the share is back
  EXPECT_TRUE(landing_->Prepare(Request("t3")).ok());
  refused = landing_->Prepare(Request("t4"));
  EXPECT_EQ(ReasonOf(refused.status()), "SOURCE_SHARE");
  EXPECT_EQ(landing_->share_refusals(), 2u);
  std::move(fabric_.held[1])();
  fabric_.held.clear();
  EXPECT_TRUE(landing_->Prepare(Request("t4")).ok());
  EXPECT_EQ(landing_->share_refusals(), 2u);
}

// A KV cache as vLLM keeps it, one host region per layer (K half, V half), on the
// same landing: each written region gets its own window, and the slot counts bytes by
// region.
class LandingPartsTest : public LandingTest {
 protected:
  static constexpr uint32_t kRegions = 3;
  static constexpr uint64_t kPart = kBlockBytes / 2;
  static constexpr uint64_t kRegionBytes = 2 * kBlocks * kPart;

  void SetUp() override {
    LandingTest::SetUp();
    std::vector<memory::RegionMemory> regions;
    for (uint32_t r = 0; r < kRegions; ++r) {
      memory_.push_back(std::make_shared<std::vector<uint8_t>>(kRegionBytes));
      regions.push_back({.base = memory_.back()->data(),
                         .bytes = kRegionBytes,
                         .keepalive = memory_.back(),
                         .extent = {}});
    }
    memory::TensorInfo want;
    want.name = "kv-layers";
    want.memory_kind = "host";
    want.layout = memory::Layout(kRegions, kBlocks, 0, 0, 0, 2);
    for (uint32_t r = 0; r < kRegions; ++r) {
      want.layout.parts.push_back({r, 0, 0, kPart});
      want.layout.parts.push_back({r, kBlocks * kPart, 0, kPart});
    }
    ASSERT_TRUE(registry_.Register(std::move(want), std::move(regions), -1).ok());
  }
  // Blocks 2 and 3 of layers 1 and 2.
  v1::PrepareIncomingRequest PartsRequest() const {
    v1::PrepareIncomingRequest r = Request("parts");
    r.set_tensor("kv-layers");
    r.clear_block_ids();
    r.add_block_ids(2);
    r.add_block_ids(3);
    r.set_layer_begin(1);
    r.set_layer_end(3);
    r.set_total_bytes(2 * 2 * kBlockBytes);
    return r;
  }
  std::vector<std::shared_ptr<std::vector<uint8_t>>> memory_;
};

TEST_F(LandingPartsTest, EachRegionWrittenGetsItsOwnWindow) {
  absl::StatusOr<v1::PrepareIncomingResponse> r = landing_->Prepare(PartsRequest());
  ASSERT_TRUE(r.ok()) << r.status();
  ASSERT_EQ(r->window_keys_size(), 3);
  EXPECT_EQ(r->window_keys(0), 0u);  // layer 0 is not moved
  EXPECT_EQ(r->layout().parts_per_block(), 2u);
  EXPECT_EQ(r->layout().parts_size(), 6);
  for (int region : {1, 2}) {
    const FakeFabric::Window& w = fabric_.windows[r->window_keys(region)];
    EXPECT_EQ(w.peer, "node-a");
    // In-region offsets: K parts 2-3, then V parts 2-3.
    const std::vector<fabric::Extent> want = {{2 * kPart, 2 * kPart},
                                              {(kBlocks + 2) * kPart, 2 * kPart}};
    ASSERT_EQ(w.extents.size(), want.size());
    for (size_t i = 0; i < want.size(); ++i) {
      EXPECT_EQ(w.extents[i].offset, want[i].offset) << region << "/" << i;
      EXPECT_EQ(w.extents[i].bytes, want[i].bytes) << region << "/" << i;
    }
  }
  EXPECT_NE(fabric_.windows[r->window_keys(1)].region,
            fabric_.windows[r->window_keys(2)].region);
}

TEST_F(LandingPartsTest, BytesCountByRegionAndTheVerdictWaitsForEveryWindow) {
  absl::StatusOr<v1::PrepareIncomingResponse> r = landing_->Prepare(PartsRequest());
  ASSERT_TRUE(r.ok()) << r.status();
  const SlotId slot = SlotId::Unpack(r->slot());
  auto data = [&](int region, uint64_t offset, uint32_t bytes) {
    landing_->OnArrival(fabric::Arrival{.peer = 1,
                                        .peer_name = "node-a",
                                        .nic = 0,
                                        .window = r->window_keys(region),
                                        .offset = offset,
                                        .bytes = bytes,
                                        .imm = EncodeImm(slot, ImmOp::kData)});
  };
  // The same in-region bytes through both windows are two different places.
  for (int region : {1, 2}) {
    data(region, 2 * kPart, 2 * kPart);
    data(region, (kBlocks + 2) * kPart, 2 * kPart);
  }
  fabric_.hold_drains = true;
  landing_->OnArrival(fabric::Arrival{
      .peer = 1, .peer_name = "node-a", .imm = EncodeImm(slot, ImmOp::kCommit)});
  ASSERT_EQ(fabric_.held.size(), 2u);  // both windows close
  EXPECT_FALSE(fabric_.windows[r->window_keys(1)].open);
  EXPECT_FALSE(fabric_.windows[r->window_keys(2)].open);
  std::move(fabric_.held[0])();
  EXPECT_TRUE(events_.empty());  // one window still drains
  std::move(fabric_.held[1])();
  fabric_.held.clear();
  ASSERT_EQ(events_.size(), 1u);
  EXPECT_EQ(events_[0].code(), 0);
  EXPECT_EQ(events_[0].bytes(), 4 * kBlockBytes);
}

TEST_F(LandingPartsTest, AWriteOutsideItsRegionsBlocksIsAStray) {
  absl::StatusOr<v1::PrepareIncomingResponse> r = landing_->Prepare(PartsRequest());
  ASSERT_TRUE(r.ok()) << r.status();
  // Block 5's K part of region 1: inside the region, outside the prepared blocks.
  landing_->OnArrival(
      fabric::Arrival{.peer = 1,
                      .peer_name = "node-a",
                      .nic = 0,
                      .window = r->window_keys(1),
                      .offset = 5 * kPart,
                      .bytes = static_cast<uint32_t>(kPart),
                      .imm = EncodeImm(SlotId::Unpack(r->slot()), ImmOp::kData)});
  EXPECT_EQ(landing_->stray_writes(), 1u);
  ASSERT_EQ(events_.size(), 1u);
  EXPECT_NE(events_[0].code(), 0);
}

TEST_F(LandingPartsTest, AWindowThatCannotOpenClosesTheOthers) {
  fabric_.opens_left = 1;  // region 1's opens, region 2's fails
  absl::StatusOr<v1::PrepareIncomingResponse> r = landing_->Prepare(PartsRequest());
  EXPECT_EQ(ReasonOf(r.status()), "WINDOW_FAILED");
  ASSERT_EQ(fabric_.windows.size(), 1u);
  EXPECT_FALSE(fabric_.windows.begin()->second.open);
  EXPECT_EQ(landing_->active(), 0u);
}

}  // namespace
}  // namespace fuselink::transfer
