// Transfers that succeed, between two agents on loopback: the bytes at the far end,
// the events of the stream, the NICs each policy uses, the target's watchers, and the
// calls that find, retry and cancel a transfer.
#include <algorithm>
#include <cstring>
#include <map>
#include <numeric>
#include <random>
#include <set>
#include <vector>

#include "absl/strings/str_cat.h"
#include "absl/time/clock.h"
#include "gtest/gtest.h"
#include "tests/integration/calls.h"
#include "tests/integration/cluster.h"

namespace fuselink::testing {
namespace {

constexpr uint32_t kLayers = 4;
constexpr uint32_t kBlocks = 32;
constexpr uint64_t kBlockBytes = 64 << 10;
constexpr int kNics = 4;  // the agent's default emulated node

// Bytes a transfer of `blocks` blocks over `layers` layers moves.
uint64_t Bytes(size_t blocks, uint32_t layers) { return blocks * layers * kBlockBytes; }

uint64_t NicBytes(const v1::Completed& completed, int nic) {
  return completed.per_nic(nic).bytes();
}

// A completed transfer's stream: `accepted` first, then only progress and layer_done
// (each layer of `layers` done exactly once, progress never going back), `completed`
// last with `total_bytes` split over the NICs.
void ExpectCompletedStream(const TransferResult& result, uint64_t total_bytes,
                           const std::set<uint32_t>& layers, const std::string& policy) {
  ASSERT_TRUE(result.status.ok())
      << result.status.error_code() << " " << result.status.error_message();
  ASSERT_GE(result.events.size(), 2u + layers.size());
  const std::string& id = result.events.front().transfer_id();
  EXPECT_FALSE(id.empty());
  const v1::TransferEvent& first = result.events.front();
  ASSERT_TRUE(first.has_accepted()) << first.DebugString();
  EXPECT_EQ(first.accepted().total_bytes(), total_bytes);
  EXPECT_GT(first.accepted().chunks(), 0u);
  EXPECT_EQ(first.accepted().transport(), "tcp");
  EXPECT_EQ(first.accepted().policy(), policy);
  std::multiset<uint32_t> layers_done;
  uint64_t progress = 0;
  for (size_t i = 1; i + 1 < result.events.size(); ++i) {
    const v1::TransferEvent& e = result.events[i];
    EXPECT_EQ(e.transfer_id(), id);
    if (e.has_layer_done()) {
      layers_done.insert(e.layer_done().layer());
    } else if (e.has_progress()) {
      EXPECT_GE(e.progress().bytes_done(), progress);
      EXPECT_LE(e.progress().bytes_done(), total_bytes);
      EXPECT_EQ(e.progress().total_bytes(), total_bytes);
      EXPECT_EQ(e.progress().per_nic_size(), kNics);
      progress = e.progress().bytes_done();
    } else {
      ADD_FAILURE() << "event " << i
                    << " is neither progress nor layer_done: " << e.DebugString();
    }
  }
  EXPECT_EQ(layers_done, std::multiset<uint32_t>(layers.begin(), layers.end()));
  const v1::TransferEvent& last = result.events.back();
  EXPECT_EQ(last.transfer_id(), id);
  ASSERT_TRUE(last.has_completed()) << last.DebugString();
  EXPECT_EQ(last.completed().total_bytes(), total_bytes);
  EXPECT_GT(last.completed().seconds(), 0);
  ASSERT_EQ(last.completed().per_nic_size(), kNics);
  uint64_t sum = 0;
  for (int nic = 0; nic < kNics; ++nic) {
    EXPECT_EQ(last.completed().per_nic(nic).nic(), absl::StrCat("rail", nic));
    sum += NicBytes(last.completed(), nic);
  }
  EXPECT_EQ(sum, total_bytes);
}

class TransferTest : public TwoNodeTest {
 protected:
  // Starts the agents (node-a with NIC policy `policy`) and registers a source tensor
  // "kv" on node-a (home GPU `home_gpu`) and a target "kv" on node-b, of the same
  // layout, different bytes.
  void StartWithTensors(const std::string& policy = "static", uint32_t home_gpu = 0) {
    ASSERT_NO_FATAL_FAILURE(StartNodes({absl::StrCat("--policy=", policy)}));
    const v1::Layout layout = MakeLayout(kLayers, kBlocks, kBlockBytes);
    absl::StatusOr<HostTensor> source = RegisterTensor(*a_, "kv", layout, 1, home_gpu);
    ASSERT_TRUE(source.ok()) << source.status();
    source_ = *std::move(source);
    absl::StatusOr<HostTensor> target = RegisterTensor(*b_, "kv", layout, 2);
    ASSERT_TRUE(target.ok()) << target.status();
    target_ = *std::move(target);
  }

