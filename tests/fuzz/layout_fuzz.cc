// A layout any engine or peer can send (fuselink.v1.Layout and the sizes of its
// regions), on any bytes: LayoutFromProto and NormalizeLayout never crash, and a
// layout they accept keeps its promises. Every part lies inside its region; no byte
// is in two blocks or parts (the joined ranges of every block hold exactly the bytes
// of all of them); and a plan from it into a packed layout moves each block's bytes
// once, every run inside one region on both sides.
#include <cstddef>
#include <cstdint>
#include <cstring>
#include <numeric>
#include <string>
#include <vector>

#include "agent/memory/layout.h"
#include "agent/transfer/layout_proto.h"
#include "agent/transfer/plan.h"
#include "fuselink/v1/tensor.pb.h"
#include "tests/fuzz/fuzz_check.h"

namespace {

// Input: u8 region count (1 to 8), that many u32 region sizes, then the Layout's bytes.
constexpr size_t kMaxRegionsHere = 8;
// Layouts checked block by block only below this many pieces (blocks x layers x parts).
constexpr uint64_t kMaxCheckedPieces = 1 << 16;

}  // namespace

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size) {
  using namespace fuselink;
  if (size < 1) return 0;
  const size_t regions = data[0] % kMaxRegionsHere + 1;
  if (size < 1 + 4 * regions) return 0;
  std::vector<uint64_t> region_bytes(regions);
  for (size_t i = 0; i < regions; ++i) {
    uint32_t v;
    std::memcpy(&v, data + 1 + 4 * i, 4);
    region_bytes[i] = v;
  }
  v1::Layout proto;
  const size_t head = 1 + 4 * regions;
  if (!proto.ParseFromArray(data + head, static_cast<int>(size - head))) return 0;
  absl::StatusOr<memory::Layout> from = transfer::LayoutFromProto(proto);
  if (!from.ok()) {
    FL_FUZZ_CHECK(absl::IsInvalidArgument(from.status()));
    return 0;
  }
  absl::StatusOr<memory::Layout> l = memory::NormalizeLayout(*from, region_bytes);
  if (!l.ok()) {
    FL_FUZZ_CHECK(absl::IsInvalidArgument(l.status()));
    return 0;
  }
  // Normalized is a fixed point.
  absl::StatusOr<memory::Layout> again = memory::NormalizeLayout(*l, region_bytes);
  FL_FUZZ_CHECK(again.ok() && *again == *l);
  FL_FUZZ_CHECK(l->block_bytes > 0);
  for (uint32_t layer = 0; layer < l->layers; ++layer) {
    uint64_t sum = 0;
    for (uint32_t p = 0; p < l->part_count(); ++p) {
      const memory::Part part = l->part(layer, p);
      FL_FUZZ_CHECK(part.region < regions);
      const uint64_t last = l->PartOffset(layer, p, l->blocks_per_layer - 1);
      FL_FUZZ_CHECK(memory::RegionOf(last) == part.region);
      FL_FUZZ_CHECK(memory::OffsetInRegion(last) + part.bytes <=
                    region_bytes[part.region]);
      sum += part.bytes;
    }
    FL_FUZZ_CHECK(sum == l->block_bytes);
  }
  const uint64_t pieces = uint64_t{l->layers} * l->blocks_per_layer * l->part_count();
  if (pieces > kMaxCheckedPieces) return 0;
  std::vector<uint32_t> ids(l->blocks_per_layer);
  std::iota(ids.begin(), ids.end(), 0);
  absl::StatusOr<std::vector<fabric::Extent>> ranges =
      transfer::BlockRanges(*l, ids, 0, l->layers);
  if (!ranges.ok()) return 0;  // too fragmented for one window: a refusal, not a bug
  const uint64_t all = uint64_t{l->layers} * l->blocks_per_layer * l->block_bytes;
  uint64_t joined = 0;
  for (const fabric::Extent& e : *ranges) joined += e.bytes;
  FL_FUZZ_CHECK(joined == all);  // nothing counted twice: no byte in two places

  const memory::Layout packed = *memory::NormalizeLayout(
      memory::Layout(l->layers, l->blocks_per_layer, l->block_bytes), UINT64_MAX);
  uint64_t planned = 0;
  for (const transfer::Extent& e :
       transfer::PlanExtents(*l, packed, ids, ids, 0, l->layers)) {
    FL_FUZZ_CHECK(e.bytes > 0);
    FL_FUZZ_CHECK(memory::RegionOf(e.source_offset) ==
                  memory::RegionOf(e.source_offset + e.bytes - 1));
    FL_FUZZ_CHECK(memory::RegionOf(e.target_offset) == 0);
    planned += e.bytes;
  }
  FL_FUZZ_CHECK(planned == all);
  return 0;
}
