// The target's landing fed with a transfer's real bytes, for target block lists in
// any order (an engine's free list hands blocks out in any order): in the source's
// plan order (PlanExtents, chunk by chunk, a window's writes landing out of order) and
// in the order the request lists the blocks, it completes with every byte where it
// belongs. A source that scatters its writes past what its blocks allow is still
// refused PROTOCOL. The test is the fabric: it copies each chunk, then tells the
// landing.
#include <algorithm>
#include <cstring>
#include <memory>
#include <numeric>
#include <random>
#include <vector>

#include "agent/common/status_macros.h"
#include "agent/transfer/imm.h"
#include "agent/transfer/landing.h"
#include "agent/transfer/plan.h"
#include "agent/transfer/verdict.h"
#include "gtest/gtest.h"
#include "tests/transfer/fakes.h"

namespace fuselink::transfer {
namespace {

constexpr uint32_t kLayers = 2;
constexpr uint32_t kBlocks = 24576;
constexpr uint64_t kBlockBytes = 256;
constexpr uint64_t kTensorBytes = kLayers * kBlocks * kBlockBytes;
constexpr uint32_t kChunkBytes = 4096;
constexpr size_t kWindowChunks = 16;  // writes in flight, landing in reverse order

// Blocks 0, 2, 4, ... then 1, 3, 5, ... of the first `count`.
std::vector<uint32_t> EvensThenOdds(uint32_t count) {
  std::vector<uint32_t> ids;
  for (uint32_t b = 0; b < count; b += 2) ids.push_back(b);
  for (uint32_t b = 1; b < count; b += 2) ids.push_back(b);
  return ids;
}

// `count` of the tensor's blocks in a seeded random order.
std::vector<uint32_t> Shuffled(uint32_t count, uint32_t seed) {
  std::vector<uint32_t> ids(kBlocks);
  std::iota(ids.begin(), ids.end(), 0u);
  std::shuffle(ids.begin(), ids.end(), std::mt19937(seed));
  ids.resize(count);
  return ids;
}

class LandingOrderTest : public ::testing::Test {
 protected:
  void SetUp() override {
    target_ = std::make_shared<std::vector<uint8_t>>(kTensorBytes, 0);
    memory::TensorInfo want;
    want.name = "kv";
    want.memory_kind = "host";
    want.layout = memory::Layout{kLayers, kBlocks, kBlockBytes, 0, 0};
    std::vector<memory::RegionMemory> regions = {{.base = target_->data(),
                                                  .bytes = kTensorBytes,
                                                  .keepalive = target_,
                                                  .extent = {}}};
    absl::StatusOr<memory::TensorInfo> info =
        registry_.Register(std::move(want), std::move(regions), -1);
    ASSERT_TRUE(info.ok()) << info.status();
    layout_ = info->layout;
    source_.resize(kTensorBytes);
    std::mt19937_64 bytes(7);
    for (uint8_t& b : source_) b = static_cast<uint8_t>(bytes());
    landing_ = std::make_unique<Landing>(
        &registry_, &fabric_, 4,
        [this](const v1::WatchEvent& e) { events_.push_back(e); }, NoticeFn(), IdleFn());
  }

