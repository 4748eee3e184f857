// Leader election on a Lease (client-go's rules: observed time on the candidate's own clock,
// resourceVersion on every write).
#include <ctime>

#include <spdlog/spdlog.h>

#include "kube/kube.h"

namespace flotilla::kube {
namespace {

// MicroTime, as the Lease's acquireTime and renewTime carry it: RFC 3339 with microseconds, UTC.
std::string micro_time(std::chrono::system_clock::time_point at) {
  const auto micros =
      std::chrono::duration_cast<std::chrono::microseconds>(at.time_since_epoch()).count();
  const std::time_t seconds = static_cast<std::time_t>(micros / 1'000'000);
  std::tm utc{};
  ::gmtime_r(&seconds, &utc);
  char text[40];
  const size_t length = std::strftime(text, sizeof(text), "%Y-%m-%dT%H:%M:%S", &utc);
  char fraction[16];
  std::snprintf(fraction, sizeof(fraction), ".%06lldZ", static_cast<long long>(micros % 1'000'000));
  return std::string(text, length) + fraction;
}

}  // namespace

LeaderElector::LeaderElector(Client& client, Options options, const Clock& clock)
    : client_(client),
      options_(std::move(options)),
      clock_(clock),
      path_(object_path(kLeases, client.config().namespace_name, options_.lease_name)) {}

nlohmann::json LeaderElector::lease_object(const nlohmann::json& previous,
                                           int64_t transitions) const {
  nlohmann::json lease = previous.is_object() ? previous : nlohmann::json::object();
  lease["apiVersion"] = "coordination.k8s.io/v1";
  lease["kind"] = "Lease";
  lease["metadata"]["name"] = options_.lease_name;
  for (const auto& [key, value] : options_.annotations) {
    lease["metadata"]["annotations"][key] = value;
  }
  nlohmann::json& spec = lease["spec"];
  const std::string now = micro_time(clock_.system_now());
  if (field(spec, "holderIdentity") != options_.identity) {
    spec["acquireTime"] = now;
  }
  spec["holderIdentity"] = options_.identity;
  spec["leaseDurationSeconds"] = std::max<int64_t>(
      1, std::chrono::duration_cast<std::chrono::seconds>(options_.lease_duration).count());
  spec["renewTime"] = now;
  spec["leaseTransitions"] = transitions;
  return lease;
}

bool LeaderElector::step() {
  const Clock::TimePoint now = clock_.now();
  auto lose_if_late = [&] {
    // A leader that could not renew for the renew deadline stops leading, before the lease
    // duration lets another candidate take over.
    if (leading_.load() && now - renewed_at_ >= options_.renew_deadline) {
      spdlog::warn(
          "lease {}: not renewed for {} ms; no longer leading", options_.lease_name,
          std::chrono::duration_cast<std::chrono::milliseconds>(now - renewed_at_).count());
      leading_.store(false);
    }
    return leading_.load();
  };
  Result<Reply> got = client_.get(path_);
  if (!got.is_ok() || (!got->ok() && got->status != 404)) {
    return lose_if_late();
  }
  if (got->status == 404) {
    Result<Reply> created =
        client_.create(collection_path(kLeases, client_.config().namespace_name),
                       lease_object(nlohmann::json(), 0));
    if (created.is_ok() && created->ok()) {
      leading_.store(true);
      renewed_at_ = now;
      return true;
    }
    return lose_if_late();
  }
  const nlohmann::json& lease = got->body;
  const nlohmann::json& spec = field(lease, "spec");
  const nlohmann::json& holder_field = field(spec, "holderIdentity");
  const std::string holder = holder_field.is_string() ? holder_field.get<std::string>() : "";
  const nlohmann::json& transitions_field = field(spec, "leaseTransitions");
  const int64_t transitions =
      transitions_field.is_number_integer() ? transitions_field.get<int64_t>() : 0;
  // The record as the holder writes it: a renewal changes renewTime, so a live leader's record
  // never stays the same for a lease duration.
  const std::string record = spec.dump();
  if (record != observed_record_) {
    observed_record_ = record;
    observed_at_ = now;
  }
  const bool mine = holder == options_.identity;
  if (!mine && !holder.empty() && now - observed_at_ < options_.lease_duration) {
    leading_.store(false);  // someone else holds a live lease
    return false;
  }
  // Ours to renew, free, or expired: write it with the resourceVersion just read.
  Result<Reply> written =
      client_.replace(path_, lease_object(lease, mine ? transitions : transitions + 1));
  if (written.is_ok() && written->ok()) {
    if (!leading_.load()) {
      spdlog::info("lease {}: {} leads now", options_.lease_name, options_.identity);
    }
    leading_.store(true);
    renewed_at_ = now;
    observed_record_ = field(written->body, "spec").dump();
    observed_at_ = now;
    return true;
  }
  if (written.is_ok() && written->status == 409 && !mine) {
    leading_.store(false);  // another candidate took it first
    return false;
  }
  return lose_if_late();
}

void LeaderElector::release() {
  if (!leading_.exchange(false)) {
    return;
  }
  Result<Reply> got = client_.get(path_);
  if (!got.is_ok() || !got->ok() ||
      field(field(got->body, "spec"), "holderIdentity") != options_.identity) {
    return;
  }
  nlohmann::json lease = got->body;
  lease["spec"]["holderIdentity"] = "";
  if (Result<Reply> written = client_.replace(path_, lease); written.is_ok() && written->ok()) {
    spdlog::info("lease {}: released by {}", options_.lease_name, options_.identity);
  }
}

void LeaderElector::run(const std::function<void(bool leading)>& on_change) {
  bool was_leading = false;
  while (true) {
    const bool leading_now = step();
    if (leading_now != was_leading) {
      on_change(leading_now);
      was_leading = leading_now;
    }
    const auto deadline = std::chrono::steady_clock::now() + options_.retry_period;
    MutexLock lock(mu_);
    while (!stopping_ && wake_.wait_until(mu_, deadline)) {
    }
    if (stopping_) {
      break;
    }
  }
  if (was_leading) {
    on_change(false);
  }
  release();
}

void LeaderElector::stop() {
  {
    MutexLock lock(mu_);
    stopping_ = true;
  }
  wake_.notify_all();
}

}  // namespace flotilla::kube
