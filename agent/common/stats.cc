#include "agent/common/stats.h"

#include "absl/strings/str_cat.h"
#include "agent/common/check.h"

namespace fuselink::stats {

Series& Sink::Find(const Family& family) {
  auto [it, fresh] = index_.try_emplace(family.name, series_.size());
  if (fresh) series_.push_back(Series{family, {}});
  Series& series = series_[it->second];
  FL_DCHECK(series.family.kind == family.kind, "one family declared with two kinds");
  return series;
}

void Sink::Add(const Family& family, Labels labels, double value) {
  Find(family).samples.push_back(Sample{std::move(labels), value});
}

void Sink::AddPerNic(const Family& family, int nic, double value, Labels extra) {
  FL_DCHECK(nic >= 0 && nic < nic_count(), "a per-NIC sample of no NIC");
  if (nic < 0 || nic >= nic_count()) return;
  Labels labels = {{"nic", nics_[nic].name},
                   {"owner_gpu", absl::StrCat(nics_[nic].owner_gpu)}};
  labels.insert(labels.end(), std::make_move_iterator(extra.begin()),
                std::make_move_iterator(extra.end()));
  Add(family, std::move(labels), value);
}

void Sink::Declare(const Family& family) { Find(family); }

}  // namespace fuselink::stats
