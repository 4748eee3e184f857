// The reconciler's decision (DESIGN.md §2, issue #4): from the endpoints' specs and the
// replicas the orchestrator reports, what each deployment should run and what the gateway's
// endpoint table is. Pure and level-triggered: the same input gives the same plan, so running
// it again after a crash or on every tick is always safe. Private to the control module.
//
// A rollout: an endpoint whose target spec differs from the serving one keeps the serving
// versions running and in the table while the target's versions start; once every target
// version has its provisioned replicas ready, the target becomes the serving spec (the plan
// says so in `promoted`), the table switches to its versions and weights at once, and the
// deployments of versions no longer named are retired (drained, then stopped). A change that
// keeps every deployment key (traffic, concurrency) restarts no replica: it is promoted in the
// same pass when the running replicas suffice, else once the added ones are ready; until then
// a key keeps the larger of its serving and target counts.
#pragma once

#include <functional>
#include <optional>
#include <string>
#include <vector>

#include "control/control_scaling.h"
#include "control/control_spec.h"
#include "gateway/gateway.h"
#include "orchestrator/orchestrator.h"

namespace flotilla::control {

struct EndpointState {
  EndpointSpec target;                  // what the user asked for
  std::optional<EndpointSpec> serving;  // what takes traffic; nullopt before the first promotion
  // The autoscaler's decision; nullopt: provisioned_replicas() and the initial target.
  std::optional<Scale> scale;
};

struct ReconcilePlan {
  // Every deployment with the replica count it should have; 0 retires it.
  std::vector<std::pair<orchestrator::Deployment, int>> ensure;
  gateway::EndpointTable table;
  std::vector<std::string> promoted;  // endpoints whose target became their serving spec
};

// The concrete runtime for a served model ("auto" resolved from the artifact).
using RuntimeResolver = std::function<std::string(const ServedModelSpec&)>;

orchestrator::Deployment make_deployment(const std::string& endpoint, const ServedModelSpec& served,
                                         const RuntimeResolver& resolve_runtime);

// The context length of the model of a served model whose runtime is "llm" (what the gateway
// shows as `max_model_len`); 0 when unknown.
using ContextLengthResolver = std::function<int64_t(const ServedModelSpec&)>;

// `endpoints` in any order, `replicas` as orchestrator::list() returns them. The table's
// versions carry their runtime and, for "llm" ones, `context_length` (when given).
ReconcilePlan reconcile(const std::vector<EndpointState>& endpoints,
                        const std::vector<orchestrator::Replica>& replicas,
                        const RuntimeResolver& resolve_runtime,
                        const ContextLengthResolver& context_length = {});

}  // namespace flotilla::control
