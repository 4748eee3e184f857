// `flotilla controller`'s loop: leader election, three mirrors, and each endpoint's plan applied
// through the API server.
#include <algorithm>

#include <spdlog/spdlog.h>

#include "cluster/cluster.h"

namespace flotilla::cluster {
namespace {

using kube::field;
using nlohmann::json;

// How long the vertical autoscaler's read of an endpoint's pods may hold the leader's thread.
constexpr std::chrono::milliseconds kUsageDeadline{500};

std::string name_of(const json& object) {
  return kube::string_field(field(object, "metadata"), "name");
}

// Logs what a write got back when it was not a success; a failed write is tried again at the
// next pass.
void check(Result<kube::Reply> reply, const std::string& what) {
  if (!reply.is_ok()) {
    spdlog::warn("{}: {}", what, reply.status().message());
  } else if (!reply->ok()) {
    spdlog::warn("{}: {}", what, kube::reply_status(*reply).message());
  }
}

// The part of a Deployment the controller owns, but its replica count: what its pods run, by
// the annotations it wrote (the stored template carries the API server's defaults).
bool same_deployment(const json& desired, const json& observed) {
  const json& wanted = field(field(desired, "metadata"), "annotations");
  const json& stored = field(field(observed, "metadata"), "annotations");
  return field(wanted, kKeyAnnotation) == field(stored, kKeyAnnotation) &&
         field(wanted, kTemplateAnnotation) == field(stored, kTemplateAnnotation);
}

}  // namespace

Controller::Controller(kube::Client& client, Options options)
    : client_(client),
      options_(std::move(options)),
      elector_(client, options_.election, real_clock()),
      samples_(options_.sample_settle),
      pod_usage_(client, kUsageDeadline) {}

Controller::~Controller() {
  stop();
}

void Controller::stop() {
  {
    MutexLock lock(mu_);
    stopping_ = true;
  }
  wake_.notify_all();
  elector_.stop();
}

void Controller::run() {
  std::thread leader;
  elector_.run([&](bool leading) {
    {
      MutexLock lock(mu_);
      leading_ = leading;
    }
    wake_.notify_all();
    if (leading) {
      if (leader.joinable()) {
        leader.join();
      }
      leader = std::thread([this] { lead(); });
    }
  });
  if (leader.joinable()) {
    leader.join();
  }
}

void Controller::add_report(const SampleReport& report) {
  {
    MutexLock lock(mu_);
    if (!leading_) {
      return;
    }
    for (const auto& [endpoint, samples] : report.endpoints) {
      samples_.add(report.gateway, endpoint, samples);
    }
    if (report.capacity.empty() || !options_.autoscaling.enabled) {
      return;  // without the autoscaler, nothing takes capacity requests
    }
    capacity_.insert(report.capacity.begin(), report.capacity.end());
  }
  wake_.notify_all();  // scale from zero at once, not at the next tick
}

void Controller::lead() {
  spdlog::info("leading: reconciling the ServingEndpoints of {}", client_.config().namespace_name);
  const std::string& ns = client_.config().namespace_name;
  std::vector<std::unique_ptr<Random>> randoms;
  std::vector<std::unique_ptr<kube::Reflector>> reflectors;
  // `plans`: whether a change in these objects asks for a reconcile (pods only inform the
  // autoscaler, at its next tick).
  auto mirror = [&](const kube::Resource& resource, std::string selector,
                    kube::Reflector::Objects Controller::*into, bool plans) {
    kube::Reflector::Options watch = options_.watch;
    watch.label_selector = std::move(selector);
    randoms.push_back(std::make_unique<SeededRandom>(reflectors.size() + 1));
    auto listed = std::make_shared<bool>(false);
    reflectors.push_back(std::make_unique<kube::Reflector>(
        client_, resource, ns, watch,
        [this, into, listed, plans](const kube::Reflector::Objects& objects) {
          MutexLock lock(mu_);
          this->*into = objects;
          const bool first = !*listed;
          if (first) {
            *listed = true;
            ++synced_;
          }
          if (plans || first) {
            dirty_ = true;
            wake_.notify_all();
          }
        },
        *randoms.back()));
  };
  {
    MutexLock lock(mu_);
    synced_ = 0;
  }
  mirror(kube::kServingEndpoints, "", &Controller::serving_endpoints_, true);
  mirror(kube::kDeployments, std::string(kEndpointLabel), &Controller::deployments_, true);
  mirror(kube::kServices, std::string(kEndpointLabel), &Controller::services_, true);
  mirror(kube::kPods, std::string(kEndpointLabel), &Controller::pods_, false);
  const int mirrors = static_cast<int>(reflectors.size());
  std::vector<std::thread> threads;
  for (auto& reflector : reflectors) {
    threads.emplace_back([&reflector] { reflector->run(); });
  }

  scalers_.clear();
  scales_.clear();
  usage_read_.clear();
  restarts_.clear();      // a new term's first reading is its baseline
  pod_usage_.retain({});  // a new term reads every pod afresh
  // The autoscaler ticks every second: its policies run when due, and a scale from zero waits
  // for no period.
  const auto tick = std::chrono::milliseconds(1'000);
  auto next_resync = std::chrono::steady_clock::now() + options_.resync;
  auto next_tick = std::chrono::steady_clock::now() + tick;
  while (true) {
    bool due = false;
    bool ticking = false;
    kube::Reflector::Objects endpoints;
    kube::Reflector::Objects deployments;
    kube::Reflector::Objects pods;
    {
      MutexLock lock(mu_);
      const auto until = std::min(next_resync, next_tick);
      // A capacity request wakes the loop only once the mirrors have listed: until then
      // nothing can take it, and waking for it would spin.
      while (!stopping_ && leading_ && !(dirty_ && synced_ == mirrors) &&
             (capacity_.empty() || synced_ != mirrors) && wake_.wait_until(mu_, until)) {
      }
      if (stopping_ || !leading_) {
        break;
      }
      due = synced_ == mirrors && (dirty_ || std::chrono::steady_clock::now() >= next_resync);
      // Before every reconcile too: a new leader's first plan uses the scales it reads back
      // from the Deployments, never the provisioned counts.
      ticking = synced_ == mirrors && options_.autoscaling.enabled &&
                (due || std::chrono::steady_clock::now() >= next_tick || !capacity_.empty());
      dirty_ = false;
      if (ticking) {
        endpoints = serving_endpoints_;
        deployments = deployments_;
        pods = pods_;
      }
    }
    const auto now = std::chrono::steady_clock::now();
    if (now >= next_resync) {
      next_resync = now + options_.resync;
    }
    if (now >= next_tick) {
      next_tick = now + tick;
    }
    if (ticking && autoscale(endpoints, deployments, pods)) {
      due = true;
    }
    if (due) {
      reconcile_all();
    }
  }
  for (auto& reflector : reflectors) {
    reflector->stop();
  }
  for (std::thread& thread : threads) {
    thread.join();
  }
  spdlog::info("no longer leading");
}

bool Controller::autoscale(const kube::Reflector::Objects& endpoints,
                           const kube::Reflector::Objects& deployments,
                           const kube::Reflector::Objects& pods) {
  const int64_t now_ms = real_clock().unix_ms();
  const autoscaler::Millis now(now_ms);
  std::set<std::string> capacity;
  std::map<std::string, std::vector<LoadSample>> samples;
  std::vector<std::string> names;
  for (const auto& [name, endpoint] : endpoints) {
    names.push_back(name);
  }
  {
    MutexLock lock(mu_);
    capacity.swap(capacity_);
    samples_.retain(names);
    metrics_history_.retain(names);
    for (const std::string& name : names) {
      samples[name] = samples_.take(name, now_ms);
    }
  }
  std::erase_if(scalers_, [&](const auto& entry) { return !endpoints.contains(entry.first); });
  std::erase_if(scales_, [&](const auto& entry) { return !endpoints.contains(entry.first); });
  std::erase_if(usage_read_, [&](const auto& entry) { return !endpoints.contains(entry.first); });
  std::erase_if(restarts_, [&](const auto& entry) { return !endpoints.contains(entry.first); });
  pod_usage_.retain(names);
  bool changed = false;
  for (const auto& [name, endpoint] : endpoints) {
    Result<control::EndpointSpec> spec = spec_of(endpoint);
    if (!spec.is_ok()) {
      continue;  // what serves keeps its scale until the spec is fixed
    }
    // What the spec's versions ask for, and what serves now: during a rollout, the old
    // versions' replicas serve too.
    std::vector<int64_t> running;
    int64_t asked = 0;
    for (const control::ServedModelSpec& served : spec->served_models) {
      const auto deployment = deployments.find(version_object_name(name, served.name));
      running.push_back(deployment != deployments.end()
                            ? kube::integer_field(field(deployment->second, "spec"), "replicas", 0)
                            : 0);
      asked += running.back();
    }
    int64_t ready = 0;
    for (const auto& [deployment_name, deployment] : deployments) {
      if (kube::label(deployment, kEndpointLabel) == name) {
        ready += kube::integer_field(field(deployment, "status"), "readyReplicas", 0);
      }
    }
    auto& scaler = scalers_[name];
    if (scaler == nullptr) {
      const json& saved = field(field(endpoint, "status"), "autoscaler");
      scaler = std::make_unique<control::EndpointScaler>(
          *spec, options_.autoscaling, control::replicas_matching(*spec, running), now,
          saved.is_object() ? control::learned_target_from_json(saved.dump()) : std::nullopt);
    } else {
      scaler->update_spec(*spec);
    }
    if (const std::optional<int64_t> took = newest_pod_start_ms(pods, name)) {
      scaler->observe_start(autoscaler::Millis(*took));
    }
    scaler->add_samples(samples[name], ready);
    std::map<std::string, double> cores;  // of each version's pods
    for (const control::ServedModelSpec& served : spec->served_models) {
      cores[served.name] = served.resources.cpus;
    }
    // Not the structured binding itself: clang 14 refuses a lambda that captures one.
    const std::string& endpoint_name = name;
    std::vector<std::string> changes = scaler->tick(
        now, ready, std::max<int64_t>(0, asked - ready), restarts_[name].update(pods, name), [&] {
          PodUsage::Reading reading = pod_usage_.read(endpoint_name, cores);
          usage_read_[endpoint_name] = reading;
          return reading.usage;
        });
    if (capacity.contains(name) && scaler->request_capacity()) {
      changes.push_back("scale from zero: 0 -> 1 replica, a request is waiting");
    }
    for (const std::string& change : changes) {
      spdlog::info("autoscaler: {}: {}", name, change);
    }
    const control::Scale scale = scaler->scale();
    control::ReplicaCounts replicas;  // pods by version: ready, and asked for but not ready
    for (const control::ServedModelSpec& served : spec->served_models) {
      const auto deployment = deployments.find(version_object_name(name, served.name));
      if (deployment != deployments.end()) {
        const json& status = field(deployment->second, "status");
        const int64_t version_ready = kube::integer_field(status, "readyReplicas", 0);
        replicas[served.name]["ready"] = version_ready;
        replicas[served.name]["starting"] =
            std::max<int64_t>(0, kube::integer_field(status, "replicas", 0) - version_ready);
      }
    }
    metrics_history_.record(name, samples[name], replicas, scale.replicas, scale.target);
    const auto previous = scales_.find(name);
    if (previous == scales_.end() || previous->second != scale) {
      scales_[name] = scale;
      changed = true;
    }
  }
  return changed;
}

void Controller::reconcile_all() {
  kube::Reflector::Objects endpoints;
  kube::Reflector::Objects deployments;
  kube::Reflector::Objects services;
  {
    MutexLock lock(mu_);
    endpoints = serving_endpoints_;
    deployments = deployments_;
    services = services_;
  }
  for (const auto& [name, endpoint] : endpoints) {
    kube::Reflector::Objects owned;
    for (const auto& [deployment_name, deployment] : deployments) {
      if (kube::label(deployment, kEndpointLabel) == name) {
        owned.emplace(deployment_name, deployment);
      }
    }
    std::optional<control::Scale> scale;
    if (const auto found = scales_.find(name); found != scales_.end()) {
      scale = found->second;
    }
    EndpointPlan plan = plan_endpoint(endpoint, owned, scale, options_.replica, real_clock());
    if (const auto scaler = scalers_.find(name); scaler != scalers_.end()) {
      plan.status["autoscaler"] =
          json::parse(control::learned_target_to_json(scaler->second->learned()));
    }
    if (const auto read = usage_read_.find(name); read != usage_read_.end()) {
      const control::ReplicaUsage& usage = read->second.usage;
      plan.status["usage"] = {{"replicasRead", read->second.replicas_read},
                              {"cpuUtilization", usage.cpu_utilization},
                              {"queued", usage.queued ? json(*usage.queued) : json(nullptr)}};
    }
    apply(endpoint, plan, owned, services);
  }
}

void Controller::apply(const json& serving_endpoint, const EndpointPlan& plan,
                       const kube::Reflector::Objects& deployments,
                       const kube::Reflector::Objects& services) {
  const std::string& ns = client_.config().namespace_name;
  const std::string endpoint = name_of(serving_endpoint);
  for (const json& desired : plan.deployments) {
    const std::string name = name_of(desired);
    const auto observed = deployments.find(name);
    if (observed == deployments.end()) {
      check(client_.create(kube::collection_path(kube::kDeployments, ns), desired),
            "creating Deployment " + name);
      continue;
    }
    if (!same_deployment(desired, observed->second)) {
      json updated = desired;
      updated["metadata"]["resourceVersion"] =
          field(field(observed->second, "metadata"), "resourceVersion");
      check(client_.replace(kube::object_path(kube::kDeployments, ns, name), updated),
            "updating Deployment " + name);
      continue;
    }
    const json& wanted = field(field(desired, "spec"), "replicas");
    if (field(field(observed->second, "spec"), "replicas") != wanted) {
      check(client_.patch(kube::object_path(kube::kDeployments, ns, name, "scale"),
                          {{"spec", {{"replicas", wanted}}}}),
            "scaling Deployment " + name);
    }
  }
  for (const json& desired : plan.services) {
    if (!services.contains(name_of(desired))) {
      check(client_.create(kube::collection_path(kube::kServices, ns), desired),
            "creating Service " + name_of(desired));
    }
  }
  for (const std::string& name : plan.scale_to_zero) {
    check(client_.patch(kube::object_path(kube::kDeployments, ns, name, "scale"),
                        {{"spec", {{"replicas", 0}}}}),
          "scaling Deployment " + name + " to zero");
  }
  for (const std::string& name : plan.remove) {
    check(client_.remove(kube::object_path(kube::kDeployments, ns, name)),
          "deleting Deployment " + name);
    if (services.contains(name)) {
      check(client_.remove(kube::object_path(kube::kServices, ns, name)),
            "deleting Service " + name);
    }
  }
  if (field(serving_endpoint, "status") != plan.status) {
    Result<kube::Reply> written =
        client_.patch(kube::object_path(kube::kServingEndpoints, ns, endpoint, "status"),
                      {{"status", plan.status}});
    if (written.is_ok() && written->status == 404) {
      // Deleted since the mirror was read: the watch brings the deletion next.
      spdlog::debug("ServingEndpoint {} was deleted before its status was written", endpoint);
    } else {
      check(std::move(written), "writing the status of ServingEndpoint " + endpoint);
    }
  }
}

}  // namespace flotilla::cluster