  // Source blocks 0, 1, 2, ... into target blocks `target_ids`, both layers.
  void Prepare(const std::vector<uint32_t>& target_ids) {
    source_ids_.resize(target_ids.size());
    std::iota(source_ids_.begin(), source_ids_.end(), 0u);
    target_ids_ = target_ids;
    v1::PrepareIncomingRequest r;
    r.set_source_node("node-a");
    r.set_transfer_id("t1");
    r.set_tensor("kv");
    for (uint32_t b : target_ids) r.add_block_ids(b);
    r.set_layer_begin(0);
    r.set_layer_end(kLayers);
    r.set_block_bytes(kBlockBytes);
    r.set_total_bytes(target_ids.size() * kLayers * kBlockBytes);
    absl::StatusOr<v1::PrepareIncomingResponse> prepared = landing_->Prepare(r);
    ASSERT_TRUE(prepared.ok()) << prepared.status();
    slot_ = SlotId::Unpack(prepared->slot());
    window_ = prepared->window_keys(0);
  }
  // What the fabric does with one write: place its bytes, then tell the landing.
  void Write(uint64_t source_offset, uint64_t target_offset, uint32_t bytes) {
    std::memcpy(target_->data() + target_offset, source_.data() + source_offset, bytes);
    landing_->OnArrival(fabric::Arrival{.peer = 1,
                                        .peer_name = "node-a",
                                        .nic = 0,
                                        .window = window_,
                                        .offset = target_offset,
                                        .bytes = bytes,
                                        .imm = EncodeImm(slot_, ImmOp::kData)});
  }
  void Commit() {
    landing_->OnArrival(fabric::Arrival{
        .peer = 1, .peer_name = "node-a", .imm = EncodeImm(slot_, ImmOp::kCommit)});
  }
  // The source's own order: its plan, chunk by chunk, each window of writes landing
  // last first.
  void WritePlanned() {
    const std::vector<Extent> extents =
        PlanExtents(layout_, layout_, source_ids_, target_ids_, 0, kLayers);
    ChunkCursor cursor(extents, kChunkBytes);
    std::vector<Chunk> window;
    Chunk chunk;
    bool more = true;
    while (more) {
      more = cursor.Next(&chunk);
      if (more) window.push_back(chunk);
      if (window.size() == kWindowChunks || (!more && !window.empty())) {
        for (auto c = window.rbegin(); c != window.rend(); ++c) {
          Write(c->source_offset, c->target_offset, c->bytes);
        }
        window.clear();
      }
    }
  }
  // The request's order: layer by layer, one write per block as the lists name them.
  void WriteListed() {
    for (uint32_t layer = 0; layer < kLayers; ++layer) {
      for (size_t i = 0; i < target_ids_.size(); ++i) {
        Write(layout_.PartOffset(layer, 0, source_ids_[i]),
              layout_.PartOffset(layer, 0, target_ids_[i]), kBlockBytes);
      }
    }
  }
  // The one event says completed, with every byte; each target block holds its
  // source block's bytes, and every other block is untouched.
  void ExpectCompletedByteExact() {
    ASSERT_EQ(events_.size(), 1u);
    EXPECT_EQ(events_[0].code(), 0)
        << events_[0].reason() << ": " << events_[0].message();
    EXPECT_EQ(events_[0].bytes(), target_ids_.size() * kLayers * kBlockBytes);
    std::vector<int> source_of(kBlocks, -1);
    for (size_t i = 0; i < target_ids_.size(); ++i) source_of[target_ids_[i]] = i;
    const std::vector<uint8_t> zeros(kBlockBytes, 0);
    size_t wrong = 0;
    for (uint32_t layer = 0; layer < kLayers; ++layer) {
      for (uint32_t b = 0; b < kBlocks; ++b) {
        const uint8_t* got = target_->data() + layout_.PartOffset(layer, 0, b);
        const uint8_t* want =
            source_of[b] < 0 ? zeros.data()
                             : source_.data() + layout_.PartOffset(
                                                    layer, 0, source_ids_[source_of[b]]);
        wrong += std::memcmp(got, want, kBlockBytes) != 0;
      }
    }
    EXPECT_EQ(wrong, 0u) << "blocks whose bytes are not their source's";
  }

  testing::FakeFabric fabric_{4};
  memory::Registry registry_{&fabric_};
  memory::Layout layout_;
  std::shared_ptr<std::vector<uint8_t>> target_;
  std::vector<uint8_t> source_;
  std::vector<uint32_t> source_ids_, target_ids_;
  SlotId slot_;
  fabric::WindowKey window_ = 0;
  std::vector<v1::WatchEvent> events_;
  std::unique_ptr<Landing> landing_;  // last: it tells the others as it goes
};

TEST_F(LandingOrderTest, EvensThenOddsInThePlansOrderCompleteByteExact) {
  Prepare(EvensThenOdds(16384));
  WritePlanned();
  Commit();
  ExpectCompletedByteExact();
}

TEST_F(LandingOrderTest, ARandomOrderInThePlansOrderCompletesByteExact) {
  Prepare(Shuffled(24000, 32));
  WritePlanned();
  Commit();
  ExpectCompletedByteExact();
}

// A source that writes the blocks in the order the request lists them (as this one
// did before it planned in target order) leaves a range per block behind it, up to
// 8192 at once here: still within what the slot allows.
TEST_F(LandingOrderTest, EvensThenOddsInTheListsOrderCompleteByteExact) {
  Prepare(EvensThenOdds(16384));
  WriteListed();
  Commit();
  ExpectCompletedByteExact();
}

TEST_F(LandingOrderTest, ARandomOrderInTheListsOrderCompletesByteExact) {
  Prepare(Shuffled(24000, 33));
  WriteListed();
  Commit();
  ExpectCompletedByteExact();
}

// 64 blocks x 2 layers are 128 pieces: the slot holds at most 128 + 4096 disjoint
// ranges. One byte in two, front to back, adds a range a write; the write past the
// bound ends the slot PROTOCOL, and is counted.
TEST_F(LandingOrderTest, ASourceScatteringPastWhatItsBlocksAllowIsRefused) {
  std::vector<uint32_t> ids(64);
  std::iota(ids.begin(), ids.end(), 0u);
  Prepare(ids);
  constexpr size_t kMaxRanges = 64 * kLayers + 4096;
  for (size_t i = 0; i < kMaxRanges; ++i) Write(2 * i, 2 * i, 1);
  EXPECT_TRUE(events_.empty());  // at the bound, not past it
  EXPECT_EQ(landing_->scattered_writes(), 0u);
  Write(2 * kMaxRanges, 2 * kMaxRanges, 1);
  ASSERT_EQ(events_.size(), 1u);
  EXPECT_EQ(events_[0].code(), static_cast<int>(absl::StatusCode::kInvalidArgument));
  EXPECT_EQ(events_[0].reason(), "PROTOCOL");
  EXPECT_EQ(landing_->scattered_writes(), 1u);
  EXPECT_EQ(landing_->active(), 0u);
}

}  // namespace
}  // namespace fuselink::transfer