  HostTensor source_;
  HostTensor target_;
};

TEST_F(TransferTest, MovesScatteredBlocksAndLayerRangesToTheirTargetBlocks) {
  ASSERT_NO_FATAL_FAILURE(StartWithTensors());
  std::vector<uint8_t> expected = Snapshot(target_);

  // Non-contiguous, permuted; 8,9 -> 10,11 is a run both sides, the rest are not.
  const std::vector<uint32_t> source_ids = {3, 7, 8, 9, 20, 31, 0};
  const std::vector<uint32_t> target_ids = {30, 1, 10, 11, 4, 16, 5};
  TransferResult all = RunTransfer(
      a_->stub(), MakeRequest("all-layers", "kv", source_ids, "kv", target_ids));
  ASSERT_NO_FATAL_FAILURE(ExpectCompletedStream(all, Bytes(source_ids.size(), kLayers),
                                                {0, 1, 2, 3}, "static"));
  expected = Expected(source_, target_, expected, source_ids, target_ids, 0, kLayers);
  EXPECT_TRUE(Holds(target_, expected));

  // A layer range, blocks reversed on the target.
  const std::vector<uint32_t> range_source = {12, 13, 14};
  const std::vector<uint32_t> range_target = {22, 21, 20};
  v1::TransferRequest request =
      MakeRequest("layer-range", "kv", range_source, "kv", range_target);
  request.mutable_layers()->set_begin(1);
  request.mutable_layers()->set_end(3);
  TransferResult range = RunTransfer(a_->stub(), request);
  ASSERT_NO_FATAL_FAILURE(
      ExpectCompletedStream(range, Bytes(range_source.size(), 2), {1, 2}, "static"));
  expected = Expected(source_, target_, expected, range_source, range_target, 1, 3);
  EXPECT_TRUE(Holds(target_, expected));
  EXPECT_TRUE(Serves(*a_));
  EXPECT_TRUE(Serves(*b_));
}

TEST_F(TransferTest, LandsInATargetWithGapsBetweenBlocksAndLayers) {
  ASSERT_NO_FATAL_FAILURE(StartWithTensors());
  // Blocks 4 KiB apart and an 8 KiB gap after each layer, which must stay untouched.
  const v1::Layout padded = MakeLayout(kLayers, kBlocks, kBlockBytes, kBlockBytes + 4096,
                                       kBlocks * (kBlockBytes + 4096) + 8192);
  absl::StatusOr<HostTensor> target = RegisterTensor(*b_, "kv-padded", padded, 3);
  ASSERT_TRUE(target.ok()) << target.status();
  std::vector<uint8_t> expected = Snapshot(*target);

  const std::vector<uint32_t> ids = {0, 1, 2, 17, 31};
  TransferResult result =
      RunTransfer(a_->stub(), MakeRequest("padded", "kv", ids, "kv-padded", ids));
  ASSERT_NO_FATAL_FAILURE(
      ExpectCompletedStream(result, Bytes(ids.size(), kLayers), {0, 1, 2, 3}, "static"));
  expected = Expected(source_, *target, expected, ids, ids, 0, kLayers);
  EXPECT_TRUE(Holds(*target, expected));
}

// Target blocks in an engine's free-list order, a seeded permutation of 20480 blocks:
// more out-of-order blocks than the target once allowed landed ranges for (it failed
// PROTOCOL after ~4100 blocks). Every byte lands where it belongs.
TEST_F(TransferTest, MovesIntoAPermutedTargetBlockList) {
  ASSERT_NO_FATAL_FAILURE(StartWithTensors());
  constexpr uint32_t kManyBlocks = 20480;
  constexpr uint64_t kSmallBlockBytes = 512;
  const v1::Layout layout = MakeLayout(2, kManyBlocks, kSmallBlockBytes);
  absl::StatusOr<HostTensor> source = RegisterTensor(*a_, "kv-many", layout, 4);
  ASSERT_TRUE(source.ok()) << source.status();
  absl::StatusOr<HostTensor> target = RegisterTensor(*b_, "kv-many", layout, 5);
  ASSERT_TRUE(target.ok()) << target.status();
  std::vector<uint8_t> expected = Snapshot(*target);

  std::vector<uint32_t> source_ids(kManyBlocks);
  std::iota(source_ids.begin(), source_ids.end(), 0u);
  std::vector<uint32_t> target_ids = source_ids;
  std::shuffle(target_ids.begin(), target_ids.end(), std::mt19937(32));
  TransferResult result = RunTransfer(
      a_->stub(), MakeRequest("permuted", "kv-many", source_ids, "kv-many", target_ids));
  ASSERT_NO_FATAL_FAILURE(ExpectCompletedStream(
      result, uint64_t{kManyBlocks} * 2 * kSmallBlockBytes, {0, 1}, "static"));
  expected = Expected(*source, *target, expected, source_ids, target_ids, 0, 2);
  EXPECT_TRUE(Holds(*target, expected));
}

TEST_F(TransferTest, StaticPolicyUsesOnlyTheRailOfTheHomeGpu) {
  ASSERT_NO_FATAL_FAILURE(StartWithTensors("static", /*home_gpu=*/2));
  const std::vector<uint32_t> ids = {0, 5, 6, 7, 19, 25};
  TransferResult result =
      RunTransfer(a_->stub(), MakeRequest("static", "kv", ids, "kv", ids));
  const uint64_t total = Bytes(ids.size(), kLayers);
  ASSERT_NO_FATAL_FAILURE(ExpectCompletedStream(result, total, {0, 1, 2, 3}, "static"));
  const v1::Completed& completed = result.events.back().completed();
  EXPECT_EQ(NicBytes(completed, 2), total);
  for (int nic : {0, 1, 3}) EXPECT_EQ(NicBytes(completed, nic), 0u) << "rail" << nic;
}

TEST_F(TransferTest, StripePolicySpreadsBytesOverEveryRail) {
  ASSERT_NO_FATAL_FAILURE(StartWithTensors("stripe"));
  std::vector<uint8_t> expected = Snapshot(target_);
  // 12 blocks x 4 layers, no two adjacent: 48 writes for the policy to spread.
  std::vector<uint32_t> ids;
  for (uint32_t b = 0; b < kBlocks; b += 3) ids.push_back(b);
  TransferResult result =
      RunTransfer(a_->stub(), MakeRequest("stripe", "kv", ids, "kv", ids));
  const uint64_t total = Bytes(ids.size(), kLayers);
  ASSERT_NO_FATAL_FAILURE(ExpectCompletedStream(result, total, {0, 1, 2, 3}, "stripe"));
  const v1::Completed& completed = result.events.back().completed();
  for (int nic = 0; nic < kNics; ++nic) {
    EXPECT_GT(NicBytes(completed, nic), 0u) << "rail" << nic;
  }
  expected = Expected(source_, target_, expected, ids, ids, 0, kLayers);
  EXPECT_TRUE(Holds(target_, expected));
}

TEST_F(TransferTest, WatchersOfTheTargetLearnWhenTheirBlocksLanded) {
  ASSERT_NO_FATAL_FAILURE(StartWithTensors());
  WatchCall all(b_->stub(), "");
  WatchCall same_tensor(b_->stub(), "kv");
  WatchCall other_tensor(b_->stub(), "not-kv");
  ASSERT_TRUE(all.established());
  ASSERT_TRUE(same_tensor.established());
  ASSERT_TRUE(other_tensor.established());

  const std::vector<uint32_t> source_ids = {4, 9, 11};
  const std::vector<uint32_t> target_ids = {2, 29, 3};
  v1::TransferRequest request =
      MakeRequest("watched", "kv", source_ids, "kv", target_ids);
  request.mutable_layers()->set_begin(1);
  request.mutable_layers()->set_end(4);
  TransferResult result = RunTransfer(a_->stub(), request);
  ASSERT_TRUE(result.status.ok()) << result.status.error_message();
  const std::string& transfer_id = result.events.back().transfer_id();

  for (WatchCall* watch : {&all, &same_tensor}) {
    ASSERT_TRUE(watch->WaitForEvents(1));
    std::vector<v1::WatchEvent> events = watch->events();
    ASSERT_EQ(events.size(), 1u);
    const v1::WatchEvent& e = events[0];
    EXPECT_EQ(e.code(), 0) << e.message();
    EXPECT_EQ(e.transfer_id(), transfer_id);
    EXPECT_EQ(e.source_node(), kNodeA);
    EXPECT_EQ(e.tensor(), "kv");
    EXPECT_EQ(std::vector<uint32_t>(e.block_ids().begin(), e.block_ids().end()),
              target_ids);
    EXPECT_EQ(e.layers().begin(), 1u);
    EXPECT_EQ(e.layers().end(), 4u);
    EXPECT_EQ(e.bytes(), Bytes(target_ids.size(), 3));
  }
  // The hub filters as it publishes: by now the other watcher would have its event.
  EXPECT_TRUE(other_tensor.events().empty());
  EXPECT_TRUE(Serves(*b_));
}

TEST_F(TransferTest, SameRequestIdAttachesAndOtherContentIsRefused) {
  ASSERT_NO_FATAL_FAILURE(StartWithTensors());
  const std::vector<uint32_t> ids = {1, 2, 3};
  v1::TransferRequest request = MakeRequest("idem-1", "kv", ids, "kv", ids);
  TransferResult first = RunTransfer(a_->stub(), request);
  ASSERT_NO_FATAL_FAILURE(
      ExpectCompletedStream(first, Bytes(ids.size(), kLayers), {0, 1, 2, 3}, "static"));
  const std::string transfer_id = first.events.front().transfer_id();

  // A retry may carry a new deadline and still be the same request.
  request.mutable_deadline()->set_seconds(absl::ToUnixSeconds(absl::Now()) + 600);
  TransferResult retry = RunTransfer(a_->stub(), request);
  ASSERT_NO_FATAL_FAILURE(
      ExpectCompletedStream(retry, Bytes(ids.size(), kLayers), {0, 1, 2, 3}, "static"));
  EXPECT_EQ(retry.events.front().transfer_id(), transfer_id);

  v1::TransferRequest other = MakeRequest("idem-1", "kv", ids, "kv", {4, 5, 6});
  TransferResult refused = RunTransfer(a_->stub(), other);
  EXPECT_TRUE(
      HasError(refused.status, grpc::StatusCode::ALREADY_EXISTS, "REQUEST_ID_REUSED"));
  EXPECT_TRUE(refused.events.empty());

  // The first transfer is unchanged, and the agent moves new requests.
  v1::GetTransferRequest get;
  get.set_request_id("idem-1");
  v1::TransferStatus status;
  grpc::ClientContext context;
  ASSERT_TRUE(a_->stub().GetTransfer(&context, get, &status).ok());
  EXPECT_EQ(status.transfer_id(), transfer_id);
  EXPECT_EQ(status.state(), v1::TRANSFER_STATE_COMPLETED);
  EXPECT_TRUE(RunTransfer(a_->stub(), MakeRequest("idem-2", "kv", ids, "kv", {4, 5, 6}))
                  .status.ok());
}

TEST_F(TransferTest, GetTransferAndCancelTransferByEitherId) {
  ASSERT_NO_FATAL_FAILURE(StartWithTensors());
  const std::vector<uint32_t> ids = {10, 20};
  v1::TransferRequest request = MakeRequest("find-me", "kv", ids, "kv", ids);
  TransferResult done = RunTransfer(a_->stub(), request);
  ASSERT_TRUE(done.status.ok()) << done.status.error_message();
  const std::string transfer_id = done.events.front().transfer_id();
  const uint64_t total = Bytes(ids.size(), kLayers);

  auto get = [&](const std::string& tid, const std::string& rid,
                 v1::TransferStatus* out) {
    v1::GetTransferRequest r;
    r.set_transfer_id(tid);
    r.set_request_id(rid);
    grpc::ClientContext context;
    context.set_deadline(absl::ToChronoTime(absl::Now() + kCallTimeout));
    return a_->stub().GetTransfer(&context, r, out);
  };
  auto cancel = [&](const std::string& tid, const std::string& rid) {
    v1::CancelTransferRequest r;
    r.set_transfer_id(tid);
    r.set_request_id(rid);
    v1::TransferStatus ignored;
    grpc::ClientContext context;
    context.set_deadline(absl::ToChronoTime(absl::Now() + kCallTimeout));
    return a_->stub().CancelTransfer(&context, r, &ignored);
  };

  for (auto [tid, rid] : {std::pair<std::string, std::string>{transfer_id, ""},
                          std::pair<std::string, std::string>{"", "find-me"}}) {
    SCOPED_TRACE(absl::StrCat("transfer_id '", tid, "' request_id '", rid, "'"));
    v1::TransferStatus status;
    ASSERT_TRUE(get(tid, rid, &status).ok());
    EXPECT_EQ(status.transfer_id(), transfer_id);
    EXPECT_EQ(status.request_id(), "find-me");
    EXPECT_EQ(status.state(), v1::TRANSFER_STATE_COMPLETED);
    EXPECT_EQ(status.progress().bytes_done(), total);
    EXPECT_EQ(status.progress().total_bytes(), total);
    EXPECT_FALSE(status.has_failure());
    EXPECT_EQ(status.request().target().tensor(), "kv");
    EXPECT_TRUE(HasError(cancel(tid, rid), grpc::StatusCode::FAILED_PRECONDITION,
                         "TRANSFER_FINISHED"));
  }

  v1::TransferStatus status;
  // Both ids of one transfer find it; ids of two transfers are the caller's mistake,
  // for a look-up and for a cancel alike.
  ASSERT_TRUE(get(transfer_id, "find-me", &status).ok());
  EXPECT_EQ(status.transfer_id(), transfer_id);
  TransferResult other =
      RunTransfer(a_->stub(), MakeRequest("other", "kv", ids, "kv", ids));
  ASSERT_TRUE(other.status.ok()) << other.status.error_message();
  EXPECT_TRUE(HasError(get(transfer_id, "other", &status),
                       grpc::StatusCode::INVALID_ARGUMENT, "IDS_DISAGREE"));
  EXPECT_TRUE(HasError(get(other.events.front().transfer_id(), "find-me", &status),
                       grpc::StatusCode::INVALID_ARGUMENT, "IDS_DISAGREE"));
  EXPECT_TRUE(HasError(cancel(transfer_id, "other"), grpc::StatusCode::INVALID_ARGUMENT,
                       "IDS_DISAGREE"));
  // One id unknown is NOT_FOUND, whichever it is.
  EXPECT_TRUE(HasError(get(transfer_id, "never-sent", &status),
                       grpc::StatusCode::NOT_FOUND, "UNKNOWN_TRANSFER"));
  EXPECT_TRUE(HasError(get("node-a-nope-1", "find-me", &status),
                       grpc::StatusCode::NOT_FOUND, "UNKNOWN_TRANSFER"));
  EXPECT_TRUE(HasError(get("node-a-nope-1", "", &status), grpc::StatusCode::NOT_FOUND,
                       "UNKNOWN_TRANSFER"));
  EXPECT_TRUE(HasError(get("", "never-sent", &status), grpc::StatusCode::NOT_FOUND,
                       "UNKNOWN_TRANSFER"));
  EXPECT_TRUE(HasError(cancel("node-a-nope-1", ""), grpc::StatusCode::NOT_FOUND,
                       "UNKNOWN_TRANSFER"));
  EXPECT_TRUE(
      HasError(get("", "", &status), grpc::StatusCode::INVALID_ARGUMENT, "MISSING_ID"));
  EXPECT_TRUE(Serves(*a_));
}

}  // namespace
}  // namespace fuselink::testing

