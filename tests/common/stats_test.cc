// stats::Sink (agent/common/stats.h): samples gather under their family in the order
// families first appear, per-NIC samples carry the NIC's labels, a declared family is
// listed with no samples.
#include "agent/common/stats.h"

#include "gtest/gtest.h"

namespace fuselink::stats {
namespace {

constexpr Family kBytes{"fuselink_test_bytes_total", "Bytes.", Kind::kCounter};
constexpr Family kBusy{"fuselink_test_busy", "Busy.", Kind::kGauge};
constexpr Family kQuiet{"fuselink_test_quiet_total", "Nothing yet.", Kind::kCounter};

TEST(StatsSinkTest, SamplesGatherUnderTheirFamilyInFirstSeenOrder) {
  Sink sink({{"rail0", 0}, {"rail1", 1}});
  sink.AddPerNic(kBytes, 0, 10, {{"traffic", "own"}});
  sink.Add(kBusy, 1);
  sink.AddPerNic(kBytes, 1, 20, {{"traffic", "own"}});  // a later source, same family
  sink.Declare(kQuiet);
  ASSERT_EQ(sink.series().size(), 3u);
  const Series& bytes = sink.series()[0];
  EXPECT_STREQ(bytes.family.name, kBytes.name);
  ASSERT_EQ(bytes.samples.size(), 2u);
  EXPECT_EQ(bytes.samples[1].labels,
            (Labels{{"nic", "rail1"}, {"owner_gpu", "1"}, {"traffic", "own"}}));
  EXPECT_EQ(bytes.samples[1].value, 20);
  EXPECT_STREQ(sink.series()[1].family.name, kBusy.name);
  EXPECT_TRUE(sink.series()[1].samples[0].labels.empty());
  EXPECT_STREQ(sink.series()[2].family.name, kQuiet.name);
  EXPECT_TRUE(sink.series()[2].samples.empty());
}

TEST(StatsSinkTest, APerNicSampleOfNoNicIsDropped) {
  Sink sink({{"rail0", 0}});
#ifdef FUSELINK_DCHECK
  EXPECT_DEATH(sink.AddPerNic(kBytes, 1, 5), "a per-NIC sample of no NIC");
#else
  sink.AddPerNic(kBytes, 1, 5);
  EXPECT_TRUE(sink.series().empty());
#endif
}

}  // namespace
}  // namespace fuselink::stats
