#include "services/discovery/k8s_discovery.h"

#include <curl/curl.h>

#include <algorithm>
#include <cstdlib>
#include <fstream>
#include <random>
#include <sstream>
#include <utility>

#include "absl/cleanup/cleanup.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/strip.h"
#include "absl/time/clock.h"
#include "agent/common/check.h"
#include "services/discovery/endpoint_slices.h"

namespace fuselink::services {
namespace {

using google::protobuf::Struct;
using google::protobuf::Value;
using k8s_internal::Field;
using k8s_internal::Object;
using k8s_internal::ParseJson;
using k8s_internal::PeersOf;
using k8s_internal::String;

constexpr absl::Duration kConnectTimeout = absl::Seconds(5);
constexpr absl::Duration kListTimeout = absl::Seconds(15);
// A watch line is one EndpointSlice; the API server caps objects far below this.
constexpr size_t kMaxLineBytes = 4 << 20;
// A list of the Service's slices: one per ~100 agents; far below this.
constexpr size_t kMaxListBytes = 64 * kMaxLineBytes;

// curl_global_init once per process, before the first handle; thread-safe in
// libcurl 7.84 and later (Debian 12: 7.88).
absl::Status InitCurl() {
  static const CURLcode code = curl_global_init(CURL_GLOBAL_DEFAULT);
  if (code != CURLE_OK) {
    return absl::FailedPreconditionError(
        absl::StrCat("curl_global_init: ", curl_easy_strerror(code)));
  }
  return absl::OkStatus();
}

std::string ReadFile(const std::string& path) {
  std::ifstream in(path);
  std::stringstream s;
  s << in.rdbuf();
  return std::string(absl::StripAsciiWhitespace(s.str()));
}

// One GET, body handed to `on_data` as it arrives (return false to stop). The HTTP
// status: NOT_FOUND for 404, UNAVAILABLE for a transport error or 5xx,
// PERMISSION_DENIED for 401/403, FAILED_PRECONDITION for other codes.
struct Request {
  const K8sDiscoveryOptions* options;
  std::string path;
  absl::Duration timeout;
  std::function<bool(absl::string_view)> on_data;
  const std::atomic<bool>* stopping;
};

absl::Status Get(Request& r) {
  if (absl::Status init = InitCurl(); !init.ok()) return init;
  CURL* curl = curl_easy_init();
  if (curl == nullptr) return absl::ResourceExhaustedError("curl_easy_init failed");
  absl::Cleanup free_curl = [curl] { curl_easy_cleanup(curl); };
  const std::string url = absl::StrCat(r.options->api_server, r.path);
  const std::string auth =
      absl::StrCat("Authorization: Bearer ", ReadFile(r.options->token_file));
  curl_slist* headers = curl_slist_append(nullptr, auth.c_str());
  headers = curl_slist_append(headers, "Accept: application/json");
  absl::Cleanup free_headers = [headers] { curl_slist_free_all(headers); };
  std::string error_body;
  long http = 0;
  auto write = +[](char* data, size_t size, size_t n, void* user) -> size_t {
    auto* req = static_cast<Request*>(user);
    return req->on_data(absl::string_view(data, size * n)) ? size * n : 0;
  };
  auto progress = +[](void* user, curl_off_t, curl_off_t, curl_off_t, curl_off_t) -> int {
    return static_cast<Request*>(user)->stopping->load() ? 1 : 0;
  };
  curl_easy_setopt(curl, CURLOPT_URL, url.c_str());
  curl_easy_setopt(curl, CURLOPT_HTTPHEADER, headers);
  curl_easy_setopt(curl, CURLOPT_CAINFO, r.options->ca_file.c_str());
  curl_easy_setopt(curl, CURLOPT_CONNECTTIMEOUT_MS,
                   static_cast<long>(absl::ToInt64Milliseconds(kConnectTimeout)));
  curl_easy_setopt(curl, CURLOPT_TIMEOUT_MS,
                   static_cast<long>(absl::ToInt64Milliseconds(r.timeout)));
  curl_easy_setopt(curl, CURLOPT_NOSIGNAL, 1L);
  curl_easy_setopt(curl, CURLOPT_WRITEFUNCTION, write);
  curl_easy_setopt(curl, CURLOPT_WRITEDATA, &r);
  curl_easy_setopt(curl, CURLOPT_NOPROGRESS, 0L);
  curl_easy_setopt(curl, CURLOPT_XFERINFOFUNCTION, progress);
  curl_easy_setopt(curl, CURLOPT_XFERINFODATA, &r);
  curl_easy_setopt(curl, CURLOPT_FAILONERROR, 1L);
  const CURLcode code = curl_easy_perform(curl);
  curl_easy_getinfo(curl, CURLINFO_RESPONSE_CODE, &http);
  if (code == CURLE_OK) return absl::OkStatus();
  const std::string what = absl::StrCat("GET ", url, ": ", curl_easy_strerror(code),
                                        http ? absl::StrCat(" (HTTP ", http, ")") : "");
  if (code == CURLE_HTTP_RETURNED_ERROR) {
    if (http == 404) return absl::NotFoundError(what);
    if (http == 401 || http == 403) return absl::PermissionDeniedError(what);
    if (http == 410) return absl::AbortedError(what);  // resourceVersion too old: relist
    if (http < 500) return absl::FailedPreconditionError(what);
  }
  return absl::UnavailableError(what);
}

}  // namespace

struct K8sDiscovery::Slices {
  std::map<std::string, SlicePeers> by_name;
  std::string version;  // resourceVersion to watch from
};

absl::Duration Jittered(absl::Duration backoff, double unit) {
  return backoff / 2 + backoff / 2 * std::clamp(unit, 0.0, 1.0);
}

absl::string_view WatchEndName(WatchEnd end) {
  switch (end) {
    case WatchEnd::kRenewed:
      return "renewed";
    case WatchEnd::kGone:
      return "gone";
    case WatchEnd::kError:
      return "error";
  }
  return "unknown";
}

K8sDiscovery::K8sDiscovery(K8sDiscoveryOptions options,
                           std::function<void(const PeerSet&)> on_change)
    : options_(std::move(options)),
      on_change_(std::move(on_change)),
      slices_(std::make_unique<Slices>()) {}

absl::StatusOr<std::unique_ptr<K8sDiscovery>> K8sDiscovery::Start(
    K8sDiscoveryOptions options, std::function<void(const PeerSet&)> on_change) {
  if (options.api_server.empty()) {
    const char* host = std::getenv("KUBERNETES_SERVICE_HOST");
    const char* port = std::getenv("KUBERNETES_SERVICE_PORT");
    if (host == nullptr || port == nullptr) {
      return absl::FailedPreconditionError(
          "Kubernetes discovery: no API server (--k8s_api_server, or run in a pod)");
    }
    options.api_server = absl::StrCat("https://", host, ":", port);
  }
  if (options.service.empty() || options.namespace_name.empty()) {
    return absl::InvalidArgumentError(
        "Kubernetes discovery needs a service and a namespace");
  }
  if (options.backoff_min <= absl::ZeroDuration() ||
      options.backoff_max < options.backoff_min) {
    return absl::InvalidArgumentError(
        "Kubernetes discovery: the watch backoff needs 0 < min <= max");
  }
  std::unique_ptr<K8sDiscovery> d(
      new K8sDiscovery(std::move(options), std::move(on_change)));
  d->api_version_ = "discovery.k8s.io/v1";
  absl::StatusOr<std::string> version = d->List();
  if (absl::IsNotFound(version.status())) {  // before Kubernetes 1.21
    d->api_version_ = "discovery.k8s.io/v1beta1";
    version = d->List();
  }
  if (!version.ok()) return version.status();
  d->Publish();
  d->thread_ = std::thread([raw = d.get(), v = *version] { raw->Run(v); });
  return d;
}

K8sDiscovery::~K8sDiscovery() {
  stopping_ = true;
  stop_.Notify();
  if (thread_.joinable()) thread_.join();
}

absl::StatusOr<std::string> K8sDiscovery::List() {
  std::string body;
  Request r{&options_,
            absl::StrCat("/apis/", api_version_, "/namespaces/", options_.namespace_name,
                         "/endpointslices?labelSelector=kubernetes.io%2Fservice-name%3D",
                         options_.service),
            kListTimeout,
            [&](absl::string_view data) {
              body.append(data.data(), data.size());
              return body.size() <= kMaxListBytes;
            },
            &stopping_};
  if (absl::Status s = Get(r); !s.ok()) return s;
  absl::StatusOr<Struct> list = ParseJson(body);
  if (!list.ok()) return list.status();
  slices_->by_name.clear();
  if (const Value* items = Field(*list, "items");
      items != nullptr && items->has_list_value()) {
    for (const Value& item : items->list_value().values()) {
      if (!item.has_struct_value()) continue;
      const std::string name = String(Object(item.struct_value(), "metadata"), "name");
      slices_->by_name[name] =
          PeersOf(item.struct_value(), options_.port_name, options_.self);
    }
  }
  slices_->version = String(Object(*list, "metadata"), "resourceVersion");
  return slices_->version;
}

absl::Status K8sDiscovery::Watch(const std::string& version) {
  std::string line;
  absl::Status event_error;
  auto apply = [&](absl::string_view json) {
    absl::StatusOr<Struct> event = ParseJson(json);
    if (!event.ok()) return event_error = event.status(), false;
    const std::string type = String(&*event, "type");
    const Struct* object = Object(*event, "object");
    if (object == nullptr) return true;
    if (type == "ERROR") {  // a Status: 410 means the version is gone
      event_error =
          absl::AbortedError(absl::StrCat("watch: ", String(object, "message")));
      return false;
    }
    const Struct* meta = Object(*object, "metadata");
    if (std::string v = String(meta, "resourceVersion"); !v.empty()) slices_->version = v;
    const std::string name = String(meta, "name");
    if (type == "DELETED") {
      slices_->by_name.erase(name);
    } else if (type == "ADDED" || type == "MODIFIED") {
      slices_->by_name[name] = PeersOf(*object, options_.port_name, options_.self);
    } else {
      return true;  // BOOKMARK: only the version moves
    }
    Publish();
    return true;
  };
  Request r{
      &options_,
      absl::StrCat("/apis/", api_version_, "/namespaces/", options_.namespace_name,
                   "/endpointslices?watch=1&allowWatchBookmarks=true",
                   "&labelSelector=kubernetes.io%2Fservice-name%3D", options_.service,
                   "&resourceVersion=", version,
                   "&timeoutSeconds=", absl::ToInt64Seconds(options_.watch_timeout)),
      options_.watch_timeout + absl::Seconds(30),
      [&](absl::string_view data) {
        for (char c : data) {
          if (c != '\n') {
            line.push_back(c);
            if (line.size() > kMaxLineBytes) {
              event_error = absl::OutOfRangeError("watch event too large");
              return false;
            }
            continue;
          }
          if (!line.empty() && !apply(line)) return false;
          line.clear();
        }
        return true;
      },
      &stopping_};
  absl::Status s = Get(r);
  return event_error.ok() ? s : event_error;
}

bool K8sDiscovery::Pause(absl::Duration pause) {
  return !stop_.WaitForNotificationWithTimeout(pause);
}

void K8sDiscovery::Run(std::string version) {
  NameThisThread("fl-discovery");
  std::mt19937_64 random(std::random_device{}());
  std::uniform_real_distribution<double> unit(0.0, 1.0);
  absl::Duration backoff = options_.backoff_min;
  // Every pause is jittered, so that the agents of a release, restarted together,
  // do not come back to the API server in step.
  auto next_pause = [&] {
    const absl::Duration pause = Jittered(backoff, unit(random));
    backoff = std::min(backoff * 2, options_.backoff_max);
    return pause;
  };
  bool relist = false;
  while (!stopping_) {
    if (relist) {
      absl::StatusOr<std::string> listed = List();
      if (stopping_) break;
      if (!listed.ok()) {
        failed_lists_.fetch_add(1, std::memory_order_relaxed);
        const absl::Duration pause = next_pause();
        std::fprintf(stderr, "fuselink-agent: Kubernetes discovery: %s; again in %s\n",
                     listed.status().ToString().c_str(),
                     absl::FormatDuration(pause).c_str());
        if (!Pause(pause)) break;
        continue;
      }
      version = *listed;
      relist = false;
      Publish();
    }
    const absl::Time started = absl::Now();
    const absl::Status s = Watch(version);
    if (stopping_) break;
    const WatchEnd end = s.ok()               ? WatchEnd::kRenewed
                         : absl::IsAborted(s) ? WatchEnd::kGone
                                              : WatchEnd::kError;
    watch_ends_[static_cast<int>(end)].fetch_add(1, std::memory_order_relaxed);
    if (absl::Now() - started >= options_.backoff_max) backoff = options_.backoff_min;
    const absl::Duration pause = next_pause();
    if (s.ok()) {  // the server ended the watch: go on from the last version seen
      version = slices_->version;
    } else {  // the last peer set stays in force until a list succeeds
      relist = true;
      std::fprintf(stderr,
                   "fuselink-agent: Kubernetes discovery: watch ended (%s): %s; "
                   "listing again in %s\n",
                   std::string(WatchEndName(end)).c_str(), s.ToString().c_str(),
                   absl::FormatDuration(pause).c_str());
    }
    if (!Pause(pause)) break;
  }
}

void K8sDiscovery::Publish() {
  PeerSet all = MergePeers(slices_->by_name, options_.prefer);
  if (all == published_) return;
  published_ = all;
  on_change_(all);
}

void K8sDiscovery::ReportStats(stats::Sink& sink) const {
  static constexpr stats::Family kWatchEnds{
      "fuselink_k8s_watch_ends_total",
      "Watches of the agents' EndpointSlices that ended, by reason: renewed (the "
      "server's timeout; watched again), gone (410 or an ERROR event; listed again), "
      "error (transport or HTTP; listed again). Each is followed by a backoff.",
      stats::Kind::kCounter};
  static constexpr stats::Family kListFailures{
      "fuselink_k8s_list_failures_total",
      "Lists of the agents' EndpointSlices after the first that failed; each is retried "
      "after a backoff, the last peer set in force meanwhile.",
      stats::Kind::kCounter};
  for (int k = 0; k < kWatchEndKinds; ++k) {
    const auto end = static_cast<WatchEnd>(k);
    sink.Add(kWatchEnds, {{"reason", std::string(WatchEndName(end))}},
             static_cast<double>(watch_ends(end)));
  }
  sink.Add(kListFailures, static_cast<double>(failed_lists()));
}

}  // namespace fuselink::services