namespace fuselink::testing {
namespace {

// Leases: a layer-by-layer transfer whose prefill never says a layer is ready holds
// the source only while someone renews its lease; once nobody does, it ends with
// LEASE_EXPIRED and the source's outgoing watch hears it.
TEST_F(TransferTest, ALeaseNobodyRenewsEndsTheTransferAndTellsTheSource) {
  ASSERT_NO_FATAL_FAILURE(StartWithTensors());
  WatchCall outgoing(a_->stub(), "kv", /*outgoing=*/true);
  ASSERT_TRUE(outgoing.established());
  auto call = [&](auto rpc, const auto& request) {
    v1::TransferStatus status;
    grpc::ClientContext context;
    context.set_deadline(absl::ToChronoTime(absl::Now() + kCallTimeout));
    return (a_->stub().*rpc)(&context, request, &status);
  };
  v1::ExtendLeaseRequest extend;
  extend.set_request_id("leased");

  // Renewed for a while, then told every layer is ready: it completes.
  v1::TransferRequest renewed = MakeRequest("renewed", "kv", {1, 2}, "kv", {1, 2});
  renewed.set_layer_by_layer(true);
  renewed.set_lease_ms(400);
  TransferCall kept(a_->stub(), renewed);
  ASSERT_TRUE(
      kept.WaitForEvent([](const v1::TransferEvent& e) { return e.has_accepted(); }));
  v1::ExtendLeaseRequest renew;
  renew.set_request_id("renewed");
  for (int i = 0; i < 6; ++i) {  // 1.2 s in all, three leases' worth
    absl::SleepFor(absl::Milliseconds(200));
    ASSERT_TRUE(call(&v1::Agent::Stub::ExtendLease, renew).ok());
  }
  v1::LayersReadyRequest ready;
  ready.set_request_id("renewed");
  ready.set_ready_end(kLayers);
  ASSERT_TRUE(call(&v1::Agent::Stub::LayersReady, ready).ok());
  TransferResult done = kept.Finish();
  ASSERT_TRUE(done.status.ok()) << done.status.error_message();
  EXPECT_TRUE(done.events.back().has_completed());
  EXPECT_TRUE(HasError(call(&v1::Agent::Stub::ExtendLease, renew),
                       grpc::StatusCode::FAILED_PRECONDITION, "TRANSFER_FINISHED"));

  // Never renewed: it ends on its own, and the source hears why.
  v1::TransferRequest leased = MakeRequest("leased", "kv", {3}, "kv", {3});
  leased.set_layer_by_layer(true);
  leased.set_lease_ms(300);
  TransferResult expired = RunTransfer(a_->stub(), leased);
  EXPECT_TRUE(
      HasError(expired.status, grpc::StatusCode::DEADLINE_EXCEEDED, "LEASE_EXPIRED"));
  ASSERT_TRUE(outgoing.WaitForEvents(2));
  const v1::WatchEvent last = outgoing.events()[1];
  EXPECT_EQ(last.code(), static_cast<int>(grpc::StatusCode::DEADLINE_EXCEEDED));
  EXPECT_EQ(last.reason(), "LEASE_EXPIRED");
  EXPECT_EQ(std::vector<uint32_t>(last.failed_block_ids().begin(),
                                  last.failed_block_ids().end()),
            std::vector<uint32_t>{3});
  // Its tensors are free: nothing is stranded.
  EXPECT_TRUE(UnregisterTensor(*a_, "kv").ok());
  EXPECT_TRUE(UnregisterTensor(*b_, "kv").ok());

  // Bad leases, each with its reason.
  v1::TransferRequest too_long = MakeRequest("too-long", "kv", {0}, "kv", {0});
  too_long.set_lease_ms(600'001);
  EXPECT_TRUE(HasError(RunTransfer(a_->stub(), too_long).status,
                       grpc::StatusCode::INVALID_ARGUMENT, "BAD_LEASE"));
  extend.set_request_id("renewed");
  extend.set_lease_ms(600'001);
  EXPECT_TRUE(HasError(call(&v1::Agent::Stub::ExtendLease, extend),
                       grpc::StatusCode::INVALID_ARGUMENT, "BAD_LEASE"));
  extend.set_request_id("no-such");
  extend.set_lease_ms(0);
  EXPECT_TRUE(HasError(call(&v1::Agent::Stub::ExtendLease, extend),
                       grpc::StatusCode::NOT_FOUND, "UNKNOWN_TRANSFER"));
}

}  // namespace
}  // namespace fuselink::testing
