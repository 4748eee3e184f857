// `flotilla controller`'s loop: leader election, three mirrors, and each endpoint's plan applied
// through the API server.
#include <spdlog/spdlog.h>

#include "cluster/cluster.h"

namespace flotilla::cluster {
namespace {

using kube::field;
using nlohmann::json;

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
      elector_(client, options_.election, real_clock()) {}

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

void Controller::lead() {
  spdlog::info("leading: reconciling the ServingEndpoints of {}", client_.config().namespace_name);
  const std::string& ns = client_.config().namespace_name;
  std::vector<std::unique_ptr<Random>> randoms;
  std::vector<std::unique_ptr<kube::Reflector>> reflectors;
  auto mirror = [&](const kube::Resource& resource, std::string selector,
                    kube::Reflector::Objects Controller::*into) {
    kube::Reflector::Options watch = options_.watch;
    watch.label_selector = std::move(selector);
    randoms.push_back(std::make_unique<SeededRandom>(reflectors.size() + 1));
    auto listed = std::make_shared<bool>(false);
    reflectors.push_back(std::make_unique<kube::Reflector>(
        client_, resource, ns, watch,
        [this, into, listed](const kube::Reflector::Objects& objects) {
          MutexLock lock(mu_);
          this->*into = objects;
          if (!*listed) {
            *listed = true;
            ++synced_;
          }
          dirty_ = true;
          wake_.notify_all();
        },
        *randoms.back()));
  };
  {
    MutexLock lock(mu_);
    synced_ = 0;
  }
  mirror(kube::kServingEndpoints, "", &Controller::serving_endpoints_);
  mirror(kube::kDeployments, std::string(kEndpointLabel), &Controller::deployments_);
  mirror(kube::kServices, std::string(kEndpointLabel), &Controller::services_);
  std::vector<std::thread> threads;
  for (auto& reflector : reflectors) {
    threads.emplace_back([&reflector] { reflector->run(); });
  }

  auto next_resync = std::chrono::steady_clock::now() + options_.resync;
  while (true) {
    bool due = false;
    {
      MutexLock lock(mu_);
      while (!stopping_ && leading_ && !(dirty_ && synced_ == 3) &&
             wake_.wait_until(mu_, next_resync)) {
      }
      if (stopping_ || !leading_) {
        break;
      }
      due = synced_ == 3;
      dirty_ = false;
    }
    if (std::chrono::steady_clock::now() >= next_resync) {
      next_resync = std::chrono::steady_clock::now() + options_.resync;
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
      if (field(field(field(deployment, "metadata"), "labels"), kEndpointLabel) == name) {
        owned.emplace(deployment_name, deployment);
      }
    }
    const EndpointPlan plan = plan_endpoint(endpoint, owned, {}, options_.replica, real_clock());
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
    check(client_.patch(kube::object_path(kube::kServingEndpoints, ns, endpoint, "status"),
                        {{"status", plan.status}}),
          "writing the status of ServingEndpoint " + endpoint);
  }
}

}  // namespace flotilla::cluster
